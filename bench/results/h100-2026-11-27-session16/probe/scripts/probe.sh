#!/usr/bin/env bash
# session-16 probes (not committed): write rates, Inductor's rmsnorm kernel, embedding_bwd's launches at few tokens
B=build-gpu; NCU=/usr/local/cuda/bin/ncu
python3 probe/memset.py > $OUT/memset.log 2>&1; cat $OUT/memset.log
TORCH_LOGS=output_code python3 probe/rmsnorm_inductor.py > $OUT/inductor.log 2>&1
grep -E "hidden|num_warps|XBLOCK|R0_BLOCK|RBLOCK|def triton|for r0|reduction_hint|persistent" $OUT/inductor.log | head -60
for t in 256 8192; do for d in 0 1; do
  $NCU --metrics gpu__time_duration.sum --csv $B/kiln run embedding_bwd -p tokens=$t -p vocab=128256 -p hidden=4096 -p ids_dtype=int64 -p dw_dtype=$d --dtype bf16 --bench --no-tune --iterations 3 > $OUT/emb_${t}_${d}.csv 2>/dev/null
  echo "tokens $t dw_dtype $d"; python3 probe/ncu_med.py $OUT/emb_${t}_${d}.csv
  $NCU --clock-control none --metrics gpu__time_duration.sum --csv $B/kiln run embedding_bwd -p tokens=$t -p vocab=128256 -p hidden=4096 -p ids_dtype=int64 -p dw_dtype=$d --dtype bf16 --bench --no-tune --iterations 3 > $OUT/embnc_${t}_${d}.csv 2>/dev/null
  echo " clock-control none"; python3 probe/ncu_med.py $OUT/embnc_${t}_${d}.csv
done; done
