// The cache key: everything a code object depends on, and nothing else.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "codegen/codegen.h"
#include "compile/compiler.h"

namespace kiln {

/// Bump when the layout of a cache entry or of this key changes: old entries then miss instead of
/// being misread.
inline constexpr int kCacheFormatVersion = 2;

/// The key of a code object: the SHA-256 of the full generated source (prelude, helpers, every
/// host-side specialization, the device template), the compiler's identity, version and flags,
/// and the format version. A change to any emitted byte changes the key, so no version needs a
/// manual bump. The typed fields (op, dtypes, parameters, configuration, target) are derived from
/// the same request and are kept beside it in meta.json for display and for `verify --fix`.
/// Never holds an absolute path, a host name or a time: a cache built on one machine is valid on
/// another with the same compiler.
struct CacheKey {
  KernelSpec spec;                        ///< Baked parameters only (support/spec_json.h's form).
  KernelConfig config;                      ///< Baked tile configuration.
  std::string target;                     ///< "gfx942", "sm_90a", ...
  std::string compiler;                   ///< "clang" / "nvrtc".
  std::string compiler_version;
  std::string flags;
  std::string template_sha256;            ///< Prelude + helpers + device template text (display).
  std::string source_sha256;              ///< The full generated source: what the key covers.
  int codegen_version = kCodegenVersion;
  int format_version = kCacheFormatVersion;

  static CacheKey make(const KernelSource& source, const Compiler& compiler);
  /// Canonical JSON (sorted keys).
  nlohmann::json to_json() const;
  /// The canonical JSON as text: to_json().dump(), written without building the object.
  std::string canonical() const;
  /// SHA-256 of the canonical JSON, hex: the entry's name on disk.
  std::string digest() const;
};

}  // namespace kiln
