#!/usr/bin/env bash
# The training step (issue 16) and the new ops on the GPU machine, in steps that fit the device
# tool's 10-minute calls (the build directory stays on a warm machine between calls):
#   scripts/gpu_step.sh build check time     # then, in the next call:
#   scripts/gpu_step.sh moe                  # examples/moe_block checked and timed against PyTorch
#   scripts/gpu_step.sh attention tests      # (alltests: every op's specs in four parallel processes)
#   scripts/gpu_step.sh grouped              # bench_grouped_gemm + torch._grouped_mm (GROUPED_QUICK=1: DeepSeek-V3 only;
#                                            #   GROUPED_FP8=1: its fp8 forward, dgrad and wgrad rows, no peer;
#                                            #   GROUPED_WGRAD=1: each bf16 case's wgrad (tn) row too, with its peer;
#                                            #   GROUPED_MODELS=all|MODEL: models.json's moe sweep instead)
#   scripts/gpu_step.sh fp8                  # bench_gemm_fp8 + torch._scaled_mm (FP8_ARGS, default --quick)
#   (attention: bench_attention's arguments in ATTN_ARGS, default --quick; e.g. "--quick --only s8192_b1 --tune")
# check: examples/llama_step at --seq $CHECK_SEQ (2048) dumps weights and gradients, and
#        scripts/llama_step_torch.py compares them with PyTorch in fp32 (loss 1e-3, gradients 30 dB);
# time:  the step at the model's sequence length (micro-batch $MB, default 1; median of $STEPS, default 15) with its per-op
#        breakdown, then PyTorch eager and torch.compile of the same model in the same job.
#        FP8=RECIPE (tensorwise, block or block1x128) also times the step with its layer GEMMs in
#        fp8 in the same process (llama_step --fp8; the breakdown is then the fp8 step's) and prints
#        Kiln bf16, Kiln fp8 and torch.compile bf16 with the fp8 step's loss difference:
#          FP8=block scripts/gpu_step.sh build check time
# moe:   examples/moe_block ($MOE_MODEL, default deepseek-v3) dumps a block at $MOE_CHECK_ARGS (2048
#        tokens, 8 experts on this rank: a dump of about 3 GB) and scripts/moe_block_torch.py check
#        compares y and every gradient with PyTorch fp32 (30 dB) and PyTorch's own routing; then the
#        block at $MOE_TOKENS tokens (default: the model's seq) with the model's experts per rank
#        ($MOE_G to change it), median of 10 with its per-op breakdown, and PyTorch eager and
#        torch.compile (torch._grouped_mm) of the same block in the same job.
# Build without LLVM (NVRTC); hiredis and xxhash from .gpu-carry/deps, made here by
#   mkdir -p .gpu-carry/deps/{include,lib} && cp -r /usr/include/hiredis /usr/include/xxhash.h .gpu-carry/deps/include/ &&
#   cp -L /usr/lib/x86_64-linux-gnu/lib{hiredis,xxhash}.so* .gpu-carry/deps/lib/
# and carried (the device tool's carry: [".gpu-carry/deps"]). Logs under $OUT.
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
B=build-gpu
H=$PWD/.gpu-carry/deps
MODEL=${MODEL:-llama3.1-8b} MB=${MB:-1} CHECK_SEQ=${CHECK_SEQ:-2048} STEPS=${STEPS:-15}
MOE_MODEL=${MOE_MODEL:-deepseek-v3} MOE_CHECK_ARGS=${MOE_CHECK_ARGS:---tokens 2048 --experts-per-rank 8}
MOE_TOKENS=${MOE_TOKENS:-$(python3 -c "import json;print(json.load(open('models/models.json'))['moe']['$MOE_MODEL']['seq'])")}
export LD_LIBRARY_PATH=$H/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} KILN_CACHE_DIR=${KILN_CACHE_DIR:-/tmp/kiln-cache}
for step in "$@"; do
  t0=$(date +%s)
  case $step in
    build)
      nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/env.txt" 2>&1; date -u +%FT%TZ >> "$OUT/env.txt"
      cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_WITH_LLVM=OFF -DCMAKE_PREFIX_PATH=$H > "$OUT/cmake.log" 2>&1 &&
        ninja -C $B kiln_cli llama_step moe_block test_gpu bench_attention bench_membound bench_grouped_gemm bench_gemm_fp8 > "$OUT/build.log" 2>&1 ||
        { tail -40 "$OUT/build.log"; exit 1; } ;;
    check)
      rm -rf /tmp/step-dump
      $B/examples/llama_step --model "$MODEL" --seq "$CHECK_SEQ" --micro-batch "$MB" --time 0 --dump /tmp/step-dump \
        > "$OUT/step_check_kiln.log" 2>&1; tail -3 "$OUT/step_check_kiln.log"
      python3 scripts/llama_step_torch.py check /tmp/step-dump > "$OUT/step_check_torch.log" 2>&1
      cat "$OUT/step_check_torch.log" | tail -20 ;;
    time)
      log=$OUT/step_time_kiln_mb$MB${FP8:+_fp8_$FP8}.log
      $B/examples/llama_step --model "$MODEL" --micro-batch "$MB" --time "$STEPS" ${FP8:+--fp8 "$FP8"} > "$log" 2>&1 || true
      tail -48 "$log"
      ms=$(grep -o '^llama_step: step time [0-9.]*' "$log" | awk '{print $4}')
      ms8=$(grep -o '^llama_step: fp8 [a-z0-9]* step time [0-9.]*' "$log" | awk '{print $6}')
      dloss=$(grep -o 'loss difference [-+0-9.e]*' "$log" | awk '{print $3}')
      seq=$(python3 -c "import json;print(json.load(open('models/models.json'))['dense']['$MODEL']['seq'])")
      # the model's dimensions from the check step's dump (same model)
      python3 scripts/llama_step_torch.py time --model-dims /tmp/step-dump/index.json --seq "$seq" \
        --micro-batch "$MB" --kiln-ms "${ms:-0}" \
        ${FP8:+--fp8 "$FP8" --kiln-fp8-ms "${ms8:-0}" --fp8-loss-diff "${dloss:-nan}"} \
        > "$OUT/step_time_torch_mb$MB${FP8:+_fp8_$FP8}.log" 2>&1
      tail -7 "$OUT/step_time_torch_mb$MB${FP8:+_fp8_$FP8}.log" ;;
    moe)  # one MoE block through Kiln alone: checked against PyTorch fp32, then timed against PyTorch
      rm -rf /tmp/moe-dump
      # shellcheck disable=SC2086 # MOE_CHECK_ARGS is a list of options
      $B/examples/moe_block --model "$MOE_MODEL" $MOE_CHECK_ARGS --time 0 --dump /tmp/moe-dump \
        > "$OUT/moe_check_kiln.log" 2>&1; tail -3 "$OUT/moe_check_kiln.log"
      python3 scripts/moe_block_torch.py check /tmp/moe-dump > "$OUT/moe_check_torch.log" 2>&1
      tail -12 "$OUT/moe_check_torch.log"
      $B/examples/moe_block --model "$MOE_MODEL" --tokens "$MOE_TOKENS" ${MOE_G:+--experts-per-rank $MOE_G} --time 10 \
        > "$OUT/moe_time_kiln.log" 2>&1 || true
      tail -24 "$OUT/moe_time_kiln.log"
      ms=$(grep -o 'block time [0-9.]*' "$OUT/moe_time_kiln.log" | awk '{print $3}')
      # the time run's dimensions: the check dump's model with the time run's experts per rank
      python3 - "$MOE_MODEL" ${MOE_G:-} <<'PY' > /tmp/moe-time-dims.json
import json, sys
index = json.load(open("/tmp/moe-dump/index.json"))
model = json.load(open("models/models.json"))["moe"][sys.argv[1]]
index["dims"]["experts_per_rank"] = int(sys.argv[2]) if len(sys.argv) > 2 else model["experts_per_rank"][0]
print(json.dumps(index))
PY
      python3 scripts/moe_block_torch.py time --model-dims /tmp/moe-time-dims.json --tokens "$MOE_TOKENS" \
        --kiln-ms "${ms:-0}" > "$OUT/moe_time_torch.log" 2>&1
      tail -6 "$OUT/moe_time_torch.log" ;;
    attention)
      $B/bench/bench_attention "$OUT/attention.csv" ${ATTN_ARGS:---quick} > "$OUT/bench_attention.log" 2>&1; tail -40 "$OUT/bench_attention.log"
      python3 bench/attention_peers.py "$OUT/attention.csv" "$OUT/attention_peers" > "$OUT/attention_peers.log" 2>&1
      tail -30 "$OUT/attention_peers.log" ;;
    tests)
      # every op's test specs with NVRTC (Compilers/Gpu.*/0), the determinism tests of embedding_bwd and attention_bwd,
      # the fp8 MoE dgrad and wgrad as a caller runs them (GpuFp8Moe: quantize_fp8, then grouped_gemm)
      # (TEST_OPS=op1,op2: only those ops' specs, through KILN_GPU_TEST_OPS)
      KILN_GPU_TEST_OPS=${TEST_OPS:-} $B/tests/test_gpu --gtest_filter='Compilers/Gpu.*/0:GpuEmbedding*:GpuAttention*:GpuFp8Moe*' > "$OUT/test_gpu.log" 2>&1
      grep -E "specs pass|^\[  (PASSED|FAILED)|FAILED  \]|FAIL |\[ gpu \]" "$OUT/test_gpu.log" | head -40 ;;
    alltests)  # every op's specs with NVRTC, in four processes at once (their compiles run in parallel)
      groups=("gemm" "rmsnorm,swiglu,rmsnorm_bwd,swiglu_bwd,quantize_fp8,dequantize_fp8"
              "cross_entropy,cross_entropy_bwd,rope,rope_bwd,embedding,embedding_bwd,gemm_fp8,grouped_gemm"
              "attention,attention_bwd,moe_router,moe_router_bwd,moe_permute,moe_permute_bwd,moe_unpermute,moe_unpermute_bwd")
      for i in "${!groups[@]}"; do
        # the first process also runs the tests that are not op specs (embedding_bwd's determinism,
        # the fp8 MoE dgrad and wgrad recipes)
        filter='Compilers/Gpu.*/0'; [ "$i" = 0 ] && filter="$filter:GpuEmbedding*:GpuFp8Moe*"
        KILN_GPU_TEST_OPS=${groups[$i]} $B/tests/test_gpu --gtest_filter="$filter" > "$OUT/test_gpu_$i.log" 2>&1 &
      done
      wait
      cat "$OUT"/test_gpu_*.log > "$OUT/test_gpu.log"; rm -f "$OUT"/test_gpu_*.log
      grep -E "specs pass|^\[  (PASSED|FAILED)|FAILED  \]|FAIL " "$OUT/test_gpu.log" | head -40 ;;
    membound)  # the rows of the new memory-bound ops, with their PyTorch peers
      $B/bench/bench_membound "$OUT/membound_new.csv" --quick --only cross_entropy,rope,embedding,rmsnorm_bwd_dres \
        > "$OUT/membound_new.log" 2>&1; tail -15 "$OUT/membound_new.log"
      python3 bench/membound_peers.py "$OUT/membound_new.csv" "$OUT/membound_peers" > "$OUT/membound_peers.log" 2>&1
      tail -25 "$OUT/membound_peers.log" ;;
    grouped)  # grouped_gemm (MoE forward) against torch._grouped_mm, same group sizes, same job
      # (GROUPED_FP8=1: the fp8 blockwise forward, dgrad and wgrad rows instead, Kiln only)
      $B/bench/bench_grouped_gemm "$OUT/grouped.csv" ${GROUPED_QUICK:+--quick} ${GROUPED_TUNE:+--tune} ${GROUPED_FP8:+--fp8} \
        ${GROUPED_WGRAD:+--wgrad} ${GROUPED_MODELS:+--models "$GROUPED_MODELS"} > "$OUT/bench_grouped.log" 2>&1
      if [ -n "${GROUPED_FP8:-}${GROUPED_WGRAD:-}" ]; then tail -28 "$OUT/bench_grouped.log"; else tail -12 "$OUT/bench_grouped.log"; fi
      if [ -z "${GROUPED_FP8:-}" ]; then
        python3 bench/grouped_gemm_peers.py "$OUT/grouped.csv" > "$OUT/grouped_peers.log" 2>&1
        tail -20 "$OUT/grouped_peers.log"
      fi ;;
    fp8)  # gemm_fp8 on a step's forward, dgrad and wgrad GEMMs against torch._scaled_mm, same job
      $B/bench/bench_gemm_fp8 "$OUT/fp8.csv" ${FP8_ARGS:---quick} > "$OUT/bench_fp8.log" 2>&1
      tail -5 "$OUT/bench_fp8.log"
      python3 bench/gemm_fp8_peers.py "$OUT/fp8.csv" "$OUT/fp8_peers.csv" > "$OUT/fp8_peers.log" 2>&1
      tail -60 "$OUT/fp8_peers.log" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  echo "== $step: $(( $(date +%s) - t0 )) s"
done
