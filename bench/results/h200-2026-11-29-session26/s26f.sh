#!/usr/bin/env bash
# Session 26, call 6: (1) head dim 64 on packed batches: the atomic dQ (deterministic = 0, the
# choice) against the deterministic kernels (deterministic = 1), `kiln run --bench --no-tune`, same
# seed (same cu_seqlens); (2) ncu warp-stall sampling of the committed head-dim-128 atomic dK/dV
# kernel (hq32/8 s8192 without a mask, where it is the choice) for the next attempt.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu kiln_cli bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
for r in 1 2; do for hk in 32,4 64,8; do for det in 0 1; do
  h=${hk%,*}; k=${hk#*,}
  printf "round %s heads %s/%s det %s: " $r $h $k $det | tee -a $OUT/thd64.txt
  KILN_CACHE_DIR=/tmp/kr build-gpu/kiln run attention_bwd -p layout=thd,batch=6,total_q=16384,total_k=16384,max_seqlen_q=7294,max_seqlen_k=7294,heads=$h,kv_heads=$k,head_dim=64,causal=true,deterministic=$det --dtype bf16 --bench --no-tune --seed 7 > /tmp/kr.log 2>&1
  echo; tail -8 /tmp/kr.log | tee -a $OUT/thd64.txt
done; done; done
echo "thd $(( $(date +%s)-t0 )) s"
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu | head -1)
KILN_CACHE_DIR=/tmp/nc timeout 120 $NCU --clock-control none -k regex:'kiln_attention_bwd_dkdv$' -c 1 --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no -o /tmp/ncu_full build-gpu/bench/bench_attention /tmp/x.csv --only hq32_hkv8_d128_s8192_b1_full --budget-ms 1 --min-reps 1 --max-reps 1 --seed 7 > $OUT/ncu_full.log 2>&1
$NCU -i /tmp/ncu_full.ncu-rep --page source --csv --print-source sass > /tmp/src_full.csv 2>/dev/null
$NCU -i /tmp/ncu_full.ncu-rep --page details > $OUT/details_full.txt 2>&1
python3 bench/results/h200-2026-11-29-session26/ncu/stalls.py /tmp/src_full.csv 400 > $OUT/stalls_full.txt 2>&1; sort -k2 -n -r $OUT/stalls_full.txt | head -12
echo "all $(( $(date +%s)-t0 )) s"
