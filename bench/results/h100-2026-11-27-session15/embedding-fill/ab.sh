#!/usr/bin/env bash
# A/B/C of embedding_bwd's zero fill: 16 stores a thread (this tree), 8 (ab_f8), 4 (ab_old, the
# commit before), bench_membound --quick --only embedding_bwd, 3 alternating rounds; GPU specs.
set -uo pipefail
export OUT=${OUT:-$PWD/out}
H=$PWD/.gpu-carry/deps
export LD_LIBRARY_PATH=$H/lib
KILN_CACHE_DIR=/tmp/kc-new scripts/gpu_step.sh build || exit 1
KILN_CACHE_DIR=/tmp/kc-new KILN_GPU_TEST_OPS=embedding_bwd build-gpu/tests/test_gpu --gtest_filter='Compilers/Gpu.*/0:GpuEmbedding.*' > $OUT/tests.log 2>&1; echo "tests rc=$?"
grep -E "^\[  (PASSED|FAILED) |specs pass" $OUT/tests.log
for v in old f8; do
  rm -rf /tmp/$v && mkdir /tmp/$v && tar --exclude=./build-gpu --exclude=./ab_old --exclude=./ab_f8 -cf - . | tar -C /tmp/$v -xf - && cp -r ab_$v/templates /tmp/$v/
  (cd /tmp/$v && cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /dev/null && ninja -C b bench_membound > $OUT/${v}_build.log 2>&1) || { tail $OUT/${v}_build.log; exit 1; }
done
for r in 1 2 3; do
  KILN_CACHE_DIR=/tmp/kc-new build-gpu/bench/bench_membound $OUT/new_$r.csv --quick --only embedding > $OUT/new_$r.log 2>&1
  for v in old f8; do KILN_CACHE_DIR=/tmp/kc-$v /tmp/$v/b/bench/bench_membound $OUT/${v}_$r.csv --quick --only embedding > $OUT/${v}_$r.log 2>&1; done
done
for v in new old f8; do echo "== $v"; tail -4 $OUT/${v}_3.log | head -3; done
