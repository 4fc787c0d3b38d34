#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu kiln_cli test_gpu bench_attention bench_gemm > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
# kiln run --bench settling (7b9b8d8)
for r in 1 2; do
KILN_CACHE_DIR=/tmp/kr build-gpu/kiln run gemm -p M=8192,N=8192,K=8192,trans_a=false,trans_b=true --dtype bf16 --bench --no-tune --seed 3 > $OUT/run_gemm_$r.log 2>&1; grep -i "kernel\|time\|TFLOP\|fail" $OUT/run_gemm_$r.log | head -6
KILN_CACHE_DIR=/tmp/kr build-gpu/kiln run rmsnorm -p hidden=4096 -p rows=16384 --dtype bf16 --bench --no-tune --seed 3 > $OUT/run_rms_$r.log 2>&1; grep -i "kernel\|time\|GB/s\|fail" $OUT/run_rms_$r.log | head -6
done
echo "settle done $(( $(date +%s)-t0 )) s"
EXTRA="--shape 32/8/128/8192 --shape 32/8/64/8192 --softcap 30" ROWS="d128_s8192_b1_causal d64_s8192_b1_causal" ROUNDS=2 bash .gpu-carry/ab_attn.sh
echo "ab done $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/tgc3 KILN_GPU_TEST_OPS=attention,attention_bwd timeout 200 build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.EveryOpMatchesItsReference/0' > $OUT/test_gpu.log 2>&1; grep "specs pass\|FAILED\|PASSED" $OUT/test_gpu.log | head -5
echo "all $(( $(date +%s)-t0 )) s"
