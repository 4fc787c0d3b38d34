#!/usr/bin/env bash
# A/B of embedding_bwd's launches 2-5 as programmatic dependent launches: this tree against
# ab_old/templates (the commit before), bench_membound --quick --only embedding_bwd, 3 alternating
# rounds; embedding_bwd's GPU specs and determinism test.
set -uo pipefail
export OUT=${OUT:-$PWD/out}
H=$PWD/.gpu-carry/deps
export LD_LIBRARY_PATH=$H/lib
KILN_CACHE_DIR=/tmp/kc-new scripts/gpu_step.sh build || exit 1
KILN_CACHE_DIR=/tmp/kc-new KILN_GPU_TEST_OPS=embedding_bwd build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.*/0:GpuEmbedding.*' > $OUT/tests.log 2>&1; echo "tests rc=$?"
grep -E "^\[  (PASSED|FAILED) |specs pass" $OUT/tests.log
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./build-gpu --exclude=./ab_old -cf - . | tar -C /tmp/old -xf - && cp -r ab_old/templates /tmp/old/
(cd /tmp/old && cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /dev/null && ninja -C b bench_membound > $OUT/old_build.log 2>&1) || { tail $OUT/old_build.log; exit 1; }
for r in 1 2 3; do
  KILN_CACHE_DIR=/tmp/kc-new build-gpu/bench/bench_membound $OUT/new_$r.csv --quick --only embedding_bwd > $OUT/new_$r.log 2>&1
  KILN_CACHE_DIR=/tmp/kc-old /tmp/old/b/bench/bench_membound $OUT/old_$r.csv --quick --only embedding_bwd > $OUT/old_$r.log 2>&1
done
for v in new old; do echo "== $v"; tail -3 $OUT/${v}_3.log | head -2; done
