#!/usr/bin/env bash
# A cluster without a shared file system, on one machine: R ranks, each a process with a cache
# directory of its own (a separate "node"), all needing the same K kernels, sharing one Redis
# through the remote cache tier (KILN_REMOTE_CACHE). Uses the test worker
# (tests/cache/cache_worker.cpp: small swiglu kernels through kiln::Runtime, compile-only).
#   bench/remote_cluster.sh [BUILD_DIR=build] [RANKS=256] [KERNELS=50] [TARGET=gfx942]
# Runs, each timed from the start of the first rank to the end of the last:
#   cold         empty Redis, empty local caches: K compiles cluster-wide are expected
#   warm-remote  the same Redis, empty local caches (new nodes join a warm cluster): 0 compiles
#   warm-local   the cold run's local caches again: every kernel a local disk hit
#   redis-killed empty Redis and caches; Redis is killed (SIGKILL) KILL_AFTER_S seconds (default
#                1) after the start: every rank must still get every kernel
# 256 processes on 2 cores starve Redis of CPU too: KILN_REMOTE_CACHE_TIMEOUT (default here 10 s)
# must exceed the longest reply time, or ranks turn the tier off (by design) and compile locally.
set -euo pipefail
BUILD=${1:-build}; R=${2:-256}; K=${3:-50}; TARGET=${4:-gfx942}; KILL_AFTER_S=${KILL_AFTER_S:-1}
worker="$BUILD/tests/cache_worker"
[[ -x $worker ]] || { echo "remote_cluster: $worker not built" >&2; exit 1; }
command -v redis-server >/dev/null || { echo "remote_cluster: redis-server not installed" >&2; exit 1; }
dir=$(mktemp -d)
redis_pid=
cleanup() { [[ -n $redis_pid ]] && kill "$redis_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"; return 0; }
trap cleanup EXIT
export KILN_REMOTE_CACHE_TIMEOUT=${KILN_REMOTE_CACHE_TIMEOUT:-10}
export KILN_REMOTE_CACHE_KEY=${KILN_REMOTE_CACHE_KEY:-bench-secret-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}

start_redis() {
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$dir" --loglevel warning \
    --maxclients 10000 >/dev/null &
  redis_pid=$!
  for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
  export KILN_REMOTE_CACHE=redis://127.0.0.1:$port/0
}
stop_redis() { kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; redis_pid=; }

# run NAME NODES_DIR [kill]: R ranks at once on NODES_DIR/rank<i>.
run() {
  local name=$1 nodes=$2 t0 t1 killer=
  mkdir -p "$nodes"
  t0=$(date +%s.%N)
  for i in $(seq "$R"); do "$worker" "$nodes/rank$i" "$TARGET" "$K" "$nodes/report$i" 2>>"$nodes/stderr" & done
  if [[ ${3:-} == kill ]]; then (sleep "$KILL_AFTER_S"; kill -9 "$redis_pid") & killer=$!; fi
  local killed_pid=$redis_pid
  local failed=0
  for job in $(jobs -p); do
    [[ $job == "$killed_pid" || $job == "$killer" ]] && continue
    wait "$job" || failed=$((failed + 1))
  done
  t1=$(date +%s.%N)
  if [[ -n $killer ]]; then wait "$killer" 2>/dev/null || true; wait "$killed_pid" 2>/dev/null || true; redis_pid=; fi
  local ok=0 compiles=0 remote=0 disk=0 complete=0
  for i in $(seq "$R"); do
    read -r o c d _ _ rh < "$nodes/report$i" || true
    ok=$((ok + ${o:-0})); compiles=$((compiles + ${c:-0})); disk=$((disk + ${d:-0})); remote=$((remote + ${rh:-0}))
    [[ ${o:-0} == "$K" ]] && complete=$((complete + 1))
  done
  printf '%-12s %d ranks x %d kernels (%s): %8.3f s wall; %d/%d ranks got every kernel, %d failed; %d compiles cluster-wide, %d remote hits, %d local disk hits\n' \
    "$name" "$R" "$K" "$TARGET" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')" "$complete" "$R" "$failed" \
    "$compiles" "$remote" "$disk"
}

echo "# $(date -u +%FT%TZ) $(nproc) cores, $(redis-server --version | cut -d' ' -f3), worker $worker," \
  "KILN_REMOTE_CACHE_TIMEOUT=$KILN_REMOTE_CACHE_TIMEOUT, kill after ${KILL_AFTER_S} s"
start_redis
run cold "$dir/cold"
run warm-remote "$dir/warm"
run warm-local "$dir/cold"
stop_redis
start_redis
run redis-killed "$dir/killed" kill
warnings=$(grep -c "going on with the local cache tiers only" "$dir/killed/stderr" || true)
echo "redis-killed: $warnings ranks warned that the remote tier went away (one warning each at most)"
