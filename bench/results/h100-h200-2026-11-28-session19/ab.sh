#!/usr/bin/env bash
# A/B of memory-bound rows in one job: the working tree ("sig": main + pack + sigmoid), main
# ("base": sig.patch reversed) and "pack" (main + pack.patch). ONLY: bench_membound's --only.
set -uo pipefail
ROOT=$PWD H=$PWD/.gpu-carry/deps ONLY=${ONLY:-swiglu,rmsnorm_bwd} ROUNDS=${ROUNDS:-2} VARIANTS=${VARIANTS:-sig base pack}
export LD_LIBRARY_PATH=$H/lib
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/env.txt; date -u +%FT%TZ >> $OUT/env.txt
if [ ! -x build-gpu/bench/bench_membound ] || [ -n "${REBUILD:-}" ]; then
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/cm.log 2>&1
  ninja -C build-gpu ${TARGETS:-kiln_cli bench_membound test_gpu llama_step} > /tmp/b.log 2>&1 || { tail -40 /tmp/b.log; exit 1; }
fi
for v in base pack; do
  case " $VARIANTS " in *" $v "*) ;; *) continue ;; esac
  [ -x /tmp/$v/b/bench/bench_membound ] && continue
  rm -rf /tmp/$v && mkdir -p /tmp/$v
  tar --exclude=./build-gpu --exclude=./.gpu-carry --exclude=./build -cf - . | (cd /tmp/$v && tar xf -)
  (cd /tmp/$v && patch -s -R -p1 < $ROOT/.gpu-carry/sig.patch) || exit 1
  if [ $v = pack ]; then (cd /tmp/$v && patch -s -p1 < $ROOT/.gpu-carry/pack.patch) || exit 1; fi
  cmake -S /tmp/$v -B /tmp/$v/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/cm.log 2>&1
  ninja -C /tmp/$v/b bench_membound > /tmp/b.log 2>&1 || { tail -40 /tmp/b.log; exit 1; }
done
echo "built $(date -u +%T)"
mkdir -p $OUT/ab
for r in $(seq 1 $ROUNDS); do
  for v in $VARIANTS; do
    bin=build-gpu/bench/bench_membound; [ $v = sig ] || bin=/tmp/$v/b/bench/bench_membound
    KILN_CACHE_DIR=/tmp/kc-$v $bin $OUT/ab/mb_${v}_$r.csv --quick --only $ONLY > $OUT/ab/mb_${v}_$r.log 2>&1 || echo "$v $r failed"
  done
done
python3 - $OUT/ab $ROUNDS <<'PY'
import csv,sys,glob,collections
d,R=sys.argv[1],int(sys.argv[2])
rows=collections.OrderedDict()
for v in ("base","pack","sig"):
    for r in range(1,R+1):
        try:
            for row in csv.DictReader(open(f"{d}/mb_{v}_{r}.csv")):
                k=f"{row['label']} [{row['rows']}x{row['cols']}] {row['Check']}"
                rows.setdefault(k,{}).setdefault(v,[]).append(row["Time (ms)"])
        except Exception as e: print("read",v,r,e)
print("row | base | pack | sig (ms per round)")
for k,vs in rows.items(): print(k,"|"," | ".join(",".join(vs.get(v,[])) for v in ("base","pack","sig")))
PY
