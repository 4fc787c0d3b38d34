#!/usr/bin/env bash
# The attention ops on the GPU machine (sm_90a), in steps that fit the device tool's 10-minute calls
# (the build directory stays on a warm machine between calls). Logs go under $OUT.
#   scripts/gpu_attention.sh build tests run
# build: Kiln without LLVM (NVRTC), kiln, test_gpu and bench_attention (hiredis and xxhash from .gpu-carry/deps). tests: test_gpu (every op's test specs,
# attention's GPU-size ones included, NVRTC; clang kernels only where a prewarmed cache is carried
# as in scripts/gpu_bench_steps.sh). run: `kiln run --check --bench --no-tune` of the portable kernels
# on a few shapes, forward and backward (the fp64 reference covers every row: shapes stay moderate).
# On sm_90a the forward of head dims 64 and 128 is the TMA + WGMMA kernel (attention_sm90.kernel);
# other head dims and the backward are the portable kernels. bench: bench_attention --quick and the
# SDPA peers (cuDNN, flash) in the same job.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
B=build-gpu
H=$PWD/.gpu-carry/deps
export LD_LIBRARY_PATH=$H/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    build)
      nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/env.txt" 2>&1
      date -u +%FT%TZ >> "$OUT/env.txt"
      cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > "$OUT/cmake.log" 2>&1 &&
        ninja -C $B kiln_cli test_gpu bench_attention > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; } ;;
    tests)
      KILN_CACHE_DIR=$(mktemp -d) $B/tests/test_gpu --gtest_filter='Compilers/Gpu.EveryOpMatchesItsReference/0' \
        > "$OUT/test_gpu.log" 2>&1
      grep -E "attention|specs pass|^\[  (PASSED|FAILED)|FAILED  \]|Failure" "$OUT/test_gpu.log" | head -60 ;;
    run)
      export KILN_CACHE_DIR=$(mktemp -d)
      for op in ${OPS:-attention attention_bwd}; do
        for shape in "batch=2 seqlen_q=1024 seqlen_k=1024 heads=16 kv_heads=4 head_dim=128 causal=1" \
                     "batch=1 seqlen_q=2048 seqlen_k=2048 heads=8 kv_heads=8 head_dim=64" \
                     "batch=1 seqlen_q=1000 seqlen_k=1300 heads=8 kv_heads=2 head_dim=128 causal=1 window_left=200" \
                     "batch=2 seqlen_q=777 seqlen_k=777 heads=4 kv_heads=4 head_dim=64 softcap=30" \
                     "batch=1 seqlen_q=512 seqlen_k=512 heads=8 kv_heads=2 head_dim=256 causal=1 window_left=128"; do
          args=()
          for p in $shape; do args+=(-p "$p"); done
          echo "== $op $shape" | tee -a "$OUT/run.log"
          $B/kiln run $op "${args[@]}" --dtype bf16 --check --bench --no-tune 2>&1 | tee -a "$OUT/run.log" | tail -4
        done
      done ;;
    bench)
      $B/bench/bench_attention "$OUT/attention.csv" --quick > "$OUT/bench_attention.log" 2>&1; tail -25 "$OUT/bench_attention.log"
      python3 bench/attention_peers.py "$OUT/attention.csv" "$OUT/attention_peers" > "$OUT/attention_peers.log" 2>&1
      tail -30 "$OUT/attention_peers.log" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== $step: $(( $(date +%s) - t0 )) s"
done
