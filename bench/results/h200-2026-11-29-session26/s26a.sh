#!/usr/bin/env bash
# Session 26, call 1: GPU check of main 433226d (attention_bwd specs, GpuAttention with the new
# bitwise test, the tuning test), then ncu source-level warp-stall sampling of head dim 128's dK/dV
# kernels (atomic dQ forced by KILN_S26_ATOMIC in the device copy's heuristic, and deterministic).
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
python3 - <<'PY' || exit 1
p='templates/attention_bwd/attention_bwd.cpp'
s=open(p).read()
a='bool wants_atomic_dq(const KernelSpec& spec) { return may_atomic_dq(spec) && spec.param("head_dim") == 64; }'
assert a in s
s=s.replace(a,'bool wants_atomic_dq(const KernelSpec& spec) { return may_atomic_dq(spec) && (spec.param("head_dim") == 64 || std::getenv("KILN_S26_ATOMIC")); }')
open(p,'w').write('#include <cstdlib>\n'+s)
PY
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu bench_attention test_gpu > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/tg KILN_GPU_TEST_OPS=attention_bwd timeout 200 build-gpu/tests/test_gpu --gtest_filter="Compilers/Gpu.EveryOpMatchesItsReference/0:GpuAttention*" > $OUT/test_gpu_specs.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL |OK \]" $OUT/test_gpu_specs.log | head -20
echo "tests $(( $(date +%s)-t0 )) s"
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu | head -1)
ROW=${ROW:-hq32_hkv8_d128_s8192_b1_causal}
for v in atomic det; do
  if [ $v = atomic ]; then export KILN_S26_ATOMIC=1; else unset KILN_S26_ATOMIC; fi
  KILN_CACHE_DIR=/tmp/nc-$v timeout 150 $NCU --clock-control none -k regex:'kiln_attention_bwd_dkdv$' -c 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no -o $OUT/ncu_$v build-gpu/bench/bench_attention /tmp/x.csv --only $ROW --budget-ms 1 --min-reps 1 --max-reps 1 --seed 7 > $OUT/ncu_$v.log 2>&1
  $NCU -i $OUT/ncu_$v.ncu-rep --page source --csv --print-source sass > $OUT/src_$v.csv 2> $OUT/src_$v.err
  $NCU -i $OUT/ncu_$v.ncu-rep --page details > $OUT/details_$v.txt 2>&1
  echo "== $v $(wc -l < $OUT/src_$v.csv) lines"; head -c 600 $OUT/src_$v.csv; tail -3 $OUT/src_$v.err
done
echo "ncu $(( $(date +%s)-t0 )) s"
if [ -z "${NOTUNE:-}" ]; then
KILN_CACHE_DIR=/tmp/tt KILN_GPU_TEST_OPS=attention_bwd timeout 240 build-gpu/tests/test_gpu --gtest_filter="GpuTuning*" > $OUT/test_gpu_tuning.log 2>&1; grep -E "FAILED|PASSED|FAIL |OK \]" $OUT/test_gpu_tuning.log | head
fi
echo "all $(( $(date +%s)-t0 )) s"
