#include "support/env.h"

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
  e.cuda_lib = get("KILN_CUDA_LIB");
  e.hip_lib = get("KILN_HIP_LIB");
  e.nvrtc_lib = get("KILN_NVRTC_LIB");
  e.nvjitlink_lib = get("KILN_NVJITLINK_LIB");
  return e;
}

const Env& env() {
  static const Env e = read_env();
  return e;
}

}  // namespace kiln
