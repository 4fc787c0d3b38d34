#!/usr/bin/env bash
# Session 26, call 4: head dim 128's default (atomic dQ + KV_SPLIT) against the deterministic kernels
# and the atomic dQ without the split, one build: the device copy's heuristic reads KILN_S26_DET
# (deterministic kernels) and KILN_S26_NOSPLIT (KV_SPLIT 1); rows alternate.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
python3 - <<'PY' || exit 1
p='templates/attention_bwd/attention_bwd.cpp'
s=open(p).read()
a='bool wants_atomic_dq(const KernelSpec& spec) { return spec.param("deterministic") == 0; }'
assert a in s
s=s.replace(a,'bool wants_atomic_dq(const KernelSpec& spec) { return spec.param("deterministic") == 0 && !std::getenv("KILN_S26_DET"); }')
b='  return wants_atomic_dq(spec) && may_kv_split(spec) && spec.param("causal") != 0 ? 2 : 1;'
assert b in s
s=s.replace(b,'  if (std::getenv("KILN_S26_NOSPLIT")) return 1;\n'+b)
open(p,'w').write('#include <cstdlib>\n'+s)
PY
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu bench_attention test_gpu > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
run() {  # label, row, env...
  local v=$1 lab=$2; shift 2
  env "$@" KILN_CACHE_DIR=/tmp/gc-$v build-gpu/bench/bench_attention /tmp/g_${v}.csv --only $lab --check-all --budget-ms 300 --seed 7 > /tmp/g_${v}_${lab}.log 2>&1
  printf "%-8s %-44s %s\n" $v $lab "$(grep -o 'bwd .*reps)' /tmp/g_${v}_${lab}.log | head -1)" | tee -a $OUT/rows.txt
  grep -h 'check:' /tmp/g_${v}_${lab}.log | head -1 | cut -c1-160 >> $OUT/rows.txt
}
for lab in ${ROWS:-varlen_thd16384_hq32_hkv8_d128_causal varlen_dense_hq32_hkv8_d128_s7294_b1_causal hq32_hkv8_d128_s8192_b2_causal hq128_hkv8_d128_s8192_b1_causal hq64_hkv8_d128_s4096_b2_causal varlen_thd16384_hq32_hkv8_d128_full}; do
  run atomic $lab; run det $lab KILN_S26_DET=1; run nosplit $lab KILN_S26_NOSPLIT=1
done
echo "rows $(( $(date +%s)-t0 )) s"
if [ -z "${NOTUNE:-}" ]; then
KILN_CACHE_DIR=/tmp/tt KILN_GPU_TEST_OPS=attention_bwd timeout 260 build-gpu/tests/test_gpu --gtest_filter="GpuTuning.EveryCandidate*" > $OUT/test_gpu_tuning.log 2>&1; grep -E "FAILED|PASSED|FAIL |OK \]" $OUT/test_gpu_tuning.log | head
fi
echo "all $(( $(date +%s)-t0 )) s"
