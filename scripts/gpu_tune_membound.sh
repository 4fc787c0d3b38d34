#!/usr/bin/env bash
# Times every tuning candidate of the memory-bound ops at bench_membound's sizes on this machine's
# GPU (`kiln run OP --bench`: the tuner times each candidate, then the winner is checked against
# the CPU reference), and prints each op's candidate table. Run after `scripts/gpu_step.sh build`.
#   scripts/gpu_tune_membound.sh [OP ...]     # default: rmsnorm rmsnorm_residual rmsnorm_bwd swiglu swiglu_bwd
#   (also: quantize_block1x128, moe_unpermute_bwd, cross_entropy_grad)
# Logs under $OUT (tune_OP.log). A fresh cache directory, so every candidate is timed.
set -uo pipefail
B=${B:-build-gpu}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.gpu-carry/deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export KILN_CACHE_DIR=$(mktemp -d)
ops=("$@")
[ ${#ops[@]} -eq 0 ] && ops=(rmsnorm rmsnorm_residual rmsnorm_bwd swiglu swiglu_bwd)
for op in "${ops[@]}"; do
  case $op in
    rmsnorm) specs=("rmsnorm -p hidden=4096" "rmsnorm -p hidden=8192" "rmsnorm -p hidden=16384") ;;
    rmsnorm_residual) specs=("rmsnorm -p residual=true,hidden=4096" "rmsnorm -p residual=true,hidden=16384") ;;
    rmsnorm_bwd) specs=("rmsnorm_bwd -p hidden=4096" "rmsnorm_bwd -p hidden=16384") ;;
    swiglu) specs=("swiglu -p intermediate=14336" "swiglu -p intermediate=29568" "swiglu -p intermediate=53248") ;;
    swiglu_bwd) specs=("swiglu_bwd -p intermediate=14336" "swiglu_bwd -p intermediate=53248") ;;
    quantize_block1x128) specs=("quantize_fp8 --out-dtype e4m3 -p granularity=block1x128,cols=4096"
                                "quantize_fp8 --out-dtype e4m3 -p granularity=block1x128,cols=14336") ;;
    moe_unpermute_bwd) specs=("moe_unpermute_bwd -p tokens=16384,hidden=7168,k=8") ;;
    cross_entropy_grad) specs=("cross_entropy -p tokens=8192,vocab=128256,grad_inplace=1") ;;
    *) echo "gpu_tune_membound.sh: unknown op $op" >&2; exit 2 ;;
  esac
  for s in "${specs[@]}"; do
    echo "== kiln run $s --dtype bf16 --bench"
    case $op in quantize*|rmsnorm*|swiglu*) rows="-p rows=8192" ;; *) rows="" ;; esac
    # shellcheck disable=SC2086
    $B/kiln run $s $rows --dtype bf16 --bench --iterations 200 2>&1 | head -60
  done > "$OUT/tune_$op.log"
  cat "$OUT/tune_$op.log"
done
