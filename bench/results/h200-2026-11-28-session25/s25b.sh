#!/usr/bin/env bash
# Session 25: ncu of head dim 128's atomic-dQ backward against the deterministic kernels, one row.
# The device copy's heuristic takes the atomic kernels at head dim 128 when KILN_S25_ATOMIC is set.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
sed -i 's|return may_atomic_dq(spec) \&\& spec.param("head_dim") == 64; }|return may_atomic_dq(spec) \&\& (spec.param("head_dim") == 64 \|\| std::getenv("KILN_S25_ATOMIC")); }|' templates/attention_bwd/attention_bwd.cpp
grep -n 'KILN_S25_ATOMIC' templates/attention_bwd/attention_bwd.cpp || exit 1
sed -i '1i #include <cstdlib>' templates/attention_bwd/attention_bwd.cpp
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu | head -1)
ROW=${ROW:-hq32_hkv8_d128_s8192_b1_causal}
M=gpu__time_duration.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_red.sum,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_local_ld.sum
for v in atomic det; do
  if [ $v = atomic ]; then export KILN_S25_ATOMIC=1; else unset KILN_S25_ATOMIC; fi
  KILN_CACHE_DIR=/tmp/nc-$v timeout 200 $NCU --clock-control none -k regex:kiln_attention_bwd --metrics $M --section WarpStateStats --section SpeedOfLight -c 4 build-gpu/bench/bench_attention /tmp/x.csv --only $ROW --budget-ms 1 --min-reps 1 --max-reps 1 --seed 7 > $OUT/ncu_$v.txt 2>&1
  echo "== $v"; grep -E "^  kiln_attention_bwd|gpu__time|lts__|gmma|local|Stall|Warp Cycles|Issued Warp|Compute \(SM\)|Memory Throughput|ATOMIC" $OUT/ncu_$v.txt | sed -n 1,60p
done
echo "all $(( $(date +%s)-t0 )) s"
