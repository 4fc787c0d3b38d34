#!/usr/bin/env bash
# cross_entropy and cross_entropy_bwd on the GPU machine (issue 16), in steps that fit the device
# tool's 10-minute calls (the build directory stays on a warm machine between calls). Logs and
# CSVs go under $OUT.
#   scripts/gpu_cross_entropy.sh build check    # then, in later calls:
#   scripts/gpu_cross_entropy.sh bench peers
#   scripts/gpu_cross_entropy.sh tune
# (test_gpu, which runs every op's test specs with NVRTC and clang, is scripts/gpu_bench_steps.sh's
# `tests` step.)
# build: without LLVM (NVRTC), hiredis and xxhash from .gpu-carry/deps, as scripts/gpu_bench_steps.sh.
# check: every test spec of both ops (vocab 1 to 152064, in place, int32/int64 targets) against
#        the fp64 reference, through kiln run --check.
# bench: bench_membound's cross-entropy rows ([8192, 128256], [8192, 152064], [16384, 32000]
#        bf16; the heuristic's kernels, a fresh cache).
# peers: PyTorch eager / torch.compile on the same shapes, and forward + backward against
#        torch.compile of the mean loss's forward and backward together.
# tune:  kiln run --bench (every tuning candidate timed, the winner marked) at [8192, 128256].
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
B=build-gpu
H=$PWD/.gpu-carry/deps
export LD_LIBRARY_PATH=$H/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    build)
      nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/env.txt" 2>&1
      date -u +%FT%TZ >> "$OUT/env.txt"
      cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > "$OUT/cmake.log" 2>&1 &&
        ninja -C $B kiln_cli bench_membound > "$OUT/build.log" 2>&1 ||
        { tail -40 "$OUT/build.log"; exit 1; } ;;
    check)
      export KILN_CACHE_DIR=$(mktemp -d)
      for op in cross_entropy cross_entropy_bwd; do
        extra=""; [ $op = cross_entropy_bwd ] && extra=",inplace=1"
        for spec in "tokens=8192,vocab=128256" "tokens=8192,vocab=152064" "tokens=16384,vocab=32000" \
                    "tokens=8192,vocab=128256,smoothing=1,z_loss=1"; do  # bf16 (host-side inputs are slow)
          $B/kiln run $op -p "$spec$extra" --dtype bf16 --check --sample-rows 64 2>&1 | grep -E "^(PASS|FAIL)|error"
        done
        for spec in "tokens=300,vocab=128256,target_dtype=1" "tokens=7,vocab=4099" "tokens=3,vocab=7"; do
          for dt in bf16 fp16 fp32; do
            $B/kiln run $op -p "$spec$extra" --dtype $dt --check 2>&1 | grep -E "^(PASS|FAIL)|error"
          done
        done
      done | cut -c1-220 | tee "$OUT/check.log"; echo "$(grep -c ^PASS "$OUT/check.log") PASS, $(grep -c ^FAIL "$OUT/check.log") FAIL" ;;
    bench)
      KILN_CACHE_DIR=$(mktemp -d) $B/bench/bench_membound $B/kiln_ce.csv --only cross_entropy > "$OUT/kiln_ce.log" 2>&1
      cp $B/kiln_ce.csv "$OUT/"; cat "$OUT/kiln_ce.log" ;;
    peers)
      python3 bench/membound_peers.py $B/kiln_ce.csv "$OUT" > "$OUT/ce_peers.log" 2>&1
      tail -20 "$OUT/ce_peers.log" ;;
    tune)
      export KILN_CACHE_DIR=$(mktemp -d)
      $B/kiln run cross_entropy -p tokens=8192,vocab=128256 --dtype bf16 --check --bench --sample-rows 16 2>&1 | tee "$OUT/tune_fwd.log" | tail -16
      $B/kiln run cross_entropy_bwd -p tokens=8192,vocab=128256,inplace=1 --dtype bf16 --check --bench --sample-rows 16 2>&1 | tee "$OUT/tune_bwd.log" | tail -16 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== $step: $(( $(date +%s) - t0 )) s"
done
