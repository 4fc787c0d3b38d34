#!/usr/bin/env bash
# Session 27, call 5: the varlen batch's sequences as dense rows (b1, causal, hq32/8 D128): is the
# varlen rate the sum of its lengths' rates?
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
S=""; for s in 7294 4568 2186 1672 401 263; do S="$S --shape 32/8/128/$s"; done
KILN_CACHE_DIR=/tmp/gc build-gpu/bench/bench_attention $OUT/lens.csv --quick $S --budget-ms 300 --seed 7 > $OUT/lens.log 2>&1
grep -E "TFLOP/s" $OUT/lens.log | grep -v "^ " | cut -c1-150 | head -30
echo "all $(( $(date +%s)-t0 )) s"
