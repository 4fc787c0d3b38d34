#include "support/env.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <iterator>
#include <string_view>

#include "support/fs.h"

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
  if (auto level = get("KILN_LOG"); !level.empty()) {
    static const char* kLevels[] = {"trace", "debug", "info", "warn", "warning", "error", "err", "critical", "off"};
    if (std::find(std::begin(kLevels), std::end(kLevels), level) != std::end(kLevels)) e.log_level = level;
    else e.errors.push_back(fmt::format("KILN_LOG='{}' is not a log level; use one of: trace, debug, info, warn, error, off",
                                        printable(level, 40)));
  }
  if (auto c = get("KILN_NVIDIA_COMPILER"); !c.empty()) e.nvidia_compiler = c;
  e.dump_source = truthy(get("KILN_DUMP_SOURCE"));
  if (auto t = get("KILN_LOCK_TIMEOUT"); !t.empty()) {
    if (auto secs = parse_seconds(t)) e.lock_timeout_s = *secs;
    else e.errors.push_back(fmt::format("KILN_LOCK_TIMEOUT='{}' is not a wait; give seconds, a number from 0 to {:.0f} "
                                        "(e.g. 600 or 2.5)",
                                        printable(t, 40), kMaxLockTimeout));
  }
  if (auto size = get("KILN_CACHE_MAX_SIZE"); !size.empty()) {
    auto bytes = parse_size(size);
    if (!bytes || *bytes == 0)
      e.errors.push_back(fmt::format("KILN_CACHE_MAX_SIZE='{}' is not a cache budget; give a positive size like 2G, "
                                     "500M, 64K or a number of bytes (unset it for no budget)",
                                     printable(size, 40)));
    else e.cache_max_bytes = *bytes;
  }
  e.cache_path = get("KILN_CACHE_PATH");
  e.record_file = get("KILN_RECORD");
  e.trusted_keys = get("KILN_TRUSTED_KEYS");
  if (auto t = get("KILN_TUNING"); !t.empty()) e.tuning = truthy(t);
  e.test_kill_at = get("KILN_TEST_KILL_AT");
  e.cuda_lib = get("KILN_CUDA_LIB");
  e.hip_lib = get("KILN_HIP_LIB");
  e.nvrtc_lib = get("KILN_NVRTC_LIB");
  e.nvjitlink_lib = get("KILN_NVJITLINK_LIB");
  e.amd_emulator = get("KILN_AMD_EMULATOR");
  e.emulator_python = get("KILN_EMULATOR_PYTHON");
  if (auto t = get("KILN_EMULATOR_TIMEOUT"); !t.empty()) {
    if (auto secs = parse_seconds(t); secs && *secs > 0) e.emulator_timeout_s = *secs;
    else e.errors.push_back(fmt::format("KILN_EMULATOR_TIMEOUT='{}' is not a wait; give seconds, a number above 0 and "
                                        "at most {:.0f} (e.g. 300)",
                                        printable(t, 40), kMaxLockTimeout));
  }
  if (auto f = get("KILN_EMULATOR_FP8"); !f.empty()) {
    if (f == "ocp" || f == "fnuz") e.emulator_fp8 = f;
    else e.errors.push_back(fmt::format("KILN_EMULATOR_FP8='{}' is not an fp8 encoding; give ocp or fnuz, or leave it "
                                        "unset for the target's own (FNUZ on gfx942, OCP on gfx950)",
                                        printable(f, 40)));
  }
  return e;
}

std::optional<double> parse_seconds(const std::string& text) {
  // Digits with at most one '.', nothing else: no sign, exponent, "nan", "inf" or spaces.
  if (text.empty() || text.size() > 32 || text.find_first_not_of("0123456789.") != std::string::npos ||
      std::count(text.begin(), text.end(), '.') > 1 || text == ".")
    return std::nullopt;
  const double value = std::strtod(text.c_str(), nullptr);
  if (!std::isfinite(value) || value < 0 || value > kMaxLockTimeout) return std::nullopt;
  return value;
}

std::optional<uint64_t> parse_size(const std::string& text) {
  if (text.empty() || text.size() > 32) return std::nullopt;
  // A number (digits, at most one '.'), then at once an optional unit: no sign, exponent, nan,
  // inf or spaces ("2 GiB" is refused, not read as 2 bytes).
  const size_t digits = text.find_first_not_of("0123456789.");
  const std::string number = text.substr(0, digits);
  if (number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value) || value < 0) return std::nullopt;
  end = const_cast<char*>(text.c_str()) + number.size();
  std::string unit(end);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() > 1 && (unit.back() == 'i')) unit.pop_back();  // "GiB"
  double scale = 1;
  if (unit == "K" || unit == "k") scale = 1024.0;
  else if (unit == "M" || unit == "m") scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "g") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "t") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (!unit.empty()) return std::nullopt;
  const double bytes = value * scale;
  if (!(bytes < 9.2e18)) return std::nullopt;  // beyond int64: not a size
  return static_cast<uint64_t>(bytes);
}

void test_kill_point(const char* stage) {
  const std::string& at = env().test_kill_at;
  if (at.empty()) return;
  if (at == stage) ::raise(SIGKILL);
  if (at.rfind("stop:", 0) == 0 && at.compare(5, std::string::npos, stage) == 0) ::raise(SIGSTOP);
}

std::optional<std::string> env_error() {
  if (env().errors.empty()) return std::nullopt;
  std::string msg = env().errors.front();
  for (size_t i = 1; i < env().errors.size(); ++i) msg += "; " + env().errors[i];
  return msg;
}

const Env& env() {
  static const Env e = read_env();
  return e;
}

}  // namespace kiln
