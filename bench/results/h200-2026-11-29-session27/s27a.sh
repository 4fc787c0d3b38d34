#!/usr/bin/env bash
# Session 27, calls 1-2: ROWVALS_AHEAD (the dK/dV loops at head dim 128 read lse and D into registers
# while the products run) against the old reads in the passes, one build: the device copy's kernel
# takes the old reads when the environment has KILN_S27_OLD (specialize then defines it). GPU specs
# of attention_bwd, GpuAttention, GpuTuning first; then rows alternating, every row checked.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > "$OUT/env.txt" 2>&1; date -u +%FT%TZ >> "$OUT/env.txt"
python3 - <<'PY' || exit 1
p='templates/attention_bwd/attention_bwd.cpp'
s=open(p).read()
b='''    return ah::specialize_common(spec) +
           fmt::format("constexpr int STAGES'''
assert b in s
s=s.replace(b,'''    return std::string(std::getenv("KILN_S27_OLD") ? "#define KILN_S27_OLD 1\\n" : "") + ah::specialize_common(spec) +
           fmt::format("constexpr int STAGES''')
open(p,'w').write('#include <cstdlib>\n'+s)
PY
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu bench_attention test_gpu > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
if [ -z "${NOTEST:-}" ]; then
KILN_CACHE_DIR=/tmp/tg KILN_GPU_TEST_OPS=attention_bwd timeout 300 build-gpu/tests/test_gpu --gtest_filter="Compilers/Gpu.EveryOpMatchesItsReference/0:GpuAttention*:GpuTuning.EveryCandidate*" > $OUT/test_gpu.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL |Failure" $OUT/test_gpu.log | head -20
echo "tests $(( $(date +%s)-t0 )) s"
fi
run() {  # label, row, env...
  local v=$1 lab=$2; shift 2
  env "$@" KILN_CACHE_DIR=/tmp/gc-$v build-gpu/bench/bench_attention /tmp/g_${v}.csv --only $lab --check-all --budget-ms 300 --seed 7 > /tmp/g_${v}_${lab}.log 2>&1
  printf "%-6s %-34s %s\n" $v $lab "$(grep -o 'bwd .*reps)' /tmp/g_${v}_${lab}.log | head -1)" | tee -a $OUT/rows.txt
  grep -h 'check:' /tmp/g_${v}_${lab}.log | head -1 | cut -c1-160 >> $OUT/rows.txt
}
for r in 1 ${ROUND2:-}; do
for lab in ${ROWS:-hq32_hkv32_d128_s4096_b1_causal hq32_hkv8_d128_s8192_b1_full hq32_hkv32_d128_s4096_b2_causal hq64_hkv8_d128_s4096_b1_full}; do
  run new $lab; run old $lab KILN_S27_OLD=1
done
echo "round $r $(( $(date +%s)-t0 )) s"
done
echo "all $(( $(date +%s)-t0 )) s"
