// Host helpers of the elementwise-row kernels (swiglu, swiglu_bwd, dequantize_fp8, rmsnorm's
// variants): ops whose kernels walk rows of `columns` elements with 16-byte vector accesses where
// the row length allows, THREADS threads of ITEMS accesses each per block, grid (rows, chunks of
// a row). Part of the library (templates/lib/): no op folder includes another's.
#pragma once

#include <initializer_list>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "templates/op_template.h"

namespace kiln {

/// A block's shape for elementwise_row_config: up to `max_threads` threads of `items` accesses
/// each. The default (256 x 2) serves most ops; swiglu and swiglu_bwd take their measured best
/// (H100, 2026-11-27, `scripts/gpu_tune_membound.sh`: swiglu 1024 x 1, swiglu_bwd 512 x 2, both
/// chunk-major).
/// `chunk_major`: the launch order of lib/elementwise_row.kernel's CHUNK_MAJOR (the chunks of one
/// row adjacent; config key CHUNK_MAJOR = 1, absent otherwise); only kernels that take their row
/// and chunk from kiln::row_chunk() may set it.
struct RowBlock {
  int64_t max_threads = 256;
  int64_t items = 2;
  bool chunk_major = false;
};
/// swiglu's and swiglu_bwd's block: chunk-major everywhere (on the H100 1.4-4.1% faster than
/// row-major at I 14336-53248; unmeasured on AMD, where it also puts the order's code path under
/// CI's emulator tests); on NVIDIA `nvidia` (the H100's measured shape), on AMD the default shape,
/// which no measurement there has replaced.
RowBlock swiglu_row_block(const TargetInfo& target, RowBlock nvidia);
/// Whether a configuration launches chunk-major (config key CHUNK_MAJOR).
bool chunk_major(const KernelConfig& config);
/// The elementwise-row configuration: VEC elements per access (16 bytes, or 1), THREADS per
/// block (whole wavefronts, at most `block.max_threads`), ITEMS accesses per thread (at most
/// `block.items`); grid (rows, chunks of a row).
KernelConfig elementwise_row_config(int64_t columns, int64_t vec, const TargetInfo& target, RowBlock block = {});
/// Variants for rows of `columns` elements of dtype `t`: vector loads when columns is a
/// multiple of a 16-byte vector, then scalar loads.
std::vector<KernelConfig> elementwise_row_variants(int64_t columns, DType t, const TargetInfo& target,
                                                   RowBlock block = {});
/// Tuning candidates of an elementwise-row op after `first` (the heuristic's choice, kept first):
/// THREADS 64 to 1024 with ITEMS 1 or 2, at `first`'s VEC and launch order, where one block's
/// accesses fit in a row (`kiln run --bench` times them on the GPU). ITEMS 4 and the row-major
/// order lost every swiglu and swiglu_bwd spec of the H100 sweep
/// (bench/results/h100-2026-11-27-membound-rows/), and each candidate costs the tuning-record
/// lookup of a process's first build of the kernel.
std::vector<KernelConfig> elementwise_row_candidates(int64_t columns, KernelConfig first, const TargetInfo& target);
/// `first`, then copies of it with THREADS 64 to 1024 (whole wavefronts, at most the target's
/// block) and each ITEMS of `items`, where THREADS x ITEMS accesses fit in a row of `accesses`;
/// each configuration once. The candidates of the row kernels (elementwise_row_candidates,
/// quantize_fp8's row blocks).
std::vector<KernelConfig> thread_item_candidates(KernelConfig first, int64_t accesses, std::initializer_list<int64_t> items,
                                                 const TargetInfo& target);
/// "#define CHUNK_MAJOR 0|1\n" for a configuration (lib/elementwise_row.kernel).
std::string elementwise_row_defines(const KernelConfig& config);
/// The test specs of an elementwise-row op over [rows, I] (swiglu, swiglu_bwd): I 1, 7, 100, 1024
/// in each dtype, 0 rows, and I 18944; on NVIDIA also 70000 rows (a chunk-major grid's rows span
/// its y and z: too many blocks for the AMD emulator).
std::vector<TestSpec> elementwise_row_test_specs(std::string_view op, const TargetInfo& target);
/// The launch geometry of an elementwise-row config over `rows` rows of `columns` (grid (rows,
/// chunks), or with CHUNK_MAJOR (chunks, rows in y and z)).
LaunchGeometry elementwise_row_geometry(int64_t rows, int64_t columns, const KernelConfig& config);

}  // namespace kiln
