// The device-code library: parts of device code that several ops share (WGMMA, TMA, mbarriers,
// MFMA, reductions, online softmax, fp8 conversion, vector accesses), one file each,
// templates/lib/<part>.kernel, embedded in libkiln. A device template (or a part) names what it
// uses with a line
//     #include "lib/<part>.kernel"
// and codegen (expand_library) replaces those lines by the parts' text: each part once, the
// parts a part includes before it, all of them after the target prelude and before the baked
// constants. So exactly the library text a kernel uses enters its generated source, and with it
// the cache key. Parts read no baked constant (they are templates where they need parameters);
// an op's own shared pieces stay in its folder. Adding a part: its .kernel file and a row in
// library_parts() (library.cpp); tests/codegen/test_codegen.cpp compiles every part on every
// target it is for.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/result.h"
#include "kiln/target.h"

namespace kiln {

/// One part of the device-code library.
struct LibraryPart {
  std::string_view name;     ///< "wgmma": the file templates/lib/wgmma.kernel.
  bool amd;                  ///< Compiles for the AMD targets (gfx942, gfx950).
  bool nvidia;               ///< Compiles for the NVIDIA targets (sm_90a).
  std::string_view summary;  ///< One line (error messages, documentation).
  bool serves(const TargetInfo& target) const { return target.vendor == Vendor::amd ? amd : nvidia; }
};

/// Every part, in alphabetical order.
std::span<const LibraryPart> library_parts();

/// A part by name; Errc::not_found lists the parts.
Result<const LibraryPart*> find_library_part(std::string_view name);

/// The embedded text of a part (its `#include "lib/..."` lines unexpanded).
std::string_view library_part_text(const LibraryPart& part);

/// A device template with its library lines expanded.
struct ExpandedTemplate {
  std::vector<std::string> parts;  ///< The parts used, in the order their text is emitted.
  std::string library;             ///< Their text, each part under a "// ---- library: NAME ----" line.
  std::string body;                ///< The template with each library line replaced by a comment.
};

/// Resolves the `#include "lib/<part>.kernel"` lines of `device_template` (and of the parts it
/// names, recursively) for `target`. Errors (Errc::invalid_argument, naming `who`, e.g. "gemm's
/// device template", and the line): an unknown part (listing the parts), a part that does not
/// serve the target's vendor, a cycle between parts, and any other `#include` (device sources
/// are self-contained: the prelude, the library and the template).
Result<ExpandedTemplate> expand_library(std::string_view device_template, const TargetInfo& target,
                                        std::string_view who);

}  // namespace kiln
