#include "support/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "support/env.h"

namespace kiln {
namespace {
std::shared_ptr<spdlog::logger> make_logger() {
  auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto log = std::make_shared<spdlog::logger>("kiln", std::move(sink));
  log->set_pattern("kiln: %l: %v");
  // env() refuses unknown names (Runtime::create and the CLI report them); "warning" is spdlog's
  // "warn" spelled out.
  log->set_level(spdlog::level::from_str(env().log_level == "warning" ? "warn" : env().log_level));
  return log;
}
std::shared_ptr<spdlog::logger>& logger_ptr() {
  static std::shared_ptr<spdlog::logger> log = make_logger();
  return log;
}
}  // namespace

spdlog::logger& logger() { return *logger_ptr(); }

void set_log_sink(std::shared_ptr<spdlog::sinks::sink> sink) {
  auto& log = logger_ptr();
  auto replacement = std::make_shared<spdlog::logger>("kiln", std::move(sink));
  replacement->set_level(log->level());
  log = std::move(replacement);
}
}  // namespace kiln
