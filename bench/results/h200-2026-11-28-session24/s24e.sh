#!/usr/bin/env bash
# Session 24: the atomic-dQ candidate through the tuning test (every candidate against the reference),
# attention_bwd's GPU specs (the default kernels) and the attention GPU tests.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C build-gpu test_gpu > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
echo "build $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/tg2 timeout 400 build-gpu/tests/test_gpu --gtest_filter='GpuTuning.EveryCandidateMatchesTheReference' > $OUT/test_tuning.log 2>&1; grep -E "FAILED|PASSED|Failure|ATOMIC" $OUT/test_tuning.log | head -20
echo "tuning $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/tg3 KILN_GPU_TEST_OPS=attention,attention_bwd timeout 300 build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.EveryOpMatchesItsReference/0:GpuAttention*' > $OUT/test_gpu.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL " $OUT/test_gpu.log | head -30
echo "all $(( $(date +%s)-t0 )) s"
