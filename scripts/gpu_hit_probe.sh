#!/usr/bin/env bash
# A disk hit and a fresh runtime's first kernel through libcuda, on the GPU machine (hiredis and
# xxhash from .gpu-carry/deps; the build first):
#   scripts/gpu_hit_probe.sh 1   bench_disk_hit's sm_90a rows (medians of 3), then bench_attention
#                                --tune on two attention shapes at batch 1, 2 and 4;
#   scripts/gpu_hit_probe.sh 2   KernelHit and KernelHitNoTuning, each in its own process, twice,
#                                alternating (their spread between processes), and the runtime
#                                and prewarm GPU tests.
# (The fifteenth session ran it as scripts/gpu_session15.sh: bench/results/h100-2026-11-27-session15/.)
set -uo pipefail
export OUT=${OUT:-$PWD/out}
H=$PWD/.gpu-carry/deps
export LD_LIBRARY_PATH=$H/lib KILN_CACHE_DIR=/tmp/kc
scripts/gpu_step.sh build || exit 1
ninja -C build-gpu bench_disk_hit > /dev/null || exit 1
hit() {  # $1: filter, $2: log
  KILN_CUDA_LIB=libcuda.so.1 timeout 200 build-gpu/bench/bench_disk_hit --benchmark_filter="$1" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true 2>&1 | sed -u 's/\x1b\[[0-9;]*m//g' | grep -v "_mean\|_stddev\|_cv" > "$2"
  grep median "$2"
}
case ${1:-1} in
  1)
    hit '^(Hit|Xxh3|Sha256|LoadModule|KernelHit).*/2($|/iterations)' $OUT/bench_disk_hit.log
    for only in hq32_hkv8_d128_s8192 hq64_hkv8_d128_s4096; do
      timeout 240 build-gpu/bench/bench_attention $OUT/attn_$only.csv --only $only --tune > $OUT/tune_$only.log 2>&1
      echo "== $only rc=$?"; grep -E "<-|TFLOP" $OUT/tune_$only.log | head -80
    done ;;
  2)
    for r in 1 2; do
      hit '^KernelHitNoTuning/' $OUT/kernel_hit_notuning_$r.log
      hit '^KernelHit/' $OUT/kernel_hit_$r.log
    done
    KILN_GPU_TEST_OPS=rmsnorm build-gpu/tests/test_gpu --gtest_filter='GpuRuntime.*:GpuPrewarm.*:GpuTuning.TheWinnerIsKeptForTheNextProcess' \
      > $OUT/tests.log 2>&1; echo "tests rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) " $OUT/tests.log | head ;;
esac
