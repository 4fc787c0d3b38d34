#include "templates/lib/elementwise_row.h"

#include <algorithm>

namespace kiln {

KernelConfig elementwise_row_config(int64_t columns, int64_t vec, const TargetInfo& target, RowBlock block) {
  // By default up to 256 threads of 2 accesses each per block: enough blocks for every SM/CU even
  // at few rows, and two independent 16-byte loads in flight per thread and tensor.
  const int64_t nvec = ceil_div(columns, vec);
  const int64_t max_threads = std::min<int64_t>(block.max_threads, target.max_threads_per_block);
  const int64_t threads =
      std::clamp<int64_t>(round_up(ceil_div(nvec, block.items), target.wave_size), target.wave_size, max_threads);
  const int64_t items = std::clamp<int64_t>(ceil_div(nvec, threads), 1, block.items);
  KernelConfig c = {{"THREADS", threads}, {"VEC", vec}, {"ITEMS", items}};
  if (block.chunk_major) c["CHUNK_MAJOR"] = 1;
  return c;
}

std::vector<KernelConfig> elementwise_row_variants(int64_t columns, DType t, const TargetInfo& target, RowBlock block) {
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(t));
  std::vector<KernelConfig> out;
  if (columns % vec == 0) out.push_back(elementwise_row_config(columns, vec, target, block));
  out.push_back(elementwise_row_config(columns, 1, target, block));
  return out;
}

RowBlock swiglu_row_block(const TargetInfo& target, RowBlock nvidia) {
  RowBlock b = target.vendor == Vendor::nvidia ? nvidia : RowBlock{};
  b.chunk_major = true;
  return b;
}

bool chunk_major(const KernelConfig& c) { return c.count("CHUNK_MAJOR") && c.at("CHUNK_MAJOR"); }

std::vector<KernelConfig> thread_item_candidates(KernelConfig first, int64_t accesses, std::initializer_list<int64_t> items,
                                                 const TargetInfo& target) {
  std::vector<KernelConfig> out = {std::move(first)};
  for (int64_t threads : {64, 128, 256, 512, 1024})
    for (int64_t n : items) {
      KernelConfig c = out.front();
      c["THREADS"] = threads;
      c["ITEMS"] = n;
      if (threads % target.wave_size == 0 && threads <= target.max_threads_per_block && threads * n <= accesses &&
          std::find(out.begin(), out.end(), c) == out.end())
        out.push_back(std::move(c));
    }
  return out;
}

std::vector<KernelConfig> elementwise_row_candidates(int64_t columns, KernelConfig first, const TargetInfo& target) {
  const int64_t nvec = ceil_div(columns, first.at("VEC"));
  return thread_item_candidates(std::move(first), nvec, {1, 2}, target);
}

std::string elementwise_row_defines(const KernelConfig& c) {
  return chunk_major(c) ? "#define CHUNK_MAJOR 1\n" : "#define CHUNK_MAJOR 0\n";
}

LaunchGeometry elementwise_row_geometry(int64_t rows, int64_t columns, const KernelConfig& c) {
  LaunchGeometry g;
  const auto chunks = static_cast<uint32_t>(ceil_div(ceil_div(columns, c.at("VEC")), c.at("THREADS") * c.at("ITEMS")));
  if (chunk_major(c)) {
    // kMaxGridYZ rows per grid y (the device preludes' kiln::kMaxGridYZ), then z.
    g.grid = {chunks, static_cast<uint32_t>(std::min(rows, kMaxGridYZ)), static_cast<uint32_t>(ceil_div(rows, kMaxGridYZ))};
  } else {
    g.grid.x = static_cast<uint32_t>(rows);
    g.grid.y = chunks;
  }
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  return g;
}

std::vector<TestSpec> elementwise_row_test_specs(std::string_view op, const TargetInfo& target) {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t rows, int64_t I, std::string_view why) {
    out.push_back({{std::string(op), t, t, {{"rows", rows}, {"intermediate", I}}}, why});
  };
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    add(t, 3, 1, "I 1");
    add(t, 4, 7, "I 7 (scalar variant)");
    add(t, 2, 100, "I 100");
    add(t, 3, 1024, "I 1024, vector accesses");
  }
  add(DType::bf16, 0, 64, "0 rows: a no-op");
  add(DType::bf16, 2, 18944, "I 18944 (Qwen2.5-7B)");
  if (target.vendor == Vendor::nvidia) add(DType::bf16, 70000, 64, "70000 rows: more than the grid's y extent");
  return out;
}

}  // namespace kiln
