// Kernel manifests: the list of exact kernels a training job needs, in JSON, for `kiln prewarm`
// (compile them all ahead of time, for every target) and for applications that want to do the
// same through Runtime::compile. Two forms are read.
//
// The document form (what `kiln manifest` writes):
//
//   {"model": "llama3.1-8b",
//    "kernels": [
//      {"op": "gemm", "dtype": "bf16", "out_dtype": "bf16", "label": "qkv.fwd",
//       "params": {"M": 8192, "N": 6144, "K": 4096, "trans_a": false, "trans_b": true}},
//      {"op": "rmsnorm", "dtype": "bf16", "params": {"rows": 8192, "hidden": 4096}}]}
//
// Kernel fields: op and params (required), dtype (required), out_dtype (optional, defaults to
// dtype), label (optional, a human name). Params take JSON integers and booleans (true/false are
// 1/0); an enumerated parameter (quantize_fp8's granularity) also takes the name of its value
// ("block1x128" is 2), and is written so. Top-level fields: kernels (required), model (optional). Fields whose name starts with '_'
// are comments and are ignored, at the top level and in kernels.
//
// The JSON-lines form (what a Runtime appends with KILN_RECORD=FILE): one kernel object per line,
// with the same fields as in "kernels", e.g.
//
//   {"op":"gemm","dtype":"bf16","out_dtype":"bf16","params":{"K":4096,"M":8192,"N":6144,"trans_a":0,"trans_b":1}}
//   {"op":"rmsnorm","dtype":"bf16","out_dtype":"bf16","params":{"hidden":4096,"rows":8192}}
//
// Which form: the text is JSON lines when its first non-blank line, parsed on its own, is a JSON
// object with an "op" field and no "kernels" field; otherwise it is a document. (A document's first
// line is never such an object: a document is one object with "kernels".) In JSON lines, blank
// lines are skipped, errors name the line ("'rec.jsonl': line 3: unknown dtype 'bf17'; ..."),
// identical kernels (same op, dtypes and params; labels aside) are kept once, the first time, and
// a last line that is not valid JSON (a process killed while appending it) is skipped with a
// warning in Manifest::warnings instead of failing the whole file. Invalid JSON on any other line
// is an error.
//
// fp8 dtypes name a format, not an encoding: a manifest is target-neutral, and a kernel whose
// dtype or out_dtype is fp8_e4m3 (or fp8_e4m3fnuz) is compiled for each target in that target's
// encoding of e4m3: fp8_e4m3fnuz for gfx942, fp8_e4m3 for gfx950 and sm_90a (likewise e5m2).
// manifest_spec_for_target gives the spec a target compiles; validate_manifest and
// `kiln prewarm` use it. `kiln manifest` writes the OCP names. See docs/manifest.md.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/result.h"
#include "kiln/spec.h"
#include "kiln/target.h"

namespace kiln {

struct ManifestEntry {
  KernelSpec spec;
  std::string label;  ///< Human name ("qkv.fwd"); may be empty.
  size_t line = 0;    ///< JSON lines: the (1-based) line it was read from; 0 in the document form.
};

struct Manifest {
  std::string model;                   ///< May be empty.
  std::string about;                   ///< Free text ("_about"), written first; may be empty.
  std::vector<ManifestEntry> kernels;
  /// Problems that did not stop the parse (a torn last line of a recording), as one-line messages
  /// naming the input and the line. The library never prints them; `kiln` shows them as warnings.
  std::vector<std::string> warnings;
  size_t duplicates = 0;               ///< JSON lines: repeated kernels dropped (the first is kept).
};

/// Parses a manifest, in either form (see above). Checks the JSON, its structure, the field names
/// and types, the op and dtype names and the parameter names of each op; not the values against a
/// target (validate_manifest). `source_name` names the input in errors: "'m.json': kernel 3:
/// unknown dtype 'bf17'; use one of: bf16, fp16, fp32" (JSON lines: "'rec.jsonl': line 4: ...").
/// Errors: Errc::corrupt (not JSON, wrong structure or type), Errc::not_found (op, dtype),
/// Errc::invalid_argument (parameter names).
Result<Manifest> parse_manifest(std::string_view text, std::string_view source_name);

/// Reads and parses a manifest file. Errors: Errc::io_error (unreadable), as parse_manifest.
Result<Manifest> read_manifest(const std::string& path);

/// The spec that manifest kernel `spec` compiles to for `target`: its fp8 dtypes (dtype,
/// out_dtype, and a fused fp8 output's fp8_out parameter) in the target's encoding (fp8_for_target,
/// dtype.h); everything else unchanged.
/// The identity for a spec without fp8 dtypes.
KernelSpec manifest_spec_for_target(const KernelSpec& spec, const TargetInfo& target);

/// Checks every kernel, as manifest_spec_for_target gives it for each target, against its op
/// for that target (OpTemplate::validate): parameter ranges,
/// booleans, dtype support and the op's own rules. The first failure is reported with the kernel's
/// index (JSON lines: its line) and label, and with the targets it fails on when it does not fail
/// on all of them.
Result<void> validate_manifest(const Manifest& manifest, std::span<const TargetInfo* const> targets,
                               std::string_view source_name);

/// The manifest as JSON text, one kernel per line, parameters in the op's order, boolean
/// parameters as true/false, enumerated ones by name. parse_manifest(write_manifest(m)) gives m back.
std::string write_manifest(const Manifest& manifest);

}  // namespace kiln
