// Codegen: KernelSpec + target -> KernelSource, the complete device source of one kernel.
//
// The source is, in order: a first line naming Kiln's codegen version and the target, the target
// prelude (codegen/preludes/<amdgpu|nvptx>.prelude: thread indices, barriers, shuffles,
// conversions, math), the parts of the device-code library that the template includes
// (templates/lib/library.h: each once, dependencies first), a comment naming the spec and its tile
// configuration, the baked constants of both, and the op's device template (its library lines
// replaced by comments). Everything before the spec's comment is the same for every kernel of a
// template and target: it is built and hashed once per process, and a kernel's source hash
// continues from that SHA-256 state. Codegen is deterministic: the same spec and target give the
// same bytes (no time stamps, no paths).
#pragma once

#include <string>
#include <vector>

#include "kiln/result.h"
#include "kiln/spec.h"
#include "kiln/target.h"
#include "templates/plan.h"

namespace kiln {

class OpTemplate;  // templates/op_template.h

/// Version of Kiln's generated-code conventions, printed in the source's first line (and so
/// hashed with it). Bump it when the layout of the generated text changes. 3: the device-code
/// library (templates/lib/) replaces common.prelude. 4: the spec's comment follows the library, so
/// that the text before it is shared by every kernel of a template and target (its hash is reused).
inline constexpr int kCodegenVersion = 4;

struct KernelSource {
  KernelSpec spec;             ///< The baked spec (runtime parameters removed).
  const OpTemplate* op = nullptr;
  const TargetInfo* target = nullptr;
  KernelConfig config;           ///< The heuristic's choice (or the one asked for), baked into the text.
  std::string kernel_name;     ///< The `extern "C"` entry point.
  std::vector<std::string> library_parts;  ///< The library parts in `text`, in order.
  std::string text;            ///< The complete source.
  std::string template_sha256; ///< SHA-256 of prelude + library parts + device template.
  std::string source_sha256;   ///< SHA-256 of `text`: what the cache key hashes.
};

/// Validates the spec for the target and generates its source, with the heuristic's tile
/// configuration, or with `config`, which must be one of the op's variants or tuning_candidates
/// (else Errc::invalid_argument, listing them).
Result<KernelSource> generate(const KernelSpec& spec, const TargetInfo& target, const KernelConfig* config = nullptr);

/// The template hash of KernelSource: SHA-256 of the target prelude, the library parts and the
/// op's device template for `config`.
std::string template_sha256(const OpTemplate& op, const TargetInfo& target, const KernelConfig& config);

/// What a tuning record depends on, from the op: the baked spec (runtime parameters removed), the
/// template hash of the heuristic's configuration (a change of the device template makes old
/// records miss) and the configurations the autotuner times. cache/tuning.h keys and checks records
/// with it, without the op contract.
struct TuningSubject {
  KernelSpec spec;
  std::string template_sha256;
  std::vector<KernelConfig> candidates;
};
/// The tuning subject of `spec` on `target` (the spec is assumed valid: OpInterface::validate).
TuningSubject tuning_subject(const OpTemplate& op, const KernelSpec& spec, const TargetInfo& target);
/// The same from the baked spec's tuning candidates, already computed (the heuristic's first, as
/// OpTemplate::tuning_candidates returns them): the runtime's record lookup computes them once.
TuningSubject tuning_subject(const OpTemplate& op, KernelSpec baked, const TargetInfo& target,
                             std::vector<KernelConfig> candidates);

/// The prelude text of a target (empty for an unknown vendor).
std::string_view prelude_for(const TargetInfo& target);

}  // namespace kiln
