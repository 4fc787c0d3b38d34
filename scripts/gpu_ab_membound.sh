#!/usr/bin/env bash
# Before-and-after of memory-bound rows in one job on the GPU machine: the working tree ("base")
# against each patch in .gpu-carry/ab/ (one variant per NAME.patch, applied to a copy of the
# tree), every tree built without LLVM, then `bench_membound --quick --only $ONLY` on each in
# alternating rounds, and a table of each row's times per variant and round. Made here, before the
# device call (carry [".gpu-carry"]: the patches and the deps of scripts/gpu_step.sh's header):
#   mkdir -p .gpu-carry/ab && git diff main wip/my-change > .gpu-carry/ab/my-change.patch
# then on the device:
#   ONLY=swiglu,rmsnorm_bwd ROUNDS=2 scripts/gpu_ab_membound.sh
# Logs and CSVs under $OUT/ab (tarred to $OUT/ab.tar: the device tool returns a few files only).
# Each tree keeps its own kernel cache. A variant's build is kept on a warm machine (/tmp/ab-NAME).
set -uo pipefail
OUT=${OUT:-$PWD/out}
ONLY=${ONLY:?ONLY: bench_membound --only prefixes, e.g. swiglu,rmsnorm_bwd} ROUNDS=${ROUNDS:-2}
ROOT=$PWD H=$PWD/.gpu-carry/deps
export LD_LIBRARY_PATH=$H/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT/ab"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/ab/env.txt" 2>&1; date -u +%FT%TZ >> "$OUT/ab/env.txt"
build() {  # build SOURCE_DIR BUILD_DIR
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > /tmp/ab-cmake.log 2>&1 &&
    ninja -C "$2" bench_membound > /tmp/ab-build.log 2>&1 || { tail -40 /tmp/ab-build.log; exit 1; }
}
build . build-gpu
declare -A bin=([base]=build-gpu/bench/bench_membound)
variants=(base)
for p in .gpu-carry/ab/*.patch; do
  [ -e "$p" ] || continue
  v=$(basename "$p" .patch) dir=/tmp/ab-$(basename "$p" .patch)
  if [ ! -x "$dir/b/bench/bench_membound" ]; then
    rm -rf "$dir" && mkdir -p "$dir"
    tar --exclude=./build-gpu --exclude=./.gpu-carry --exclude='./build*' -cf - . | (cd "$dir" && tar xf -)
    (cd "$dir" && patch -s -p1 < "$ROOT/$p") || { echo "gpu_ab_membound.sh: $p does not apply" >&2; exit 1; }
    build "$dir" "$dir/b"
  fi
  bin[$v]=$dir/b/bench/bench_membound
  variants+=("$v")
done
echo "built: ${variants[*]} ($(date -u +%T))"
for r in $(seq 1 "$ROUNDS"); do
  for v in "${variants[@]}"; do
    KILN_CACHE_DIR=/tmp/ab-cache-$v "${bin[$v]}" "$OUT/ab/mb_${v}_$r.csv" --quick --only "$ONLY" > "$OUT/ab/mb_${v}_$r.log" 2>&1 ||
      echo "$v, round $r: bench_membound failed (see mb_${v}_$r.log)"
  done
done
python3 - "$OUT/ab" "$ROUNDS" "${variants[@]}" <<'PY' | tee "$OUT/ab/table.txt"
import csv, sys
d, rounds, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for v in variants:
    for r in range(1, rounds + 1):
        try:
            for row in csv.DictReader(open(f"{d}/mb_{v}_{r}.csv")):
                key = f"{row['label']} [{row['rows']}x{row['cols']}] {row['Check']}"
                rows.setdefault(key, {}).setdefault(v, []).append(row["Time (ms)"])
        except OSError as e:
            print(f"{v} round {r}: {e}")
print("row | " + " | ".join(variants) + "  (ms, one figure per round)")
for key, by in rows.items():
    print(key + " | " + " | ".join(", ".join(by.get(v, [])) for v in variants))
PY
(cd "$OUT" && tar cf ab.tar ab && rm -rf ab)
