#!/usr/bin/env bash
# Session 23, call 1: sampled attention checks through kiln run at model size (the reference's
# time), and ncu of the head-dim-64 forward (pipes and stalls).
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu kiln_cli bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader; nproc
P="-p heads=32 -p kv_heads=8 -p head_dim=128 -p batch=1 -p seqlen_q=8192 -p seqlen_k=8192 -p causal=1"
for op in attention attention_bwd; do
  /usr/bin/time -f "$op wall %e s, max RSS %M KB" env KILN_CACHE_DIR=/tmp/kr build-gpu/kiln run $op $P --dtype bf16 --seed 5 > $OUT/run_${op}_sampled.log 2>&1
  tail -12 $OUT/run_${op}_sampled.log
done
echo "runs $(( $(date +%s)-t0 )) s"
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu | head -1)
KILN_CACHE_DIR=/tmp/nc timeout 240 $NCU --clock-control none -k regex:kiln_attention_fwd --set full -c 1 build-gpu/bench/bench_attention /tmp/x.csv --only hq64_hkv8_d64_s4096_b1_causal --budget-ms 1 --min-reps 1 --max-reps 1 --seed 7 > $OUT/ncu_fwd_d64.txt 2>&1
grep -E "^  kiln|Duration|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Issued Ipc|Warp Cycles Per Issued|highest-utilized|pipeline|Stall|stall" $OUT/ncu_fwd_d64.txt | head -50
echo "all $(( $(date +%s)-t0 )) s"
