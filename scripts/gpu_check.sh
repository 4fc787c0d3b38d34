#!/usr/bin/env bash
# Builds Kiln without LLVM on the GPU machine (it has no LLVM development files), then runs the
# whole test suite, the GPU tests for NVRTC-built and clang-built kernels, the examples and the
# launch benchmark. Logs go under $OUT (default ./out); a short summary is printed last.
#
# Clang-built sm_90a kernels come from a cache prewarmed on a machine with LLVM:
#   KILN_GPU_CLANG_CACHE=$PWD/.gpu-carry/clang-cache build/tests/test_gpu --gtest_filter='GpuPrewarm.*'
# and carried to the GPU machine in .gpu-carry/.
#
# Usage: scripts/gpu_check.sh [build|test|examples|cli|bench|gemm|all]...
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
BUILD=${BUILD:-build-gpu}
steps=("${@:-all}")
summary=()
note() { summary+=("$1"); echo "== $1"; }
want() { for s in "${steps[@]}"; do [[ $s == all || $s == "$1" ]] && return 0; done; return 1; }

{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1
  g++ --version | head -1; cmake --version | head -1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if want build; then
  t0=$(date +%s)
  if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF >"$OUT/configure.log" 2>&1 &&
     ninja -C "$BUILD" -k 0 >"$OUT/build.log" 2>&1; then
    note "build: OK ($(( $(date +%s) - t0 )) s, KILN_WITH_LLVM=OFF)"
  else
    note "build: FAILED (see build.log)"; tail -40 "$OUT/configure.log" "$OUT/build.log"; exit 1
  fi
fi

export KILN_CACHE_DIR=$(mktemp -d)/cache
export KILN_GPU_CLANG_CACHE=${KILN_GPU_CLANG_CACHE:-$PWD/.gpu-carry/clang-cache}

if want test; then
  (cd "$BUILD" && ctest --output-on-failure -j 8 -E 'Gpu' >"$OUT/ctest.log" 2>&1)
  note "ctest (no-GPU tests, no-LLVM build): $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
  "$BUILD/tests/test_gpu" >"$OUT/test_gpu.log" 2>&1
  note "test_gpu: $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/test_gpu.log" | tr '\n' ' ')"
  grep -E "^device:|specs pass|SKIPPED \]|Failure" "$OUT/test_gpu.log" | head -20 | while read -r l; do note "  $l"; done
fi

if want examples; then
  "$BUILD/examples/quickstart" >"$OUT/quickstart.log" 2>&1
  note "quickstart: rc=$? $(tail -1 "$OUT/quickstart.log")"
  export KILN_CACHE_DIR=$(mktemp -d)/cache
  "$BUILD/examples/llama_mlp" >"$OUT/llama_mlp_cold.log" 2>&1
  note "llama_mlp (empty cache): rc=$?"
  "$BUILD/examples/llama_mlp" >"$OUT/llama_mlp_warm.log" 2>&1
  note "llama_mlp (second process, disk cache): rc=$?"
  cat "$OUT/llama_mlp_cold.log" "$OUT/llama_mlp_warm.log"
fi

if want cli; then
  export KILN_CACHE_DIR=$(mktemp -d)/cache
  {
    "$BUILD/kiln" run gemm -p M=8192 -p N=6144 -p K=4096 -p trans_a=false -p trans_b=true --dtype bf16 --bench
    "$BUILD/kiln" run gemm -p M=127 -p N=4097 -p K=33 -p trans_a=true -p trans_b=false --dtype fp16 --out-dtype fp32 --check
    "$BUILD/kiln" run rmsnorm -p rows=8192 -p hidden=4096 --dtype bf16 --check --bench
    "$BUILD/kiln" run swiglu -p rows=8192 -p intermediate=14336 --dtype bf16 --check --bench
  } >"$OUT/kiln_run.log" 2>&1
  note "kiln run: $(grep -c PASS "$OUT/kiln_run.log") PASS, $(grep -c FAIL "$OUT/kiln_run.log") FAIL"
  grep -E "PASS|FAIL|median|TFLOP|GB/s|first call" "$OUT/kiln_run.log" | head -24
fi

if want bench; then
  "$BUILD/bench/bench_launch" >"$OUT/bench_launch.log" 2>&1
  note "bench_launch: rc=$?"
  tail -7 "$OUT/bench_launch.log"
  bench/cluster_start.sh "$BUILD" 16 100 sm_90a >"$OUT/cluster_start.log" 2>&1
  note "cluster_start: $(tr '\n' ' ' < "$OUT/cluster_start.log")"
fi

if want gemm; then
  if [[ -x "$BUILD/bench/bench_gemm" ]]; then
    "$BUILD/bench/bench_gemm" --out "$OUT" ${KILN_GEMM_ARGS:-} >"$OUT/bench_gemm.log" 2>&1
    note "bench_gemm: rc=$?"
    tail -30 "$OUT/bench_gemm.log"
  fi
fi

echo; echo "==== summary"; printf '%s\n' "${summary[@]}"
