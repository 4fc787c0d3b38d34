#!/usr/bin/env bash
# session-17 probe 1: Inductor's F.rms_norm kernel; ncu of it and of Kiln's rmsnorm at 16384
B=build-gpu; NCU=/usr/local/cuda/bin/ncu
export LD_LIBRARY_PATH=$PWD/.gpu-carry/deps/lib
TORCH_LOGS=output_code python3 probe/rms_inductor.py > $OUT/inductor.log 2>&1
grep PEER $OUT/inductor.log
# the kernels' text, without the log prefix
sed -n 's/^.*\[__output_code\] //p' $OUT/inductor.log | grep -v "^#" | sed -n '/@triton_heuristics/,/^'"''"'/p' > $OUT/inductor_kernels.py
grep -nE "persistent_reduction|reduction\(|num_warps|XBLOCK|R0_BLOCK|def triton|for r0|size_hints" $OUT/inductor_kernels.py | head -40
M=gpu__time_duration.sum,launch__registers_per_thread,launch__block_size,launch__grid_size,launch__occupancy_limit_registers,sm__warps_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__waves_per_multiprocessor
$NCU --metrics $M --csv python3 probe/rms_inductor.py > $OUT/ncu_peer.csv 2>/dev/null
python3 - $OUT/ncu_peer.csv <<'P'
import csv,sys,collections
rows=[r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h=rows[0]; ki=h.index("Kernel Name"); mi=h.index("Metric Name"); vi=h.index("Metric Value"); gi=h.index("Grid Size") if "Grid Size" in h else None
d=collections.OrderedDict()
for r in rows[1:]:
    if 'triton' not in r[ki]: continue
    d.setdefault((r[ki][:60], r[h.index("Grid Size")] if "Grid Size" in h else ''),{}).setdefault(r[mi],[]).append(r[vi])
for k,v in d.items(): print(k, {m: vv[len(vv)//2] for m,vv in v.items()})
P
for h in 16384 4096; do
  $NCU --metrics $M --csv $B/kiln run rmsnorm -p rows=8192 -p hidden=$h --dtype bf16 --bench --no-tune --iterations 3 > $OUT/ncu_kiln_$h.csv 2>/dev/null
  echo "kiln $h"; python3 - $OUT/ncu_kiln_$h.csv <<'P'
import csv,sys,collections
rows=[r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
h=rows[0]; mi=h.index("Metric Name"); vi=h.index("Metric Value")
d=collections.OrderedDict()
for r in rows[1:]: d.setdefault(r[mi],[]).append(r[vi])
print({m: vv[len(vv)//2] for m,vv in d.items()})
P
done
