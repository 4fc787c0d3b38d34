#!/usr/bin/env bash
# Session 25: the atomic-dQ kernels at head dim 128 (forced by KILN_S25_ATOMIC in the device copy)
# against the deterministic ones, the same build: attention_bwd GPU specs with the atomic kernels,
# then rows alternating.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
sed -i 's|return may_atomic_dq(spec) \&\& spec.param("head_dim") == 64; }|return may_atomic_dq(spec) \&\& (spec.param("head_dim") == 64 \|\| std::getenv("KILN_S25_ATOMIC")); }|' templates/attention_bwd/attention_bwd.cpp
grep -q 'KILN_S25_ATOMIC' templates/attention_bwd/attention_bwd.cpp || exit 1
sed -i '1i #include <cstdlib>' templates/attention_bwd/attention_bwd.cpp
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu bench_attention test_gpu > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
KILN_S25_ATOMIC=1 KILN_CACHE_DIR=/tmp/tg6 KILN_GPU_TEST_OPS=attention_bwd timeout 200 build-gpu/tests/test_gpu --gtest_filter="Compilers/Gpu.EveryOpMatchesItsReference/0" > $OUT/test_gpu.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL " $OUT/test_gpu.log | head -20
echo "tests $(( $(date +%s)-t0 )) s"
for lab in ${ROWS:-hq32_hkv8_d128_s8192_b1_causal hq64_hkv8_d128_s4096_b1_causal hq32_hkv32_d128_s4096_b1_causal hq32_hkv32_d128_s4096_b1_full}; do for v in atomic det; do
  if [ $v = atomic ]; then export KILN_S25_ATOMIC=1; else unset KILN_S25_ATOMIC; fi
  KILN_CACHE_DIR=/tmp/gc-$v build-gpu/bench/bench_attention /tmp/g_${v}.csv --only $lab --check-all --budget-ms 300 --seed 7 > /tmp/g_${v}_${lab}.log 2>&1
  printf "%-6s %-34s %s\n" $v $lab "$(grep -o 'bwd .*reps)' /tmp/g_${v}_${lab}.log | head -1)" | tee -a $OUT/rows.txt
  grep -h 'check:' /tmp/g_${v}_${lab}.log | head -1 | cut -c1-220 >> $OUT/rows.txt
done; done
echo "all $(( $(date +%s)-t0 )) s"
