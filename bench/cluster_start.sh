#!/usr/bin/env bash
# Cold versus warm start of a job: P processes started at once on one cache directory, each
# needing the same K kernels (as ranks of a training job do at start-up). Uses the test worker
# (tests/cache/cache_worker.cpp), which compiles small swiglu kernels through kiln::Runtime.
#   bench/cluster_start.sh [BUILD_DIR=build] [PROCESSES=16] [KERNELS=100] [TARGET=gfx942]
set -euo pipefail
BUILD=${1:-build}; P=${2:-16}; K=${3:-100}; TARGET=${4:-gfx942}
worker="$BUILD/tests/cache_worker"
[[ -x $worker ]] || { echo "cluster_start: $worker not built" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
start_all() {
  local t0 t1 compiles=0 kernels=0
  t0=$(date +%s.%N)
  for i in $(seq "$P"); do "$worker" "$dir/cache" "$TARGET" "$K" "$dir/r$i" & done
  wait
  t1=$(date +%s.%N)
  for i in $(seq "$P"); do
    kernels=$((kernels + $(awk '{print $1}' "$dir/r$i")))
    compiles=$((compiles + $(awk '{print $2}' "$dir/r$i")))
  done
  printf '%-5s %d processes x %d kernels (%s): %7.3f s wall, %d kernels obtained, %d compiles in all\n' "$1" "$P" "$K" "$TARGET" \
    "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" "$kernels" "$compiles"
}
start_all cold
start_all warm
