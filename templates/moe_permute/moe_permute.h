// moe_permute: token rows copied into expert order for the grouped GEMM (MoE dispatch, one rank).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 writes offsets = 0), hidden, experts (<= 4096), k (<= 32), scales
/// (default false), baked.
/// Tensors: x [tokens, hidden] (bf16/fp16/fp32, or fp8 e4m3/e5m2 in the target's encoding),
/// x_scales [tokens, hidden / 128] fp32 (with scales: an fp8 x's 1x128 block scales), topk_ids
/// [tokens, k] int32 (moe_router's) -> x_sorted [tokens * k, hidden] (x's dtype), x_sorted_scales
/// [tokens * k, hidden / 128] fp32 (with scales), row_map [tokens, k] int32, offsets [experts + 1]
/// int32. Rows (and scales) are copied as bytes.
///   The slots (t, s) with topk_ids[t, s] in [0, experts) are ordered by expert, and within an
///   expert by (t, s) (stable); the slot at position r of that order is copied to x_sorted[r] =
///   x[t] and row_map[t, s] = r. offsets[e] = the first row of expert e, offsets[experts] = the
///   rows written; expert e's rows are [offsets[e], offsets[e + 1]) (torch._grouped_mm's offs are
///   offsets[1:]). A slot whose id is outside [0, experts) (routed to another rank's experts) is
///   dropped: row_map -1, and the rows past offsets[experts] are not written.
/// Integer arithmetic only: the same rows on every run. Three launches (a stable counting sort,
/// moe_permute.kernel) with a workspace; the copy reads each row once and writes it k times with
/// 16-byte accesses where hidden is a multiple of 16 bytes of elements (docs/moe.md).
class MoePermuteOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "moe_permute"; }
  std::string_view summary() const override {
    return "x_sorted [tokens*k, hidden] = token rows in expert order (stable), row_map and group offsets";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_moe_permute_rows"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
