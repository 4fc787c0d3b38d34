#!/usr/bin/env bash
# Builds the libFuzzer targets with clang 22 (ASan + UBSan) and runs each for a bounded time:
# first every regression input kept in fuzz/regressions/<target>/ (crashes found before), then a
# fresh fuzzing run seeded from fuzz/corpus/<target>/. A crash fails the run and leaves the input
# under build-fuzz/crashes/; copy it into fuzz/regressions/<target>/ once fixed.
#   fuzz/run.sh [SECONDS_PER_TARGET]     (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-30}
CXX=${KILN_FUZZ_CXX:-clang++-22}
OUT=build-fuzz
mkdir -p "$OUT/obj" "$OUT/crashes"
command -v "$CXX" >/dev/null || { echo "fuzz: $CXX not found (apt-get install clang-22 libclang-rt-22-dev)"; exit 1; }

# The ops, as CMake collects them: every folder under templates/ but the library, lib/ (the .cpp
# and .kernel files of both).
op_dirs=()
for d in templates/*/; do [[ $d == templates/lib/ ]] || op_dirs+=("$d"); done
kernels=$(ls templates/*/*.kernel | tr '\n' ';')
cmake -DOUT="$OUT/embedded.cpp" -DROOT="$PWD" \
  "-DFILES=codegen/preludes/amdgpu.prelude;codegen/preludes/nvptx.prelude;${kernels}models/models.json" \
  -P cmake/embed.cmake
mkdir -p "$OUT/generated"
{
  for d in "${op_dirs[@]}"; do op=$(basename "$d"); echo "#include \"templates/$op/$op.h\""; done
  echo "#define KILN_OP_FOLDERS ${#op_dirs[@]}"
} >"$OUT/generated/op_headers.h.new"
cmp -s "$OUT/generated/op_headers.h.new" "$OUT/generated/op_headers.h" || mv "$OUT/generated/op_headers.h.new" "$OUT/generated/op_headers.h"
SOURCES=(support/dtype.cpp support/dynlib.cpp support/env.cpp support/fs.cpp support/log.cpp support/parallel.cpp support/sha256.cpp support/xxh3.cpp
  support/spec_json.cpp
  templates/op_interface.cpp templates/op_codegen.cpp templates/op_testing.cpp templates/op_template.cpp templates/registry.cpp templates/*/*.cpp
  codegen/targets.cpp codegen/codegen.cpp compile/code_object.cpp manifest/manifest.cpp cache/disk_cache.cpp cache/cache_key.cpp
  compile/compiler.cpp compile/nvrtc_compiler.cpp compile/clang_options.cpp
  compile/nvrtc_api.cpp "$OUT/embedded.cpp")
FLAGS=(-std=c++20 -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
  -I. -Iinclude -I"$OUT" -I/usr/local/cuda/include -DKILN_WITH_LLVM=0 -DKILN_WITH_HIP=0 '-DKILN_CLANG_VERSION="22.1.8"')
objs=()
# An object is rebuilt when its source or any header of the tree is newer (a header that changes a
# type's layout, such as op_interface.h's ParamInfo, must rebuild every object that uses it: a
# stale one reads the type with its old size).
newest_header=$(find include templates codegen compile support cache runtime manifest "$OUT/generated" -name '*.h' \
  -printf '%T@ %p\n' | sort -n | tail -1 | cut -d' ' -f2-)
for src in "${SOURCES[@]}"; do
  obj="$OUT/obj/$(echo "$src" | tr '/' '_').o"
  if [[ ! -f $obj || $src -nt $obj || $newest_header -nt $obj ]]; then "$CXX" "${FLAGS[@]}" -c "$src" -o "$obj" & fi
  objs+=("$obj")
  while (( $(jobs -r | wc -l) >= $(nproc) )); do wait -n; done
done
wait
status=0
for target in manifest metadata; do
  "$CXX" "${FLAGS[@]}" -fsanitize=fuzzer "fuzz/fuzz_$target.cpp" "${objs[@]}" -lfmt -lspdlog -lcrypto -lxxhash -ldl \
    -o "$OUT/fuzz_$target"
  regressions=(fuzz/regressions/$target/[!.]*)
  if [[ -e ${regressions[0]} ]]; then
    "$OUT/fuzz_$target" "${regressions[@]}" >"$OUT/regress_$target.log" 2>&1 ||
      { echo "fuzz: $target: a regression input fails again (log: $OUT/regress_$target.log)"; status=1; }
  fi
  corpus=$(mktemp -d)
  cp fuzz/corpus/$target/* "$corpus"/ 2>/dev/null || true
  if "$OUT/fuzz_$target" "$corpus" -max_total_time="$SECONDS_PER_TARGET" -max_len=8192 -timeout=10 \
       -artifact_prefix="$OUT/crashes/${target}-" -print_final_stats=1 >"$OUT/fuzz_$target.log" 2>&1; then
    echo "fuzz: $target: $(grep -E 'stat::number_of_executed_units' "$OUT/fuzz_$target.log" | awk '{print $2}') runs in ${SECONDS_PER_TARGET} s, no crash"
  else
    echo "fuzz: $target: CRASH, input saved under $OUT/crashes/ (log: $OUT/fuzz_$target.log)"; tail -30 "$OUT/fuzz_$target.log"; status=1
  fi
  rm -rf "$corpus"
done
exit $status
