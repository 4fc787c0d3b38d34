#!/usr/bin/env bash
# Session 24: GPU specs of attention_bwd, A/B of the head-dim-64 rows against main, ncu times of the new kernels.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu test_gpu bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
if [ -z "${NOTEST:-}" ]; then
KILN_CACHE_DIR=/tmp/tg KILN_GPU_TEST_OPS=attention_bwd timeout 300 build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.EveryOpMatchesItsReference/0:GpuAttention*' > $OUT/test_gpu.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL " $OUT/test_gpu.log | head -30
echo "tests $(( $(date +%s)-t0 )) s"
fi
ROWS="${ROWS:-d64_s4096_b1_causal d64_s4096_b2_causal d64_s8192_b1_causal}" ROUNDS=${ROUNDS:-1} bash .gpu-carry/ab_attn.sh
echo "ab $(( $(date +%s)-t0 )) s"
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu | head -1)
ROW=${ROW:-hq64_hkv8_d64_s4096_b1_causal}
M=gpu__time_duration.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sectors_op_red.sum,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active,smsp__inst_executed_op_local_ld.sum
KILN_CACHE_DIR=/tmp/nc-new timeout 200 $NCU --clock-control none -k regex:kiln_attention_bwd --metrics $M -c 3 build-gpu/bench/bench_attention /tmp/x.csv --only $ROW --budget-ms 1 --min-reps 1 --max-reps 1 --seed 7 > $OUT/ncu_time_new.txt 2>&1
grep -E "kiln_attention_bwd|gpu__time|lts__|gmma|local" $OUT/ncu_time_new.txt | sed -n 1,30p
echo "all $(( $(date +%s)-t0 )) s"
