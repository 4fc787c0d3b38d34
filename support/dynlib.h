// dlopen'd libraries behind one symbol table each, loaded by one template (load_library).
//
// A library is searched in a fixed, overridable order: the KILN_*_LIB override first, then a copy
// already loaded in the process (RTLD_NOLOAD: PyTorch's libcuda, say), then the sonames, then the
// vendor's install directory; when nothing loads, the error lists every path tried.
//
// A symbol table is a struct generated from one list of symbols, each required or optional:
//
//   #define KILN_FOO_SYMBOLS(REQUIRED, OPTIONAL) REQUIRED(fooInit) OPTIONAL(fooNewThing)
//   struct FooApi { KILN_SYMBOL_TABLE(KILN_FOO_SYMBOLS) };
//   Result<const FooApi*> foo_api() {
//     static const Result<const FooApi*> loaded = []() -> Result<const FooApi*> {
//       KILN_ASSIGN_OR_RETURN(auto api, load_library<FooApi>({"libfoo", env().foo_lib, {"libfoo.so.1"}}));
//       return api.release();  // lives for the process, as the library does
//     }();
//     return loaded;
//   }
//
// A missing required symbol fails the load with an error naming the symbol and the library's path;
// a missing optional symbol leaves its pointer null, and the caller checks it where it is used.
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/result.h"

namespace kiln {

class DynLib {
 public:
  /// Opens `override_path` if non-empty and it loads, else a copy of one of `candidates` that the
  /// process has already loaded, else the first of `candidates` that loads. `what` names the
  /// library in errors ("libcuda (the NVIDIA driver)").
  static Result<std::unique_ptr<DynLib>> open(const std::string& what, const std::string& override_path,
                                              const std::vector<std::string>& candidates);
  ~DynLib();
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;

  /// The symbol's address, or nullptr.
  void* symbol(const char* name) const;
  /// The file loaded ("/usr/lib/x86_64-linux-gnu/libcuda.so.1"), with " (already loaded)" when
  /// the process had it loaded before.
  const std::string& path() const { return path_; }
  /// Keeps the library mapped for the life of the process (symbol tables outlive every user).
  void leak() { handle_ = nullptr; }

 private:
  DynLib(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  void* handle_;
  std::string path_;
};

/// Where and how to look for one library.
struct LibrarySpec {
  std::string what;                     ///< "libcuda (the NVIDIA driver)".
  std::string override_path;            ///< KILN_*_LIB; tried first when non-empty.
  std::vector<std::string> candidates;  ///< Sonames, then absolute paths.
  /// Appended to the error of a missing required symbol: what it means and the fix
  /// ("the driver is too old: install R525 or newer").
  std::string missing_hint;
};

/// Loads `spec`'s library and binds every symbol of `Api` (a struct declared with
/// KILN_SYMBOL_TABLE). The library stays mapped for the life of the process; callers keep the
/// table for the life of the process too (a function-local static of its released pointer). Errors: Errc::driver_unavailable when the
/// library does not load (every path tried is listed) or lacks a required symbol (named, with the
/// library's path).
template <typename Api>
Result<std::unique_ptr<Api>> load_library(const LibrarySpec& spec) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<DynLib> lib, DynLib::open(spec.what, spec.override_path, spec.candidates));
  auto api = std::make_unique<Api>();
  const char* missing = nullptr;
  api->for_each_symbol([&](const char* name, auto& slot, bool required) {
    slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(lib->symbol(name));
    if (!slot && required && !missing) missing = name;
  });
  if (missing)
    return make_error(Errc::driver_unavailable,
                      std::string(spec.what) + " at " + lib->path() + " lacks " + missing +
                          (spec.missing_hint.empty() ? "" : ": " + spec.missing_hint));
  api->path = lib->path();
  lib->leak();
  return api;
}

}  // namespace kiln

#define KILN_STRINGIFY_INNER_(x) #x
/// Stringifies after macro expansion, so `cuMemAlloc` (a macro for cuMemAlloc_v2 in cuda.h) is
/// looked up under the name its declaration really has.
#define KILN_STRINGIFY(x) KILN_STRINGIFY_INNER_(x)

/// A function-pointer member typed from the real declaration (no hand-typed signatures).
#define KILN_DECLARE_SYMBOL_(name) decltype(&::name) name = nullptr;
#define KILN_VISIT_REQUIRED_(name) visit(KILN_STRINGIFY(name), name, true);
#define KILN_VISIT_OPTIONAL_(name) visit(KILN_STRINGIFY(name), name, false);

/// The body of a symbol table struct: one member per symbol of LIST (a macro taking REQUIRED and
/// OPTIONAL), `path` (the library's file) and the visitor load_library binds them with.
#define KILN_SYMBOL_TABLE(LIST)                          \
  LIST(KILN_DECLARE_SYMBOL_, KILN_DECLARE_SYMBOL_)       \
  std::string path;                                      \
  template <typename Visit>                              \
  void for_each_symbol(Visit&& visit) {                  \
    LIST(KILN_VISIT_REQUIRED_, KILN_VISIT_OPTIONAL_)     \
  }
