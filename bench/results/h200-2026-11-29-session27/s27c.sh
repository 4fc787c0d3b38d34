#!/usr/bin/env bash
# Session 27, call 9: ITEM_OVERLAP (the persistent forward computes the next item's first block
# under the current item's last P V) against the old item boundary, one build: the device copy's
# specialize defines KILN_S27_NO_OVERLAP when the environment has it. attention's GPU specs and
# GpuAttention first (the new kernel), then forward rows alternating, every row checked.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
python3 - <<'PY' || exit 1
p='templates/attention/attention.cpp'
s=open(p).read()
b='''  if (wgmma(c))
    return ah::specialize_common(spec) +'''
assert b in s
s=s.replace(b,'''  if (wgmma(c))
    return std::string(std::getenv("KILN_S27_NO_OVERLAP") ? "#define KILN_S27_NO_OVERLAP 1\\n" : "") + ah::specialize_common(spec) +''')
open(p,'w').write('#include <cstdlib>\n'+s)
PY
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu bench_attention test_gpu > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/tg KILN_GPU_TEST_OPS=attention timeout 150 build-gpu/tests/test_gpu --gtest_filter="Compilers/Gpu.EveryOpMatchesItsReference/0:GpuAttention*" > $OUT/test_gpu.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL |Failure" $OUT/test_gpu.log | head -20
echo "tests $(( $(date +%s)-t0 )) s"
run() {  # label, row, env...
  local v=$1 lab=$2; shift 2
  env "$@" KILN_CACHE_DIR=/tmp/gc-$v build-gpu/bench/bench_attention /tmp/g_${v}.csv --quick --only $lab --check-all --budget-ms 300 --seed 7 > /tmp/g_${v}_${lab}.log 2>&1
  printf "%-6s %-40s %s\n" $v $lab "$(grep -o 'fwd .*reps)' /tmp/g_${v}_${lab}.log | head -1 | cut -c1-44)" | tee -a $OUT/rows.txt
  grep -h 'check:\|FAIL' /tmp/g_${v}_${lab}.log | head -2 | cut -c1-160 >> $OUT/rows.txt
}
for r in 1 ${ROUND2:-}; do
for lab in ${ROWS:-hq32_hkv8_d128_s8192_b1_causal hq64_hkv8_d128_s4096_b2_causal hq128_hkv8_d128_s8192_b1_causal varlen_thd}; do
  run new $lab; run old $lab KILN_S27_NO_OVERLAP=1
done
echo "round $r $(( $(date +%s)-t0 )) s"
done
