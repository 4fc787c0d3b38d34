#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu test_gpu bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/tg KILN_GPU_TEST_OPS=attention_bwd timeout 150 build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.*/0:GpuAttention*' > $OUT/test_gpu.log 2>&1; grep -E "specs pass|PASSED|FAILED|FAIL " $OUT/test_gpu.log | head -8
echo "tests $(( $(date +%s)-t0 )) s"
ROWS="hq32_hkv8_d128_s8192_b1_causal hq32_hkv8_d128_s8192_b1_full hq32_hkv32_d128_s4096_b2_causal hq32_hkv4_d64_s8192_b1_causal" ROUNDS=2 bash .gpu-carry/ab_attn.sh
echo "all $(( $(date +%s)-t0 )) s"
