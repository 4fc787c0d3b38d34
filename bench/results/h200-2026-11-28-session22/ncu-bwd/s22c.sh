#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"; which ncu || ls /usr/local/cuda*/bin/ncu
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu | head -1)
for row in hq32_hkv8_d128_s8192_b1_causal hq32_hkv8_d128_s8192_b1_full; do
  # per-kernel durations (no replay of sections: just the time)
  KILN_CACHE_DIR=/tmp/nc timeout 200 $NCU --clock-control none -k regex:kiln_attention_bwd --metrics gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed -c 6 build-gpu/bench/bench_attention /tmp/x.csv --only $row --budget-ms 1 --min-reps 1 --max-reps 1 --seed 7 > $OUT/ncu_time_$row.txt 2>&1
  grep -E "kiln_attention_bwd|gpu__time|gmma|sm__throughput|dram__" $OUT/ncu_time_$row.txt | head -40
done
echo "times $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/nc timeout 300 $NCU --clock-control none -k regex:"kiln_attention_bwd_d(q|kdv)" --set full -c 2 build-gpu/bench/bench_attention /tmp/x.csv --only hq32_hkv8_d128_s8192_b1_causal --budget-ms 1 --min-reps 1 --max-reps 1 --seed 7 > $OUT/ncu_full_causal.txt 2>&1
grep -E "^  kiln|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall" $OUT/ncu_full_causal.txt | head -60
echo "all $(( $(date +%s)-t0 )) s"
