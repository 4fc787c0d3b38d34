#!/usr/bin/env bash
# Session 23, call 7: the dK/dV kernel's loop at head dim 64 with three copies of its step
# (alternate_next): GPU specs of attention_bwd, then A/B against the five-copy loop (old-attn.patch).
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s); rm -rf /tmp/ab-old
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu test_gpu bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/tg KILN_GPU_TEST_OPS=attention_bwd timeout 300 build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.EveryOpMatchesItsReference/0:GpuAttention*' > $OUT/test_gpu.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL " $OUT/test_gpu.log | head -20
echo "tests $(( $(date +%s)-t0 )) s"
ROWS="d64_s4096_b1_causal d64_s8192_b1_causal" ROUNDS=2 bash .gpu-carry/ab_attn.sh; mv $OUT/ab.tar $OUT/ab_quick.tar
ROWS="hq16_hkv16_d64_s2048_b1 hq16_hkv16_d64_s1024_b1" EXTRA="--shape 16/16/64/2048 --shape 16/16/64/1024" ROUNDS=2 bash .gpu-carry/ab_attn.sh; mv $OUT/ab.tar $OUT/ab_mha.tar
echo "all $(( $(date +%s)-t0 )) s"
