// Host side of the library part `epilogue_sm90` (templates/lib/epilogue_sm90.kernel): the shared
// memory its staging buffers take, for the dynamic_shared_bytes() of the ops whose sm_90a
// kernels store C through it (gemm, grouped_gemm).
#pragma once

#include <cstdint>

namespace kiln {
/// Shared memory a block may opt into on Hopper (sm_90a): 227 KiB.
inline constexpr int64_t kSm90MaxDynamicShared = 227 * 1024;
/// Two staging buffers of 64 rows x one 128-byte line per consumer warpgroup (the kernel's
/// 2 x kEpilogueChunkBytes).
inline constexpr int64_t kEpilogueSm90BytesPerConsumer = 2 * 64 * 128;
/// The staging buffers of a BM-row tile (one consumer warpgroup per 64 rows).
inline constexpr int64_t epilogue_sm90_bytes(int64_t bm) { return (bm / 64) * kEpilogueSm90BytesPerConsumer; }
}  // namespace kiln
