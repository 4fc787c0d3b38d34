#include "support/env.h"

#include <csignal>
#include <cstdlib>
#include <string_view>

namespace kiln {
namespace {
std::string get(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
bool truthy(const std::string& v) { return !v.empty() && v != "0" && v != "false" && v != "off"; }
}  // namespace

Env read_env() {
  Env e;
  if (auto dir = get("KILN_CACHE_DIR"); !dir.empty()) {
    e.cache_dir = dir;
  } else if (auto xdg = get("XDG_CACHE_HOME"); !xdg.empty()) {
    e.cache_dir = xdg + "/kiln";
  } else if (auto home = get("HOME"); !home.empty()) {
    e.cache_dir = home + "/.cache/kiln";
  } else {
    e.cache_dir = ".kiln-cache";
  }
  e.disk_cache = !truthy(get("KILN_DISABLE_DISK_CACHE"));
  if (auto level = get("KILN_LOG"); !level.empty()) e.log_level = level;
  if (auto c = get("KILN_NVIDIA_COMPILER"); !c.empty()) e.nvidia_compiler = c;
  e.dump_source = truthy(get("KILN_DUMP_SOURCE"));
  if (auto t = get("KILN_LOCK_TIMEOUT"); !t.empty()) e.lock_timeout_s = std::strtod(t.c_str(), nullptr);
  if (auto size = get("KILN_CACHE_MAX_SIZE"); !size.empty()) e.cache_max_bytes = parse_size(size).value_or(0);
  e.cache_path = get("KILN_CACHE_PATH");
  e.record_file = get("KILN_RECORD");
  if (auto t = get("KILN_TUNING"); !t.empty()) e.tuning = truthy(t);
  e.test_kill_at = get("KILN_TEST_KILL_AT");
  e.cuda_lib = get("KILN_CUDA_LIB");
  e.hip_lib = get("KILN_HIP_LIB");
  e.nvrtc_lib = get("KILN_NVRTC_LIB");
  e.nvjitlink_lib = get("KILN_NVJITLINK_LIB");
  e.amd_emulator = get("KILN_AMD_EMULATOR");
  e.emulator_python = get("KILN_EMULATOR_PYTHON");
  if (auto t = get("KILN_EMULATOR_TIMEOUT"); !t.empty()) {
    const double s = std::strtod(t.c_str(), nullptr);
    if (s > 0) e.emulator_timeout_s = s;
  }
  return e;
}

std::optional<uint64_t> parse_size(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || value < 0) return std::nullopt;
  std::string unit(end);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() > 1 && (unit.back() == 'i')) unit.pop_back();  // "GiB"
  double scale = 1;
  if (unit == "K" || unit == "k") scale = 1024.0;
  else if (unit == "M" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "t") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty()) return std::nullopt;
  return static_cast<uint64_t>(value * scale);
}

void test_kill_point(const char* stage) {
  if (!env().test_kill_at.empty() && env().test_kill_at == stage) ::raise(SIGKILL);
}

const Env& env() {
  static const Env e = read_env();
  return e;
}

}  // namespace kiln
