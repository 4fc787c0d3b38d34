#!/usr/bin/env bash
# Session 25: ATOMIC_DQ at head dim 128 (dQ's columns split between the consumers): GPU specs and
# tuning candidates, then rows against /tmp/ab-old (main: the deterministic kernels at head dim 128).
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
b() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C "$2" bench_attention ${T:-} > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }; }
cp_tree() { rm -rf $1 && mkdir -p $1 && tar --exclude=./build-gpu --exclude=./.gpu-carry --exclude='./build*' -cf - . | (cd $1 && tar xf -); }
T=test_gpu b . build-gpu
if [ ! -x /tmp/ab-old/b/bench/bench_attention ]; then
  cp_tree /tmp/ab-old; (cd /tmp/ab-old && patch -s -p1 < $OLDPWD/.gpu-carry/old-attn.patch) || exit 1
  b /tmp/ab-old /tmp/ab-old/b
fi
echo "builds $(( $(date +%s)-t0 )) s"
if [ -z "${NOTEST:-}" ]; then
KILN_CACHE_DIR=/tmp/tg5 KILN_GPU_TEST_OPS=attention_bwd timeout 240 build-gpu/tests/test_gpu --gtest_filter="${FILTER:-Compilers/Gpu.EveryOpMatchesItsReference/0:GpuAttention*}" > $OUT/test_gpu.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL |Failure" $OUT/test_gpu.log | head -20
echo "tests $(( $(date +%s)-t0 )) s"
fi
declare -A bin=([new]=build-gpu/bench/bench_attention [old]=/tmp/ab-old/b/bench/bench_attention)
for lab in ${ROWS:-hq32_hkv8_d128_s8192_b1_causal hq64_hkv8_d128_s4096_b1_causal}; do for v in new old; do
  KILN_CACHE_DIR=/tmp/gc-$v ${bin[$v]} /tmp/g_${v}.csv --only $lab --check-all --budget-ms 300 --seed 7 > /tmp/g_${v}_${lab}.log 2>&1
  printf "%-4s %-34s %s\n" $v $lab "$(grep -o 'bwd .*reps)' /tmp/g_${v}_${lab}.log | head -1)" | tee -a $OUT/rows.txt
  grep -h 'check:' /tmp/g_${v}_${lab}.log | head -1 | cut -c1-220 | tee -a $OUT/rows.txt
done; done
echo "all $(( $(date +%s)-t0 )) s"
