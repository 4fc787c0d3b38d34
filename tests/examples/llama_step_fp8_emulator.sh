#!/usr/bin/env bash
# The training step of kiln-tiny (examples/llama_step) with its layer GEMMs in fp8, in the AMD
# emulator for one target and one recipe, as a user runs it: kiln manifest (bf16, and --fp8 RECIPE)
# + kiln prewarm of both, then the bf16 and the fp8 step in one process, which must compile nothing
# (--require-prewarmed) and pass --check: the bf16 step and the fp8 step against the bf16 graph on
# the ops' float64 CPU references (gates in examples/llama_step.cpp and docs/gemm-fp8.md). Exit 77
# (skip) where the emulator is missing.
#   llama_step_fp8_emulator.sh KILN LLAMA_STEP TARGET RECIPE WORKDIR
set -euo pipefail
kiln=$1 step=$2 target=$3 recipe=$4 work=$5
rm -rf "$work" && mkdir -p "$work"
export KILN_CACHE_DIR=$work/cache
"$kiln" manifest kiln-tiny -o "$work/kiln-tiny.json"
"$kiln" manifest kiln-tiny --fp8 "$recipe" -o "$work/kiln-tiny-fp8.json"
"$kiln" prewarm "$work/kiln-tiny.json" --arch "$target" > "$work/prewarm.log"
"$kiln" prewarm "$work/kiln-tiny-fp8.json" --arch "$target" > "$work/prewarm-fp8.log"
# One layer: every kernel of the manifests still runs (the later layers repeat the same specs).
exec "$step" --model kiln-tiny --layers 1 --backend emulator --arch "$target" --require-prewarmed --check \
  --fp8 "$recipe"
