#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu kiln_cli test_gpu bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
TARGETS=kiln_cli EXTRA="--shape 32/8/128/8192 --shape 32/8/64/8192 --softcap 30" ROWS="d128_s8192_b1_causal d64_s8192_b1_causal d128_s8192_b1_full" ROUNDS=2 bash .gpu-carry/ab_attn.sh
echo "ab done $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/tgc3 KILN_GPU_TEST_OPS=attention,attention_bwd timeout 200 build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.EveryOpMatchesItsReference/0' > $OUT/test_gpu.log 2>&1; grep "specs pass\|FAILED\|PASSED\|softcap" $OUT/test_gpu.log | head -8
# accuracy of the softcap's tanh at the test spec with the larger softcap, both trees
for v in base old; do bin=build-gpu/kiln; [ $v = old ] && bin=/tmp/ab-old/b/kiln
  for op in attention attention_bwd; do KILN_CACHE_DIR=/tmp/acc-$v timeout 120 $bin run $op -p batch=1,seqlen_q=333,seqlen_k=333,heads=4,kv_heads=2,head_dim=128,causal=true,softcap=2 --dtype bf16 --check --seed 5 2>&1 | grep -i "PASS\|FAIL" | sed "s/^/$v /"; done; done
echo "all $(( $(date +%s)-t0 )) s"
