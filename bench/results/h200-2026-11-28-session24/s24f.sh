#!/usr/bin/env bash
# Session 24: the atomic-dQ candidate with red.global.add.v4.f32 from registers (red) against the bulk
# reduction from shared memory (bulk) and main (old); both atomic trees make ATOMIC_DQ the default at
# head dim 64 for the run (sed on a copy). GPU specs of attention_bwd in the red tree.
set -uo pipefail
OUT=${OUT:-$PWD/out}; H=$PWD/.gpu-carry/deps; export LD_LIBRARY_PATH=$H/lib
t0=$(date +%s)
b() { cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/c.log 2>&1 && ninja -C "$2" bench_attention ${T:-} > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }; }
K=templates/attention_bwd/attention_bwd_sm90.kernel; C=templates/attention_bwd/attention_bwd.cpp
cp_tree() { rm -rf $1 && mkdir -p $1 && tar --exclude=./build-gpu --exclude=./.gpu-carry --exclude='./build*' -cf - . | (cd $1 && tar xf -); }
for v in red bulk; do
  cp_tree /tmp/$v
  sed -i 's/if (has_wgmma(spec, target)) return {sm90_config(24, 0), portable};/if (has_wgmma(spec, target)) return {sm90_config(24, 0, wants_atomic_dq(spec)), portable};/' /tmp/$v/$C
  grep -c 'sm90_config(24, 0, wants_atomic_dq(spec)), portable' /tmp/$v/$C
  [ $v = bulk ] && sed -i 's/constexpr bool DQ_BULK = false;/constexpr bool DQ_BULK = true;/' /tmp/$v/$K
  T=$([ $v = red ] && echo test_gpu) b /tmp/$v /tmp/$v/b
done
if [ ! -x /tmp/ab-old/b/bench/bench_attention ]; then
  cp_tree /tmp/ab-old; (cd /tmp/ab-old && patch -s -p1 < $OLDPWD/.gpu-carry/old-attn.patch) || exit 1
  b /tmp/ab-old /tmp/ab-old/b
fi
echo "builds $(( $(date +%s)-t0 )) s"
KILN_CACHE_DIR=/tmp/tr KILN_GPU_TEST_OPS=attention_bwd timeout 300 /tmp/red/b/tests/test_gpu --gtest_filter='Compilers/Gpu.EveryOpMatchesItsReference/0' > $OUT/test_gpu_red.log 2>&1; grep -E "specs pass|FAILED|PASSED|FAIL " $OUT/test_gpu_red.log | head
echo "tests $(( $(date +%s)-t0 )) s"
declare -A bin=([red]=/tmp/red/b/bench/bench_attention [bulk]=/tmp/bulk/b/bench/bench_attention [old]=/tmp/ab-old/b/bench/bench_attention)
for lab in ${ROWS:-hq64_hkv8_d64_s4096_b1_causal hq32_hkv4_d64_s8192_b1_causal hq32_hkv32_d64_s4096_b1_full}; do for v in red bulk old; do
  KILN_CACHE_DIR=/tmp/fc-$v ${bin[$v]} $OUT/${v}_${lab}.csv --only $lab --shape 64/8/64/4096 --shape 32/4/64/8192 --shape 32/32/64/4096 --budget-ms 300 --seed 7 > $OUT/${v}_${lab}.log 2>&1
  printf "%-4s %-34s %s\n" $v $lab "$(grep -o 'bwd .*reps)' $OUT/${v}_${lab}.log | head -1)"
done; done
rm -f $OUT/*.varlen.json
echo "all $(( $(date +%s)-t0 )) s"
