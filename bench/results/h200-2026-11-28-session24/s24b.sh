#!/usr/bin/env bash
# Session 24, call 3: ncu of the atomic-dQ backward (head dim 64) against main's, one row.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
b() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C "$2" bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }; }
b . build-gpu
if [ ! -x /tmp/ab-old/b/bench/bench_attention ]; then
  rm -rf /tmp/ab-old && mkdir -p /tmp/ab-old && tar --exclude=./build-gpu --exclude=./.gpu-carry --exclude='./build*' -cf - . | (cd /tmp/ab-old && tar xf -)
  (cd /tmp/ab-old && patch -s -p1 < $OLDPWD/.gpu-carry/old-attn.patch) || exit 1
  b /tmp/ab-old /tmp/ab-old/b
fi
echo "build $(( $(date +%s)-t0 )) s"
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu | head -1)
ROW=${ROW:-hq64_hkv8_d64_s4096_b1_causal}
M=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_red.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__cycles_active.avg.pct_of_peak_sustained_elapsed
declare -A bin=([new]=build-gpu/bench/bench_attention [old]=/tmp/ab-old/b/bench/bench_attention)
for v in new old; do
  KILN_CACHE_DIR=/tmp/nc-$v timeout 200 $NCU --clock-control none -k regex:kiln_attention_bwd --metrics $M -c 6 ${bin[$v]} /tmp/x.csv --only $ROW --budget-ms 1 --min-reps 1 --max-reps 1 --seed 7 > $OUT/ncu_time_$v.txt 2>&1
  echo "== $v"; grep -E "kiln_attention_bwd|gpu__time|gmma|lts__|dram__|cycles_active" $OUT/ncu_time_$v.txt | sed -n 1,40p
done
echo "times $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/nc-new timeout 240 $NCU --clock-control none -k regex:"kiln_attention_bwd_dkdv" --set full --import-source no -c 1 build-gpu/bench/bench_attention /tmp/x.csv --only $ROW --budget-ms 1 --min-reps 1 --max-reps 1 --seed 7 > $OUT/ncu_full_new.txt 2>&1
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Stall|stall" $OUT/ncu_full_new.txt | head -40
echo "all $(( $(date +%s)-t0 )) s"
