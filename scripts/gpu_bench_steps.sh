#!/usr/bin/env bash
# The GPU machine's benchmarks and GPU tests in steps that fit the device tool's 10-minute calls
# (the build directory stays on a warm machine between calls): launch overhead (bench_launch), a
# disk hit phase by phase with the driver's module load (bench_disk_hit), the memory-bound report
# (bench_membound, then its PyTorch peers), attention (bench_attention, then its PyTorch SDPA
# peers) and test_gpu. Logs and CSVs go under $OUT. (scripts/gpu_check.sh is the
# one-call build + whole suite + examples.)
#   scripts/gpu_bench_steps.sh build launch disk_hit membound   # then, in the next call:
#   scripts/gpu_bench_steps.sh peers tests
#   scripts/gpu_bench_steps.sh build attention         # --quick cases (< 3 min) + peers
#   scripts/gpu_bench_steps.sh attention_full          # all cases + peers; or, if that does not fit
#   scripts/gpu_bench_steps.sh attention_full_kiln     #   one call, these two in two calls
#   scripts/gpu_bench_steps.sh attention_full_peers
# The build is without LLVM; hiredis and xxhash come from .gpu-carry/deps (headers and libraries), and
# prewarmed kernel caches from .gpu-carry/{nvrtc,clang}-cache (see tests/gpu/test_gpu.cpp).
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
B=build-gpu
H=$PWD/.gpu-carry/deps
export LD_LIBRARY_PATH=$H/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
configure() {
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > "$OUT/cmake.log" 2>&1 || { tail -40 "$OUT/cmake.log"; exit 1; }
}
# bench_attention (fresh cache: cold NVRTC compiles, heuristic kernels) into $B/kiln_$1.csv; $2: --quick or ''
attention_kiln() {
  [ -f $B/build.ninja ] || configure
  ninja -C $B bench_attention > "$OUT/build_attention.log" 2>&1 || { tail -40 "$OUT/build_attention.log"; exit 1; }
  KILN_CACHE_DIR=$(mktemp -d) $B/bench/bench_attention $B/kiln_$1.csv $2 > "$OUT/kiln_$1.log" 2>&1
  echo "bench_attention exit $?"
  cp $B/kiln_$1.csv $B/kiln_$1.csv.varlen.json "$OUT/" 2>/dev/null
  grep -v "^  check:" "$OUT/kiln_$1.log" | tail -52
}
# PyTorch SDPA (cuDNN, flash) on the cases of $B/kiln_$1.csv; report in $OUT/$1_peers/
attention_peers() {
  python3 bench/attention_peers.py $B/kiln_$1.csv "$OUT/$1_peers" > "$OUT/$1_peers.log" 2>&1
  echo "attention_peers.py exit $?"
  sed -n '/^label /,$p' "$OUT/$1_peers.log" | tail -60
}
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/env.txt" 2>&1
      date -u +%FT%TZ >> "$OUT/env.txt"
      configure
      ninja -C $B kiln bench_launch bench_disk_hit bench_membound test_gpu > "$OUT/build.log" 2>&1 ||
        { tail -40 "$OUT/build.log"; exit 1; } ;;
    attention)  # the --quick cases: one per shape (causal) at batch 1 and 2, and the causal varlen batch
      attention_kiln attention --quick
      attention_peers attention ;;
    attention_full)
      attention_kiln attention_full ""
      attention_peers attention_full ;;
    attention_full_kiln) attention_kiln attention_full "" ;;
    attention_full_peers) attention_peers attention_full ;;
    launch)
      KILN_CACHE_DIR=$(mktemp -d) $B/bench/bench_launch 2>&1 | sed 's/\x1b\[[0-9;]*m//g' > "$OUT/bench_launch.log"
      tail -8 "$OUT/bench_launch.log" ;;
    disk_hit)  # a disk hit phase by phase on this machine, the module load through the real driver (sm_90a):
      # the rows NAME/OP/2 (target 2 = sm_90a), medians of 3. At most 5 minutes (exit 124 then), the
      # log unbuffered and the exit status in it. Until KernelHit held the device's context (see
      # bench_disk_hit.cpp) this step did not end within a 10-minute call and left an empty log
      KILN_CUDA_LIB=libcuda.so.1 timeout 300 $B/bench/bench_disk_hit --benchmark_filter='/2($|/iterations)' --benchmark_repetitions=3 \
        --benchmark_report_aggregates_only=true 2>&1 | sed -u 's/\x1b\[[0-9;]*m//g' > "$OUT/bench_disk_hit.log"
      echo "bench_disk_hit exit ${PIPESTATUS[0]}" | tee -a "$OUT/bench_disk_hit.log"
      grep -E "^(Codegen|Key|OpenRead|MetaJson|Sha256|Load|LoadHit|Hit|LoadModule|KernelHit)/.*_median|ERROR" \
        "$OUT/bench_disk_hit.log" ;;
    membound)  # Kiln's side; a fresh cache, so the heuristic's kernels (no tuning records)
      KILN_CACHE_DIR=$(mktemp -d) $B/bench/bench_membound $B/kiln_membound.csv --quick > "$OUT/kiln_membound.log" 2>&1
      cp $B/kiln_membound.csv "$OUT/"; cat "$OUT/kiln_membound.log" ;;
    membound32k)  # 32768 tokens (slow host-side input generation)
      KILN_CACHE_DIR=$(mktemp -d) $B/bench/bench_membound $B/kiln_membound_32k.csv > "$OUT/kiln_membound_32k.log" 2>&1
      cp $B/kiln_membound_32k.csv "$OUT/"; tail -30 "$OUT/kiln_membound_32k.log" ;;
    peers)
      python3 bench/membound_peers.py $B/kiln_membound.csv "$OUT" > "$OUT/membound_peers.log" 2>&1
      cat "$OUT/membound_peers.log" | tail -40 ;;
    tests)
      export KILN_GPU_NVRTC_CACHE=$(mktemp -d) KILN_GPU_CLANG_CACHE=$(mktemp -d)
      cp -r .gpu-carry/nvrtc-cache/. "$KILN_GPU_NVRTC_CACHE/" 2>/dev/null
      cp -r .gpu-carry/clang-cache/. "$KILN_GPU_CLANG_CACHE/" 2>/dev/null
      KILN_CACHE_DIR=$(mktemp -d) $B/tests/test_gpu > "$OUT/test_gpu.log" 2>&1
      grep -E "^device:|specs pass|^\[  (PASSED|FAILED)|FAILED  \]|Failure" "$OUT/test_gpu.log" | head -40 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== $step: $(( $(date +%s) - t0 )) s"
done
