#!/usr/bin/env bash
# Session 25: KV_SPLIT (a causal GQA backward's groups split between two blocks per 128 keys, dK/dV
# added in fp32) against KV_SPLIT 1, the same build: the device copy's heuristic reads
# KILN_S25_SPLIT (1 or 2) and KILN_S25_ATOMIC (head dim 128's atomic dQ). attention_bwd GPU specs
# with the defaults, then rows alternating.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
python3 - <<'PY' || exit 1
p='templates/attention_bwd/attention_bwd.cpp'
s=open(p).read()
a='bool wants_atomic_dq(const KernelSpec& spec) { return may_atomic_dq(spec) && spec.param("head_dim") == 64; }'
assert a in s
s=s.replace(a,'bool wants_atomic_dq(const KernelSpec& spec) { return may_atomic_dq(spec) && (spec.param("head_dim") == 64 || std::getenv("KILN_S25_ATOMIC")); }')
b='  return wants_atomic_dq(spec) && may_kv_split(spec) && spec.param("causal") != 0 ? 2 : 1;'
assert b in s
s=s.replace(b,'  if (const char* e = std::getenv("KILN_S25_SPLIT")) return wants_atomic_dq(spec) && may_kv_split(spec) && e[0] == \'2\' ? 2 : 1;\n'+b)
open(p,'w').write('#include <cstdlib>\n'+s)
PY
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu bench_attention test_gpu > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
if [ -z "${NOTEST:-}" ]; then
KILN_CACHE_DIR=/tmp/tg7 KILN_GPU_TEST_OPS=attention_bwd timeout 200 build-gpu/tests/test_gpu --gtest_filter="${FILTER:-Compilers/Gpu.EveryOpMatchesItsReference/0:GpuAttention*}" > $OUT/test_gpu.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL " $OUT/test_gpu.log | head -20
echo "tests $(( $(date +%s)-t0 )) s"
fi
run() {  # label, row, env...
  local v=$1 lab=$2; shift 2
  env "$@" KILN_CACHE_DIR=/tmp/gc-$v build-gpu/bench/bench_attention /tmp/g_${v}.csv --only $lab --check-all --budget-ms 300 --seed 7 > /tmp/g_${v}_${lab}.log 2>&1
  printf "%-12s %-34s %s\n" $v $lab "$(grep -o 'bwd .*reps)' /tmp/g_${v}_${lab}.log | head -1)" | tee -a $OUT/rows.txt
  grep -h 'check:' /tmp/g_${v}_${lab}.log | head -1 | cut -c1-220 >> $OUT/rows.txt
}
for lab in ${ROWS64:-hq64_hkv8_d64_s4096_b1_causal hq64_hkv8_d64_s4096_b2_causal hq32_hkv4_d64_s8192_b1_causal}; do
  run split2 $lab KILN_S25_SPLIT=2; run split1 $lab KILN_S25_SPLIT=1
done
for lab in ${ROWS128:-hq64_hkv8_d128_s4096_b1_causal hq32_hkv8_d128_s8192_b1_causal}; do
  run det $lab KILN_S25_SPLIT=1; run atomic-split2 $lab KILN_S25_ATOMIC=1 KILN_S25_SPLIT=2
done
echo "all $(( $(date +%s)-t0 )) s"
