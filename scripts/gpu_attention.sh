#!/usr/bin/env bash
# The attention ops on the GPU machine (sm_90a), in steps that fit the device tool's 10-minute calls
# (the build directory stays on a warm machine between calls). Logs go under $OUT.
#   scripts/gpu_attention.sh build tests run
# build: Kiln without LLVM (NVRTC), kiln and test_gpu. tests: test_gpu (every op's test specs,
# attention's GPU-size ones included, NVRTC; clang kernels only where a prewarmed cache is carried
# as in scripts/gpu_issue8.sh). run: `kiln run --check --bench --no-tune` of the portable kernels
# on a few shapes, forward and backward (the fp64 reference covers every row: shapes stay moderate).
# The timings are the portable (scalar-FMA) kernels' and say nothing about the WGMMA kernels to come.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
B=build-gpu
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    build)
      nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/env.txt" 2>&1
      date -u +%FT%TZ >> "$OUT/env.txt"
      cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF > "$OUT/cmake.log" 2>&1 &&
        ninja -C $B kiln test_gpu > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; } ;;
    tests)
      KILN_CACHE_DIR=$(mktemp -d) $B/tests/test_gpu --gtest_filter='Compilers/Gpu.EveryOpMatchesItsReference/0' \
        > "$OUT/test_gpu.log" 2>&1
      grep -E "attention|^\[  (PASSED|FAILED)|FAILED  \]|Failure" "$OUT/test_gpu.log" | head -60 ;;
    run)
      export KILN_CACHE_DIR=$(mktemp -d)
      for op in attention attention_bwd; do
        for shape in "batch=2 seqlen_q=1024 seqlen_k=1024 heads=16 kv_heads=4 head_dim=128 causal=1" \
                     "batch=1 seqlen_q=2048 seqlen_k=2048 heads=8 kv_heads=8 head_dim=64" \
                     "batch=1 seqlen_q=512 seqlen_k=512 heads=8 kv_heads=2 head_dim=256 causal=1 window_left=128"; do
          args=()
          for p in $shape; do args+=(-p "$p"); done
          echo "== $op $shape" | tee -a "$OUT/run.log"
          $B/kiln run $op "${args[@]}" --dtype bf16 --check --bench --no-tune 2>&1 | tee -a "$OUT/run.log" | tail -4
        done
      done ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== $step: $(( $(date +%s) - t0 )) s"
done
