#!/usr/bin/env bash
# A/B of rmsnorm's forward kernel: this tree against ab_old/templates (the kernel before the change),
# bench_membound --quick --only rmsnorm, 3 alternating rounds, and rmsnorm's GPU test specs.
set -uo pipefail
export OUT=${OUT:-$PWD/out}
H=$PWD/.gpu-carry/deps
export LD_LIBRARY_PATH=$H/lib
KILN_CACHE_DIR=/tmp/kc-new scripts/gpu_step.sh build || exit 1
KILN_CACHE_DIR=/tmp/kc-new KILN_GPU_TEST_OPS=rmsnorm build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.*' > $OUT/tests.log 2>&1; echo "tests rc=$?"
grep -E "^\[  (PASSED|FAILED) " $OUT/tests.log
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./build-gpu --exclude=./ab_old -cf - . | tar -C /tmp/old -xf - && cp -r ab_old/templates /tmp/old/
(cd /tmp/old && cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /dev/null && ninja -C b bench_membound > $OUT/old_build.log 2>&1) || { tail $OUT/old_build.log; exit 1; }
for r in 1 2 3; do
  KILN_CACHE_DIR=/tmp/kc-new build-gpu/bench/bench_membound $OUT/new_$r.csv --quick --only rmsnorm > $OUT/new_$r.log 2>&1
  KILN_CACHE_DIR=/tmp/kc-old /tmp/old/b/bench/bench_membound $OUT/old_$r.csv --quick --only rmsnorm > $OUT/old_$r.log 2>&1
done
tail -12 $OUT/new_3.log
