#!/usr/bin/env bash
# Session 24, call 1: the atomic-dQ backward at head dim 64 (ATOMIC_DQ): GPU specs of attention_bwd,
# then an A/B against main's kernels (old-attn.patch) on the head-dim-64 rows; nvidia-smi samples.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,driver_version --format=csv > $OUT/smi_info.csv 2>&1
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu test_gpu bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/tg KILN_GPU_TEST_OPS=attention_bwd timeout 300 build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.EveryOpMatchesItsReference/0:GpuAttention*' > $OUT/test_gpu.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL " $OUT/test_gpu.log | head -30
echo "tests $(( $(date +%s)-t0 )) s"
SMI=0

ROWS="${ROWS:-d64_s4096_b1_causal d64_s4096_b2_causal d64_s8192_b1_causal}" ROUNDS=${ROUNDS:-2} bash .gpu-carry/ab_attn.sh

echo "all $(( $(date +%s)-t0 )) s"
