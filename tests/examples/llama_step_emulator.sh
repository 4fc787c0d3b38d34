#!/usr/bin/env bash
# The training step of kiln-tiny (examples/llama_step) in the AMD emulator for one target, as a
# user runs it: kiln manifest + kiln prewarm, then the step, which must compile nothing
# (--require-prewarmed) and match the same graph on the ops' float64 CPU references (--check:
# loss within 1e-3, every gradient above 30 dB). Exit 77 (skip) where the emulator is missing.
#   llama_step_emulator.sh KILN LLAMA_STEP TARGET WORKDIR
set -euo pipefail
kiln=$1 step=$2 target=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
export KILN_CACHE_DIR=$work/cache
"$kiln" manifest kiln-tiny -o "$work/kiln-tiny.json"
"$kiln" prewarm "$work/kiln-tiny.json" --arch "$target" > "$work/prewarm.log"
exec "$step" --model kiln-tiny --backend emulator --arch "$target" --require-prewarmed --check
