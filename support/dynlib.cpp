#include "support/dynlib.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <link.h>

#include "support/log.h"

namespace kiln {
namespace {

// The file behind a handle (a NOLOAD hit is found by soname; say which file it is).
std::string loaded_file(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && map->l_name[0]) return map->l_name;
  return fallback;
}

}  // namespace

Result<std::unique_ptr<DynLib>> DynLib::open(const std::string& what, const std::string& override_path,
                                             const std::vector<std::string>& candidates) {
  std::string tried;
  auto note_failure = [&](const std::string& path) {
    const char* error = dlerror();
    std::string why = error ? error : "not found";
    tried += fmt::format("\n  {}: {}", path, why);
    return why;
  };
  // The override wins over everything, a copy already in the process included: it is how a user
  // points Kiln at another driver than the one PyTorch loaded.
  if (!override_path.empty()) {
    if (void* h = dlopen(override_path.c_str(), RTLD_NOW | RTLD_LOCAL))
      return std::unique_ptr<DynLib>(new DynLib(h, override_path));
    KILN_LOG_WARN("cannot load {} from the override {} ({}); trying the default locations", what, override_path,
                  note_failure(override_path));
  }
  // Then a copy the process already has (e.g. PyTorch loaded libcuda): RTLD_NOLOAD finds it by
  // soname without loading a second one.
  for (const std::string& name : candidates) {
    if (name.find('/') != std::string::npos) continue;
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD))
      return std::unique_ptr<DynLib>(new DynLib(h, loaded_file(h, name) + " (already loaded)"));
  }
  for (const std::string& path : candidates) {
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return std::unique_ptr<DynLib>(new DynLib(h, path));
    note_failure(path);
  }
  return make_error(Errc::driver_unavailable, fmt::format("cannot load {}; tried:{}", what, tried));
}

DynLib::~DynLib() {
  if (handle_) dlclose(handle_);
}

void* DynLib::symbol(const char* name) const { return handle_ ? dlsym(handle_, name) : nullptr; }

}  // namespace kiln
