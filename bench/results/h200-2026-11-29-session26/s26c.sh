#!/usr/bin/env bash
# Session 26, call 3: the working tree (head dim 128's atomic dQ the default with deterministic = 0,
# dQ's half as its own group): attention GPU specs and GpuAttention, bench_attention --quick with
# SDPA's cuDNN and flash backends, the llama step checked and timed against PyTorch.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/env.txt" 2>&1; date -u +%FT%TZ >> "$OUT/env.txt"
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu kiln_cli llama_step test_gpu bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
TEST_OPS=attention,attention_bwd bash scripts/gpu_step.sh tests; echo "tests $(( $(date +%s)-t0 )) s"
bash scripts/gpu_step.sh attention > $OUT/attention_tail.txt 2>&1; tail -22 $OUT/attention_tail.txt; echo "attention $(( $(date +%s)-t0 )) s"
bash scripts/gpu_step.sh check time; echo "step $(( $(date +%s)-t0 )) s"
