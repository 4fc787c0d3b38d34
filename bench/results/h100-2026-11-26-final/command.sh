export MB=1 GROUPED_QUICK=1
S=scripts/gpu_step.sh
bash $S build || exit 1
timeout 260 bash $S tests
export LD_LIBRARY_PATH=$PWD/.gpu-carry/hiredis/lib KILN_CACHE_DIR=/tmp/kiln-cache
rm -rf /tmp/step-dump; timeout 40 build-gpu/examples/llama_step --model llama3.1-8b --seq 256 --time 0 --dump /tmp/step-dump > $OUT/dims_dump.log 2>&1; tail -1 $OUT/dims_dump.log
timeout 130 bash $S time
timeout 70 bash $S grouped
timeout 60 build-gpu/bench/bench_membound $OUT/membound_moe.csv --quick --only moe > $OUT/membound_moe.log 2>&1; tail -8 $OUT/membound_moe.log
timeout 50 python3 bench/membound_peers.py $OUT/membound_moe.csv $OUT/moe_peers > $OUT/moe_peers.log 2>&1; tail -10 $OUT/moe_peers.log
