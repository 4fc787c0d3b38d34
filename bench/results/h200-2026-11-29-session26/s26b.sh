#!/usr/bin/env bash
# Session 26, call 2: DQ_OWN_GROUP (dQ's WGMMAs as a group of their own, its red.global.add issued
# under dK and S^T(n + 1)) against the old order, one build: the device copy's kernel takes the old
# order when the source defines KILN_S26_OLD (the device copy's specialize adds it when the
# environment has KILN_S26_OLD), and the heuristic takes head dim 128's atomic dQ with KILN_S26_ATOMIC.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
python3 - <<'PY' || exit 1
p='templates/attention_bwd/attention_bwd.cpp'
s=open(p).read()
a='bool wants_atomic_dq(const KernelSpec& spec) { return may_atomic_dq(spec) && spec.param("head_dim") == 64; }'
assert a in s
s=s.replace(a,'bool wants_atomic_dq(const KernelSpec& spec) { return may_atomic_dq(spec) && (spec.param("head_dim") == 64 || std::getenv("KILN_S26_ATOMIC")); }')
b='''    return ah::specialize_common(spec) +
           fmt::format("constexpr int STAGES'''
assert b in s
s=s.replace(b,'''    return std::string(std::getenv("KILN_S26_OLD") ? "#define KILN_S26_OLD 1\\n" : "") + ah::specialize_common(spec) +
           fmt::format("constexpr int STAGES''')
open(p,'w').write('#include <cstdlib>\n'+s)
p='templates/attention_bwd/attention_bwd_sm90.kernel'
s=open(p).read()
c='constexpr bool DQ_OWN_GROUP = true;\n'
assert c in s
s=s.replace(c,'#ifdef KILN_S26_OLD\nconstexpr bool DQ_OWN_GROUP = false;\n#else\nconstexpr bool DQ_OWN_GROUP = true;\n#endif\n')
open(p,'w').write(s)
PY
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu bench_attention test_gpu > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
if [ -z "${NOTEST:-}" ]; then
KILN_S26_ATOMIC=1 KILN_CACHE_DIR=/tmp/tg KILN_GPU_TEST_OPS=attention_bwd timeout 200 build-gpu/tests/test_gpu --gtest_filter="Compilers/Gpu.EveryOpMatchesItsReference/0:GpuAttention*" > $OUT/test_gpu_atomic128.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL |Failure" $OUT/test_gpu_atomic128.log | head -20
echo "tests $(( $(date +%s)-t0 )) s"
fi
run() {  # label, row, env...
  local v=$1 lab=$2; shift 2
  env "$@" KILN_CACHE_DIR=/tmp/gc-$v build-gpu/bench/bench_attention /tmp/g_${v}.csv --only $lab --check-all --budget-ms 300 --seed 7 > /tmp/g_${v}_${lab}.log 2>&1
  printf "%-12s %-34s %s\n" $v $lab "$(grep -o 'bwd .*reps)' /tmp/g_${v}_${lab}.log | head -1)" | tee -a $OUT/rows.txt
  grep -h 'check:' /tmp/g_${v}_${lab}.log | head -1 | cut -c1-160 >> $OUT/rows.txt
}
for r in 1 ${ROUND2:-}; do
for lab in ${ROWS128:-hq32_hkv8_d128_s8192_b1_causal hq64_hkv8_d128_s4096_b1_causal hq32_hkv32_d128_s4096_b1_causal hq32_hkv8_d128_s8192_b1_full}; do
  run own128 $lab KILN_S26_ATOMIC=1; run old128 $lab KILN_S26_ATOMIC=1 KILN_S26_OLD=1; run det $lab
done
for lab in ${ROWS64:-hq64_hkv8_d64_s4096_b1_causal hq32_hkv4_d64_s8192_b1_causal hq64_hkv8_d64_s4096_b1_full}; do
  run own64 $lab; run old64 $lab KILN_S26_OLD=1
done
echo "round $r $(( $(date +%s)-t0 )) s"
done
echo "all $(( $(date +%s)-t0 )) s"
