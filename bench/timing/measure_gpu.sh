#!/usr/bin/env bash
# Re-measures every GPU figure in bench/RESULTS.md on a CUDA machine: the CUDA kernel tests, the kernel
# microbenchmarks (bench/kernels/gpu_kernels.py, bench/kernels/kfac_accuracy.py) and the Llama-2-7B-shaped shot timings
# given as arguments ("BLOCKS:SHOTS:BATCH", e.g. 8:4:1 32:4:2; a fourth field "profile" also writes
# torch.profiler's table, and "lowmem" runs --activation-checkpointing --offload --block-groups 2; a fifth field names another structure, unstructured pruned to 50% instead of 80%, N:M
# written NofM, e.g. 32:1:2::unstructured or 32:1:2::2of4), and the generation speed of SmolLM2 and of the
# checkpoints named in GENERATION_MODELS (bench/timing/generation_speed.py). Logs and JSON go to $OUT (default
# out/gpu); the generation results go to bench/results/gpu. The shots run --backend triton (BACKEND=auto
# to compare), so that every Triton kernel runs on the GPU; surgeon_kernels.ops.RUN_ON_CUDA then lists
# those that passed, with this commit. SKIP_TESTS=1, SKIP_MICRO=1 and SKIP_GENERATION=1 leave out the
# tests (at most 300 s), the microbenchmarks (at most MICRO_TIMEOUT, 300 s, then the factor accumulation's
# accuracy, 120 s) and the generation speed (at most 600 s); each shot spec may take 420 s. RANKS=N (on a
# machine with N GPUs) also times each shot spec under torchrun on N GPUs, split by batches and by blocks
# with FSDP2 (420 s each).
#
# --quick measures what users run in at most 9.5 minutes by its own count (each step's time limit, in order,
# about 1.2x its time on one H200): a torch.profiler table of a 2-block structured shot (75 s; it also
# compiles the Triton kernels), one structured Llama-2-7B shot at 80% (80 s), the default 2:4 run (200 s: its
# masks come from one OBS sweep per layer), one unstructured 50% shot (115 s), all with --backend auto and 2 windows
# per pass, then the SparseGPT drop-in against SparseGPT's algorithm at q_proj's shape, 4096x4096 (45 s), and the
# fused SparseGPT sweep in bench/kernels/sparsegpt_sweep.py against surgeon's at that shape (35 s).
# Unstructured and N:M runs, here and in every shot spec, time LLM Surgeon's run alone (--held-out 0, as
# under torchrun): the sparsegpt-refine shot that surgeon prune weighs them against is timed apart
# (shot_time.py without --held-out). COMMIT names the commit measured (default: git's HEAD).
set -uo pipefail
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
export COMMIT=${COMMIT:-$(git rev-parse --short=7 HEAD 2>/dev/null)}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/env.txt"
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$OUT/env.txt"
echo "commit $COMMIT" | tee -a "$OUT/env.txt"
if [ "${1:-}" = --quick ]; then
  quick() {  # LIMIT NAME STRUCTURE BLOCKS [shot_time.py options]: one timed run, its report in $OUT/NAME.json
    local limit=$1 name=$2 structure=$3 blocks=$4
    shift 4
    timeout "$limit" python3 -m bench.timing.shot_time --config bench/configs/llama-2-7b.json --layers "$blocks" \
      --device cuda --dtype bfloat16 --nsamples 128 --seqlen 2048 --batch-size 2 --structure "$structure" \
      --backend auto --output "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
    echo "$name rc=$?"; grep -v "it/s\]" "$OUT/$name.log" | tail -3
  }
  quick 75 profile-2blocks structured 2 --shots 1 --target-size 0.8 --profile "$OUT/profile-2blocks.txt"
  quick 80 structured structured 32 --shots 1 --target-size 0.8
  quick 200 2of4 2:4 32 --held-out 0
  quick 115 unstructured unstructured 32 --shots 1 --target-size 0.5 --held-out 0
  timeout 45 python3 -m bench.quality.sparsegpt_dropin --shapes llama2-7b --layers q_proj --device cuda --exact-shots 1 \
    --output "$OUT/dropin.json" > "$OUT/dropin.log" 2>&1
  echo "dropin rc=$?"; tail -6 "$OUT/dropin.log"
  timeout 35 python3 -m bench.kernels.sparsegpt_sweep --device cuda --layers q_proj --output "$OUT/sweep.json" \
    > "$OUT/sweep.log" 2>&1
  echo "sweep rc=$?"; tail -2 "$OUT/sweep.log"
  exit 0
fi
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout 300 python3 -m pytest -q -m requires_cuda tests/kernels -p no:cacheprovider 2>&1 | tail -25 | tee "$OUT/tests.txt"
fi
for spec in "$@"; do
  IFS=: read -r blocks shots batch profile structure <<< "$spec"
  structure=${structure:-structured}
  name="llama2-7b-${blocks}blocks-${shots}shots-batch${batch}${profile:+-$profile}"
  [ "$structure" = structured ] || name="$name-$structure"
  case "$structure" in  # N:M is written NofM in a spec (e.g. 2of4), whose fields ':' separates
    structured) target=(--target-size 0.8) ;;
    *of*) structure=${structure/of/:}; target=() ;;
    *) target=(--target-size 0.5) ;;
  esac
  extra=()
  [ "$profile" = profile ] && extra=(--profile "$OUT/profile-$name.txt")
  [ "$profile" = lowmem ] && extra=(--activation-checkpointing --offload --block-groups 2)
  timeout 420 python3 -m bench.timing.shot_time --config bench/configs/llama-2-7b.json --layers "$blocks" --device cuda \
    --dtype bfloat16 --nsamples 128 --seqlen 2048 --shots "$shots" --batch-size "$batch" "${target[@]}" \
    --structure "$structure" --backend "${BACKEND:-triton}" --output "$OUT/shot-$name.json" --held-out 0 \
    "${extra[@]}" > "$OUT/shot-$name.log" 2>&1
  echo "shot $spec rc=$?"; grep -v "it/s\]" "$OUT/shot-$name.log" | tail -6
  if [ -n "${RANKS:-}" ]; then
    for split in batches blocks; do
      sharding=()
      [ "$split" = blocks ] && sharding=(--fsdp)
      timeout 420 torchrun --standalone --nproc-per-node "$RANKS" -m bench.timing.shot_time \
        --config bench/configs/llama-2-7b.json --layers "$blocks" --device cuda --dtype bfloat16 --nsamples 128 \
        --seqlen 2048 --shots "$shots" --batch-size "$batch" "${target[@]}" --structure "$structure" \
        --backend "${BACKEND:-triton}" --curvature-split "$split" "${sharding[@]}" \
        --output "$OUT/shot-$name-${RANKS}ranks-$split.json" > "$OUT/shot-$name-${RANKS}ranks-$split.log" 2>&1
      echo "shot $spec on $RANKS ranks by $split rc=$?"; grep -v "it/s\]" "$OUT/shot-$name-${RANKS}ranks-$split.log" | tail -4
    done
  fi
done
if [ -z "${SKIP_MICRO:-}" ]; then
  timeout "${MICRO_TIMEOUT:-300}" python3 -m bench.kernels.gpu_kernels --output "$OUT/micro-gpu.json" > "$OUT/micro.log" 2>&1
  echo "micro rc=$?"; tail -3 "$OUT/micro.log"
  timeout 120 python3 -m bench.kernels.kfac_accuracy --output "$OUT/kfac-accuracy.json" > "$OUT/kfac-accuracy.log" 2>&1
  echo "kfac accuracy rc=$?"
fi
if [ -z "${SKIP_GENERATION:-}" ]; then
  # SmolLM2 dense, then (when GENERATION_MODELS names them) pruned and compact checkpoints, e.g. "out/c80 out/c80-compact"
  read -r -a models <<< "smollm2-135m ${GENERATION_MODELS:-}"
  labels=()
  for model in "${models[@]}"; do labels+=("$(basename "$model")-cuda"); done
  timeout 600 python3 -m bench.timing.generation_speed "${models[@]}" --label "${labels[@]}" --device cuda \
    > "$OUT/generation.log" 2>&1
  echo "generation rc=$?"; tail -4 "$OUT/generation.log"
fi
