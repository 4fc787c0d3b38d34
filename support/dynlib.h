// dlopen'd libraries behind one symbol table each. A library is searched in a fixed, overridable
// order: the KILN_*_LIB override, a copy already loaded in the process, the sonames, then the
// vendor's install directory; when nothing loads, the error lists every path tried.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/result.h"

namespace kiln {

class DynLib {
 public:
  /// Opens the first of `candidates` that loads (after `override_path`, if non-empty).
  /// `what` names the library in errors ("libcuda (the NVIDIA driver)").
  static Result<std::unique_ptr<DynLib>> open(const std::string& what, const std::string& override_path,
                                              const std::vector<std::string>& candidates);
  ~DynLib();
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;

  /// The symbol's address, or nullptr.
  void* symbol(const char* name) const;
  const std::string& path() const { return path_; }

 private:
  DynLib(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  void* handle_;
  std::string path_;
};

}  // namespace kiln

#define KILN_STRINGIFY_INNER_(x) #x
/// Stringifies after macro expansion, so `cuMemAlloc` (a macro for cuMemAlloc_v2 in cuda.h) is
/// looked up under the name its declaration really has.
#define KILN_STRINGIFY(x) KILN_STRINGIFY_INNER_(x)

/// Declares a function-pointer member typed from the real declaration (no hand-typed signatures).
#define KILN_DECLARE_SYMBOL(name) decltype(&::name) name = nullptr;
/// Loads one member; records the first missing symbol in `missing`.
#define KILN_LOAD_SYMBOL(name)                                                     \
  api->name = reinterpret_cast<decltype(api->name)>(lib->symbol(KILN_STRINGIFY(name))); \
  if (!api->name && missing.empty()) missing = KILN_STRINGIFY(name);
