#!/usr/bin/env bash
# grouped fp8 scale ring: build, GPU tests, then A/B against main's kernel (3 alternating rounds)
set -uo pipefail
export OUT
H=$PWD/.gpu-carry/hiredis
export LD_LIBRARY_PATH=$H/lib KILN_CACHE_DIR=/tmp/kc-new
KILN_GPU_TEST_OPS=grouped_gemm scripts/gpu_step.sh build || exit 1
KILN_GPU_TEST_OPS=grouped_gemm build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.*:GpuRuntime.Fp8*:GpuFp8Moe*' > $OUT/tests.log 2>&1; echo "tests rc=$?"; grep -E "PASSED|FAILED|SKIPPED" $OUT/tests.log | head -20
rm -rf /tmp/old && mkdir /tmp/old && tar --exclude=./build-gpu --exclude=./ab_old -cf - . | tar -C /tmp/old -xf - && cp -r ab_old/templates /tmp/old/
(cd /tmp/old && cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DHIREDIS_INCLUDE_DIR=$H/include -DHIREDIS_LIBRARY=$H/lib/libhiredis.so > /dev/null && ninja -C b bench_grouped_gemm > $OUT/old_build.log 2>&1) || { tail $OUT/old_build.log; exit 1; }
for r in 1 2 3; do
  KILN_CACHE_DIR=/tmp/kc-new build-gpu/bench/bench_grouped_gemm $OUT/new_$r.csv --quick --fp8 > $OUT/new_$r.log 2>&1
  KILN_CACHE_DIR=/tmp/kc-old /tmp/old/b/bench/bench_grouped_gemm $OUT/old_$r.csv --quick --fp8 > $OUT/old_$r.log 2>&1
done
tail -16 $OUT/new_3.log; tail -16 $OUT/old_3.log
