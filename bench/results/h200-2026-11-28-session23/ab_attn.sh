#!/usr/bin/env bash
# A/B of bench_attention rows: the working tree (base) against it with .gpu-carry/old-attn.patch applied (old).
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
mkdir -p $OUT/ab
b() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C "$2" bench_attention ${TARGETS:-} > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }; }
b . build-gpu
if [ ! -x /tmp/ab-old/b/bench/bench_attention ]; then
  rm -rf /tmp/ab-old && mkdir -p /tmp/ab-old && tar --exclude=./build-gpu --exclude=./.gpu-carry --exclude='./build*' -cf - . | (cd /tmp/ab-old && tar xf -)
  (cd /tmp/ab-old && patch -s -p1 < $OLDPWD/.gpu-carry/old-attn.patch) || exit 1
  b /tmp/ab-old /tmp/ab-old/b
fi
declare -A bin=([base]=build-gpu/bench/bench_attention [old]=/tmp/ab-old/b/bench/bench_attention)
for r in $(seq 1 ${ROUNDS:-2}); do for lab in $ROWS; do for v in base old; do
  KILN_CACHE_DIR=/tmp/abc-$v ${bin[$v]} $OUT/ab/${v}_${lab}_$r.csv --only $lab ${EXTRA:-} --budget-ms ${BUDGET:-300} --seed 7 > $OUT/ab/${v}_${lab}_$r.log 2>&1
  printf "%-4s %-34s r%s %s\n" $v $lab $r "$(grep -o 'fwd .*reps)' $OUT/ab/${v}_${lab}_$r.log | head -1)"
done; done; done
(cd $OUT && tar cf ab.tar ab && rm -rf ab)
