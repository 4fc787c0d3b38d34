#!/usr/bin/env bash
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
bash scripts/gpu_step.sh build alltests
echo "build+alltests $(( $(date +%s)-t0 )) s"
t1=$(date +%s)
KILN_CACHE_DIR=/tmp/kr timeout 240 build-gpu/kiln run attention_bwd -p batch=1,seqlen_q=8192,seqlen_k=8192,heads=32,kv_heads=8,head_dim=128,causal=true --dtype bf16 --seed 3 > $OUT/run_attn_bwd_s8192.log 2>&1; echo "rc $?"
echo "kiln run attention_bwd s8192: $(( $(date +%s)-t1 )) s"; grep -i "PASS\|FAIL\|first call" $OUT/run_attn_bwd_s8192.log | head -6
echo "all $(( $(date +%s)-t0 )) s"
