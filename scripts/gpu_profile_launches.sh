#!/usr/bin/env bash
# Per-kernel device times and the gaps between the launches of a multi-launch op, on the GPU
# machine: `kiln run OP ... --bench --no-tune` under nsys (or, where nsys is absent, ncu's
# gpu__time_duration per kernel, without the gaps). Logs under $OUT. Usage:
#   scripts/gpu_profile_launches.sh            # the memory-bound rows below 0.9 of a same-size copy
# (issue 19, section 4: embedding_bwd, rmsnorm_bwd, cross_entropy grad_inplace, moe_unpermute_bwd) and the
# multi-launch MoE ops whose small launches may be latency-bound (moe_router's count, moe_permute's scan);
# ONLY=PREFIX keeps the cases whose name starts with PREFIX.
set -uo pipefail
export OUT=${OUT:-$PWD/out}
B=${B:-build-gpu}
export LD_LIBRARY_PATH=$PWD/.gpu-carry/deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache}
cases=(
  "embedding_bwd_dy|embedding_bwd -p tokens=8192 -p vocab=128256 -p hidden=4096 -p ids_dtype=int64 -p dw_dtype=dy"
  "embedding_bwd|embedding_bwd -p tokens=8192 -p vocab=128256 -p hidden=4096 -p ids_dtype=int64"
  "rmsnorm_bwd_4096|rmsnorm_bwd -p rows=8192 -p hidden=4096"
  "rmsnorm_bwd_16384|rmsnorm_bwd -p rows=8192 -p hidden=16384"
  "cross_entropy_grad|cross_entropy -p tokens=8192 -p vocab=128256 -p grad_inplace=1"
  "moe_unpermute_bwd|moe_unpermute_bwd -p tokens=16384 -p hidden=7168 -p k=8"
  "moe_router|moe_router -p tokens=16384 -p experts=256 -p k=8 -p scoring=sigmoid -p n_group=8 -p topk_group=4 -p group_score=top2_sum -p renormalize=true -p bias=true"
  "moe_permute|moe_permute -p tokens=16384 -p hidden=7168 -p k=8 -p experts=256"
)
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "nsys: ${NSYS:-none}; ncu: ${NCU:-none}"
for c in "${cases[@]}"; do
  name=${c%%|*}; args=${c#*|}
  [[ $name == "${ONLY:-}"* ]] || continue
  # shellcheck disable=SC2086 # args is a list of options
  $B/kiln run $args --dtype bf16 --bench --no-tune --iterations 20 > "$OUT/$name.run.log" 2>&1
  grep -E "kernel|PASS|FAIL" "$OUT/$name.run.log" | head -3
  if [ -n "$NSYS" ]; then
    # shellcheck disable=SC2086
    "$NSYS" profile -o "/tmp/$name" --force-overwrite true -t cuda $B/kiln run $args --dtype bf16 --bench --no-tune \
      --iterations 20 > /dev/null 2>&1
    "$NSYS" stats --report cuda_gpu_trace --format csv "/tmp/$name.nsys-rep" > "$OUT/$name.trace.csv" 2>/dev/null
    python3 - "$OUT/$name.trace.csv" <<'PY'
import csv, sys, statistics as st
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if ',' in l) if r.get('Name', '').startswith('kiln_')]
by, gaps, prev = {}, {}, None
for r in rows:
    s, d = int(r['Start (ns)']), int(r['Duration (ns)'])
    by.setdefault(r['Name'], []).append(d / 1e3)
    if prev: gaps.setdefault(r['Name'], []).append((s - prev) / 1e3)
    prev = s + d
for k, v in by.items():
    g = gaps.get(k, [])
    print(f"  {k:40s} {st.median(v):9.2f} us (n {len(v)}), gap before it {st.median(g) if g else 0:7.2f} us")
PY
  elif [ -n "$NCU" ]; then
    # shellcheck disable=SC2086
    "$NCU" --metrics gpu__time_duration.sum --csv $B/kiln run $args --dtype bf16 --bench --no-tune --iterations 3 \
      > "$OUT/$name.ncu.csv" 2>/dev/null
    python3 - "$OUT/$name.ncu.csv" <<'PY'
import csv, sys, statistics as st
by = {}
for r in csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')):
    if r['Metric Name'] == 'gpu__time_duration.sum':
        by.setdefault((r['Kernel Name'], r['Grid Size']), []).append(float(r['Metric Value'].replace(',', '')) / 1e3)
for (k, grid), v in by.items():
    print(f"  {k:40s} grid {grid:16s} {st.median(v):9.2f} us (median of {len(v)})")
PY
  fi
done
