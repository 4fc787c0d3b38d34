#include "support/memory.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <fstream>
#include <sstream>

namespace kiln {
namespace {

// A "Name:   123 kB" line of a /proc file, in bytes; nullopt if absent.
std::optional<uint64_t> proc_kib_field(const char* file, const std::string& name) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + ":", 0) != 0) continue;
    std::istringstream fields(line.substr(name.size() + 1));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
    return std::nullopt;
  }
  return std::nullopt;
}

void take_least(std::optional<MemoryLimit>& least, MemoryLimit candidate) {
  if (!least || candidate.bytes < least->bytes) least = std::move(candidate);
}

// A resource limit less what this process uses of it already.
void take_rlimit(std::optional<MemoryLimit>& least, int resource, const char* name, const char* status_field) {
  struct rlimit rl{};
  if (::getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
  const uint64_t limit = static_cast<uint64_t>(rl.rlim_cur);
  const uint64_t used = proc_kib_field("/proc/self/status", status_field).value_or(0);
  take_least(least, {used < limit ? limit - used : 0,
                     fmt::format("{} of {} less the {} this process has already ({})", name, format_bytes(limit),
                                 format_bytes(used), status_field)});
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  const char* units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024;
  size_t u = 0;
  while (v >= 1024 && u + 1 < std::size(units)) v /= 1024, ++u;
  return fmt::format("{:.1f} {}", v, units[u]);
}

std::optional<MemoryLimit> host_available_memory() {
  if (auto avail = proc_kib_field("/proc/meminfo", "MemAvailable"))
    return MemoryLimit{*avail, fmt::format("the host's available memory ({}, MemAvailable of /proc/meminfo)",
                                           format_bytes(*avail))};
  return std::nullopt;
}

std::optional<MemoryLimit> host_memory_limit() {
  std::optional<MemoryLimit> least = host_available_memory();
  take_rlimit(least, RLIMIT_AS, "RLIMIT_AS (ulimit -v)", "VmSize");
  take_rlimit(least, RLIMIT_DATA, "RLIMIT_DATA (ulimit -d)", "VmData");
  return least;
}

}  // namespace kiln
