#!/usr/bin/env bash
# Session 26, call 5: the commit's heuristic (head dim 128: atomic dQ for fixed-length MHA or
# unmasked batches, the deterministic kernels for causal GQA and packed batches): attention GPU
# specs and GpuAttention, then bench_attention --quick with SDPA's cuDNN and flash backends.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/env.txt" 2>&1; date -u +%FT%TZ >> "$OUT/env.txt"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu test_gpu bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
TEST_OPS=attention,attention_bwd bash scripts/gpu_step.sh tests; echo "tests $(( $(date +%s)-t0 )) s"
bash scripts/gpu_step.sh attention > $OUT/attention_tail.txt 2>&1; tail -22 $OUT/attention_tail.txt; echo "attention $(( $(date +%s)-t0 )) s"
mv $OUT/attention_peers/attention_report.csv $OUT/attention_report.csv 2>/dev/null; rm -f $OUT/attention.csv.varlen.json
