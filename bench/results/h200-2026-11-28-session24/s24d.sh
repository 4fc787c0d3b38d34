#!/usr/bin/env bash
# Session 24: where the atomic-dQ dK/dV kernel's time goes: variants without the bulk reductions (v1),
# and without the reductions and dQ's second half (v2); timing only (their checks fail by design).
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
b() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C "$2" bench_attention > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }; }
b . build-gpu
K=templates/attention_bwd/attention_bwd_sm90.kernel
for v in v1 v2; do
  rm -rf /tmp/$v && mkdir -p /tmp/$v && tar --exclude=./build-gpu --exclude=./.gpu-carry --exclude='./build*' -cf - . | (cd /tmp/$v && tar xf -)
  sed -i 's/^\( *\)bulk_reduce_add_f32(dq_tile/\1if (kiln::thread_x() > 100000) bulk_reduce_add_f32(dq_tile/' /tmp/$v/$K
  [ $v = v2 ] && sed -i 's/if constexpr (ATOMIC_DQ) second_half(n, dqt);/if constexpr (ATOMIC_DQ) { wgmma_fence_operand(dqt); stage_dq(n, dqt, 0); }/' /tmp/$v/$K
  grep -c "thread_x() > 100000" /tmp/$v/$K
  b /tmp/$v /tmp/$v/b
done
declare -A bin=([base]=build-gpu/bench/bench_attention [v1]=/tmp/v1/b/bench/bench_attention [v2]=/tmp/v2/b/bench/bench_attention)
for lab in ${ROWS:-d64_s4096_b1_causal d64_s8192_b1_causal}; do for v in base v1 v2; do
  KILN_CACHE_DIR=/tmp/dc-$v ${bin[$v]} $OUT/${v}_${lab}.csv --only $lab --budget-ms 300 --seed 7 > $OUT/${v}_${lab}.log 2>&1
  printf "%-4s %-34s %s\n" $v $lab "$(grep -o 'bwd .*reps)' $OUT/${v}_${lab}.log | head -1)"
done; done
