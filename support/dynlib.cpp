#include "support/dynlib.h"

#include <dlfcn.h>
#include <fmt/format.h>

namespace kiln {

Result<std::unique_ptr<DynLib>> DynLib::open(const std::string& what, const std::string& override_path,
                                             const std::vector<std::string>& candidates) {
  std::vector<std::string> order;
  if (!override_path.empty()) order.push_back(override_path);
  std::string tried;
  // Prefer a copy the process already has (e.g. PyTorch loaded libcuda): RTLD_NOLOAD finds it.
  for (const std::string& name : candidates) {
    if (name.find('/') != std::string::npos) continue;
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD))
      return std::unique_ptr<DynLib>(new DynLib(h, name + " (already loaded)"));
  }
  order.insert(order.end(), candidates.begin(), candidates.end());
  for (const std::string& path : order) {
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return std::unique_ptr<DynLib>(new DynLib(h, path));
    const char* why = dlerror();
    tried += fmt::format("\n  {}: {}", path, why ? why : "not found");
  }
  return make_error(Errc::driver_unavailable,
                    fmt::format("cannot load {}; tried:{}", what, tried));
}

DynLib::~DynLib() {
  if (handle_) dlclose(handle_);
}

void* DynLib::symbol(const char* name) const { return dlsym(handle_, name); }

}  // namespace kiln
