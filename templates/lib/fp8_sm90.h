// Host side of the library part `fp8_sm90` (templates/lib/fp8_sm90.kernel): the shared memory of
// the TMA kernels' scale ring, for the dynamic_shared_bytes() and stage counts of the ops whose
// sm_90a fp8 kernels use it (gemm_fp8, grouped_gemm nt). The kernels size it the same way and
// static_assert that the launch's shared memory holds it.
#pragma once

#include <cstdint>

namespace kiln {
/// Slices per scale-ring stage: 4, 2 or 1, the largest that divides the K blocks (the device's
/// scale_ring_group).
inline constexpr int64_t scale_ring_group(int64_t k_blocks) { return k_blocks % 4 == 0 ? 4 : k_blocks % 2 == 0 ? 2 : 1; }
/// The ring for `stages` operand stages: ceil(stages / SG) + 1 stages of `entries` entries (a
/// tile's rows of A, then B's block or columns) of SG fp32 each, 16-byte rounded, and two
/// mbarriers a stage.
inline constexpr int64_t scale_ring_bytes(int64_t k_blocks, int64_t entries, int64_t stages) {
  const int64_t sg = scale_ring_group(k_blocks);
  return ((stages + sg - 1) / sg + 1) * ((entries * 4 * sg + 15) / 16 * 16 + 16);
}
}  // namespace kiln
