// Kernel manifests: the list of exact kernels a training job needs, in JSON, for `kiln prewarm`
// (compile them all ahead of time, for every target) and for applications that want to do the
// same through Runtime::compile.
//
//   {"model": "llama3.1-8b",
//    "kernels": [
//      {"op": "gemm", "dtype": "bf16", "out_dtype": "bf16", "label": "qkv.fwd",
//       "params": {"M": 8192, "N": 6144, "K": 4096, "trans_a": false, "trans_b": true}},
//      {"op": "rmsnorm", "dtype": "bf16", "params": {"rows": 8192, "hidden": 4096}}]}
//
// Kernel fields: op and params (required), dtype (required), out_dtype (optional, defaults to
// dtype), label (optional, a human name). Params take JSON integers and booleans (true/false are
// 1/0). Top-level fields: kernels (required), model (optional). Fields whose name starts with '_'
// are comments and are ignored, at the top level and in kernels.
#pragma once

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
};

struct Manifest {
  std::string model;                   ///< May be empty.
  std::string about;                   ///< Free text ("_about"), written first; may be empty.
  std::vector<ManifestEntry> kernels;
};

/// Parses a manifest. Checks the JSON, its structure, the field names and types, the op and dtype
/// names and the parameter names of each op; not the values against a target (validate_manifest).
/// `source_name` names the input in errors: "'m.json': kernel 3: unknown dtype 'bf17'; use one
/// of: bf16, fp16, fp32". Errors: Errc::corrupt (not JSON, wrong structure or type),
/// Errc::unknown (op, dtype), Errc::invalid_argument (parameter names).
Result<Manifest> parse_manifest(std::string_view text, std::string_view source_name);

/// Reads and parses a manifest file. Errors: Errc::io_error (unreadable), as parse_manifest.
Result<Manifest> read_manifest(const std::string& path);

/// Checks every kernel against its op for each target (OpTemplate::validate): parameter ranges,
/// booleans, dtype support and the op's own rules. The first failure is reported with the kernel's
/// index and label, and with the targets it fails on when it does not fail on all of them.
Result<void> validate_manifest(const Manifest& manifest, std::span<const TargetInfo* const> targets,
                               std::string_view source_name);

/// The manifest as JSON text, one kernel per line, parameters in the op's order, boolean
/// parameters as true/false. parse_manifest(write_manifest(m)) gives m back.
std::string write_manifest(const Manifest& manifest);

}  // namespace kiln
