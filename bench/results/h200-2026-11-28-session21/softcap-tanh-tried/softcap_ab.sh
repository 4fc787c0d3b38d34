#!/usr/bin/env bash
# A/B of the softcap's tanh: the working tree (base) against it with .gpu-carry/old-tanh.patch applied (old),
# `kiln run OP ... --bench --no-tune` (100 flushed launches, median), then the attention GPU tests on base.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
b() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C "$2" $3 > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }; }
b . build-gpu "kiln_cli test_gpu"
rm -rf /tmp/ab-old && mkdir -p /tmp/ab-old && tar --exclude='./build*' --exclude=./.gpu-carry -cf - . | (cd /tmp/ab-old && tar xf -)
(cd /tmp/ab-old && patch -s -p1 < $OLDPWD/.gpu-carry/old-tanh.patch) || exit 1
b /tmp/ab-old /tmp/ab-old/b kiln_cli
mkdir -p $OUT/sc
for r in 1 2; do for d in 64 128; do for op in attention attention_bwd; do for v in base old; do
  bin=build-gpu/kiln; [ $v = old ] && bin=/tmp/ab-old/b/kiln
  KILN_CACHE_DIR=/tmp/sc-$v $bin run $op -p batch=1,seqlen_q=8192,seqlen_k=8192,heads=32,kv_heads=8,head_dim=$d,causal=true,softcap=30 --dtype bf16 --bench --no-tune > $OUT/sc/${v}_${op}_d${d}_$r.log 2>&1
  echo "$v $op d$d r$r: $(grep -i 'kernel \|fail' $OUT/sc/${v}_${op}_d${d}_$r.log | head -2 | tr '\n' ' ')"
done; done; done; done
KILN_CACHE_DIR=/tmp/tgc3 KILN_GPU_TEST_OPS=attention,attention_bwd timeout 240 build-gpu/tests/test_gpu > $OUT/test_gpu.log 2>&1; grep "specs pass\|FAILED" $OUT/test_gpu.log | head -5
(cd $OUT && tar cf sc.tar sc && rm -rf sc)
