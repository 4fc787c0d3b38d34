// Leveled logging through spdlog; the level comes from KILN_LOG (trace, debug, info, warn, error,
// off; default warn) and the sink can be replaced by applications (set_log_sink).
#pragma once

#include <spdlog/spdlog.h>

#include <memory>

namespace kiln {
/// The library's logger ("kiln"), created on first use on stderr.
spdlog::logger& logger();
/// Replaces the sink (e.g. to route Kiln's messages into the application's log).
void set_log_sink(std::shared_ptr<spdlog::sinks::sink> sink);
}  // namespace kiln

#define KILN_LOG_TRACE(...) ::kiln::logger().trace(__VA_ARGS__)
#define KILN_LOG_DEBUG(...) ::kiln::logger().debug(__VA_ARGS__)
#define KILN_LOG_INFO(...) ::kiln::logger().info(__VA_ARGS__)
#define KILN_LOG_WARN(...) ::kiln::logger().warn(__VA_ARGS__)
#define KILN_LOG_ERROR(...) ::kiln::logger().error(__VA_ARGS__)
