#!/usr/bin/env bash
# replicate.sh: the replication end to end on one GPU, each stage a plain kernelzero.py command (docs/results.md,
# "The replication"): three candidate starting points judged by held-out pass@1, the method and its two ablations from
# the chosen one side by side, the held-out comparison with bootstrap intervals, and one figure.
#
# How it departs from the paper's protocol (whose details are not public):
#   1. The starting point is chosen by measurement: the base model, SFT on our templated corpus, and SFT on a
#      self-distilled corpus (the base model's own harness-verified answers on synthetic modules; STaR/RFT); the one
#      with the highest held-out level-1 pass@1 wins (ties: the earlier, i.e. the simpler, one).
#   2. The three runs share the GPU; the harness's machine-wide gate times every kernel alone. With GPUS=N (N > 1)
#      every training and eval stage runs under torchrun on N GPUs, and the three runs side by side on GPUs 0..N-1,
#      N..2N-1 and 2N..3N-1 (a node with 3N GPUs).
#
# Run (every knob is an environment variable; stages whose results exist are skipped, so a cut run resumes):
#   bash replicate.sh                                         # Qwen2.5-Coder-0.5B, 50 rounds, 8 samples per task
#   MODEL=qwen-coder-1.5b OUT=runs/replication_1.5b bash replicate.sh
#   GPUS=2 bash replicate.sh                                  # one 8-GPU node: each stage on 2 GPUs (torchrun)
#   EXTRA="--lora-rank 8 --lr 1e-5 --proposer-lr 1e-5 --sft-lr 2e-4" bash replicate.sh
#                                                             # LoRA adapters (docs/training.md, "LoRA"): checkpoints of tens
#                                                             # of MB, so a cut run resumes on another machine
#   MINUTES=25 STARTS=templates EXTRA="--lora-rank 4 ..." bash replicate.sh
#                                                             # one time-limited session's share (docs/training.md, "Running on
#                                                             # a time-limited GPU"): the runs stop before a round
#                                                             # that would not fit; run it again (elsewhere: with the
#                                                             # $OUT folder, less *.safetensors) to go on
#   MODEL=tiny ROUNDS=2 SAMPLES=2 PAIRS=4 EXTRA="--preset tiny --device cpu --eval-max-tasks 2" bash replicate.sh
#                                                             # (a smoke run on a CPU: a few minutes)
set -euo pipefail
cd "$(dirname "$0")"
MODEL=${MODEL:-qwen-coder-0.5b}   # Coder and Proposer (a plumbing.models.NAMED_MODELS name, an HF id or a path)
OUT=${OUT:-runs/replication}      # everything goes here: runs (with their checkpoints), evals, logs, the figure
RESULTS=${RESULTS:-kernelbench_tasks/results/replication_$(date +%F)_$MODEL}   # the small files, for the repository
ROUNDS=${ROUNDS:-50}              # Coder updates per run (one per round)
SAMPLES=${SAMPLES:-8}             # held-out kernels per task at the start and the end, levels 1 and 2 (pass@k, k <= it)
EVAL_EVERY=${EVAL_EVERY:-10}      # and every this many rounds a smaller held-out eval: level 1, 4 kernels per task
STARTS=${STARTS:-base templates self}   # the starting points to judge (a subset: the others are not made)
MINUTES=${MINUTES:-0}             # this invocation's time (0: none); the runs get what is left as --time-limit
PAIRS=${PAIRS:-256}               # synthetic modules the base model answers for the self-distilled corpus
EXTRA=${EXTRA:-}                  # more kernelzero.py flags for every stage (e.g. --lr 2e-6 --group-size 8)
GPUS=${GPUS:-1}                   # GPUs per stage: above 1, torchrun on that many (docs/training.md, "One GPU node: torchrun")
WORKERS=${WORKERS:-8}             # candidates the harness checks at once per GPU, shared out between the stages that
                                  # run side by side on one GPU (each slot keeps ~3 processes with a CUDA context)
common="--backend triton --coder-model $MODEL --proposer-model $MODEL --eval-levels 1 --eval-samples 4 \
  --eval-ends-levels 1,2 --eval-ends-samples $SAMPLES $EXTRA"
t0=$SECONDS
mkdir -p "$OUT"
log() { echo "$(date +%T) $*" | tee -a "$OUT/stages.log"; }
kz() {   # kz FIRST_GPU ARGS...: kernelzero.py ARGS, under torchrun on GPUS GPUs from FIRST_GPU when GPUS > 1
  local first=$1; shift
  if [ "$GPUS" -gt 1 ]; then
    CUDA_VISIBLE_DEVICES=$(seq -s, "$first" $((first + GPUS - 1))) \
      python -m torch.distributed.run --standalone --nproc_per_node "$GPUS" kernelzero.py "$@"
  else
    python kernelzero.py "$@"
  fi
}

# ---------------------------------------------------------------------------------------------------------------
# 1. Starting points: each is a run of 0 rounds whose "round -1" eval is its held-out score

start() {   # start NAME FLAGS...: the held-out eval of one starting point (its SFT, if any, first)
  local name=$1; shift
  [[ " $STARTS " == *" $name "* ]] || return 0
  if [ ! -f "$OUT/start_$name/eval_round-1.json" ]; then
    log "start $name"
    rm -rf "$OUT/start_$name"
    kz 0 --rounds 0 --eval-first --seed-pool 0 $common "$@" --run-dir "$OUT/start_$name" > "$OUT/start_$name.log" 2>&1
  fi
}
from_flags() {   # from_flags NAME: the flags that start a stage from starting point NAME
  case $1 in
    base) echo "--no-sft" ;;
    templates) echo "--sft --sft-dir $OUT/sft_templates" ;;
    self) echo "--sft --sft-dir $OUT/sft_self" ;;
  esac
}
# The Coder's starting pool, probed once from the chosen start (seed_pool.json): the three runs take it as it is
seed_stage() {
  if [ ! -f "$OUT/seed/done" ]; then
    log "starting pool: probing its candidates with the chosen start's Coder"
    rm -rf "$OUT/seed"
    kz 0 --rounds 0 $common $(from_flags "$1") "${@:2}" --run-dir "$OUT/seed" > "$OUT/seed.log" 2>&1
    touch "$OUT/seed/done"
  fi
}
# One starting point judged is the chosen one already: when it is made (the base model, or an SFT that exists), its
# pool is probed beside its eval, which shares the GPU (the harness's gate still times every kernel alone)
early="" halves=""
only=$(echo $STARTS)
made=""   # (is the one start made: the base model, or an SFT that exists)
[ "$only" = base ] || [[ "$only" =~ ^(templates|self)$ && -d "$OUT/sft_$only/proposer" ]] && made=1
if [ ! -f "$OUT/seed/done" ] && [ -n "$made" ]; then
  [ "$GPUS" = 1 ] && halves="--gpu-workers $(((WORKERS + 1) / 2))"
  seed_stage "$only" $halves &
  early=$!
fi
start base --no-sft $halves
start templates $halves --sft --sft-data kernelbench_tasks/sft_data/triton_2000.jsonl.gz --sft-dir "$OUT/sft_templates"
if [[ " $STARTS " == *" self "* ]] && [ ! -f "$OUT/distill/pairs.jsonl" ]; then
  log "distill"
  kz 0 distill $common --sft-pairs "$PAIRS" --samples 8 --run-dir "$OUT/distill" > "$OUT/distill.log" 2>&1
fi
if [ -s "$OUT/distill/pairs.jsonl" ]; then
  start self $halves --sft --sft-data "$OUT/distill/pairs.jsonl" --sft-dir "$OUT/sft_self"
elif [[ " $STARTS " == *" self "* ]]; then
  log "distill kept no verified kernel: no self-distilled starting point"
fi
starts=""
for name in base templates self; do
  [ -f "$OUT/start_$name/eval_round-1.json" ] && starts="$starts $OUT/start_$name/eval_round-1.json"
done
python kernelzero.py compare $starts > "$OUT/starts.txt"
read -r chosen scores < <(python - $starts <<'EOF'
import json, sys
scores = {}
for path in sys.argv[1:]:   # level-1 pass@1 per starting point, in the order base, templates, self
    tasks = json.load(open(path))["level1"]
    scores[path.split("/start_")[-1].split("/")[0]] = sum(t["correct"] / t["n"] for t in tasks.values()) / len(tasks)
best = max(scores, key=scores.get)   # (max keeps the first of equal scores: the simpler start)
print(best, ", ".join(f"{name} {score:.3f}" for name, score in scores.items()))
EOF
)
log "chosen starting point: $chosen (level-1 pass@1: $scores; all numbers in $OUT/starts.txt)"
from=$(from_flags "$chosen")
if [ -n "$early" ]; then wait "$early"; else seed_stage "$chosen"; fi
seed=""   # (an unprobed pool, --seed-probe 0, writes no file: each run then takes its own candidates unprobed)
[ -f "$OUT/seed/seed_pool.json" ] && seed="--seed-from $OUT/seed/seed_pool.json"

# ---------------------------------------------------------------------------------------------------------------
# 2. The method and its two ablations, side by side, from the chosen start; resumable (--resume)

run() {   # run NAME FIRST_GPU FLAGS...
  local name=$1 first=$2; shift 2
  local resume="" limit=""
  [ -e "$OUT/$name/latest" ] && resume="--resume"
  # (what is left of MINUTES; a little at least: a run out of time still stops cleanly, with a checkpoint)
  [ "$MINUTES" != 0 ] && limit="--time-limit $(python -c "print(max($MINUTES - $((SECONDS - t0)) / 60, 0.001))")"
  kz "$first" --rounds "$ROUNDS" --eval-every "$EVAL_EVERY" --eval-last "$@" $common $from $seed $resume $limit \
    --run-dir "$OUT/$name" >> "$OUT/$name.log" 2>&1
}
rounds_done() {   # rounds_done NAME: the round its checkpoint holds
  local latest; latest=$(cat "$OUT/$1/latest" 2>/dev/null || echo ckpt_0)
  echo $((10#${latest#ckpt_}))
}
log "runs: main, correctness, uniform ($ROUNDS rounds each)"
# On one GPU the three runs share it and its harness workers. Each run's update alone peaks at ~38 GB for the 0.5B
# (micro-batches of 8 sequences of ~2k tokens, activations kept for backward), and three such peaks ran an 80 GB
# H100 out of memory; gradient checkpointing and micro-batches of 2 cut the peak, not the maths (the update is
# well under a second of a round either way). Flags in EXTRA come later and win.
thirds=""
[ "$GPUS" = 1 ] && thirds="--gpu-workers $(((WORKERS + 2) / 3)) --gradient-checkpointing --micro-batch 2"
run main 0 $thirds & main_pid=$!
run correctness "$GPUS" $thirds --coder-reward correctness & correctness_pid=$!
run uniform $((2 * GPUS)) $thirds --proposer-mode uniform & uniform_pid=$!
failed=""
for name in main correctness uniform; do   # (a run that died is named, not taken for one stopped by the time limit)
  pid=${name}_pid status=0
  wait "${!pid}" || status=$?
  if [ "$status" != 0 ]; then
    failed="$failed $name"
    log "run $name failed (exit $status); the end of $OUT/$name.log:"
    tail -5 "$OUT/$name.log" | tee -a "$OUT/stages.log"
  fi
done
[ -z "$failed" ] || exit 1
for name in main correctness uniform; do
  if [ "$(rounds_done $name)" -lt "$ROUNDS" ]; then
    log "stopped at the time limit: main $(rounds_done main), correctness $(rounds_done correctness), uniform" \
      "$(rounds_done uniform) of $ROUNDS rounds; run this script again to go on"
    exit 0
  fi
done
log "runs done"

# ---------------------------------------------------------------------------------------------------------------
# 3. Held-out comparison (pass@1 with 95% bootstrap intervals, paired differences) and the learning curves

last=$((ROUNDS - 1))
python kernelzero.py compare "$OUT/start_$chosen/eval_round-1.json" "$OUT/main/eval_round$last.json" \
  "$OUT/correctness/eval_round$last.json" "$OUT/uniform/eval_round$last.json" | tee "$OUT/compare.txt"
# (the chosen start's run of 0 rounds draws its held-out eval as one point at round -1)
python kernelzero.py plot "$OUT/start_$chosen" "$OUT/main" "$OUT/correctness" "$OUT/uniform" > /dev/null
mkdir -p "$RESULTS"   # metrics, evals, configs, the comparison and the figure; no checkpoints
(cd "$OUT" && find . -maxdepth 2 \( -name metrics.jsonl -o -name 'eval_round*.json' -o -name config.json \
  -o -name stats.json -o -name seed_pool.json -o -name '*.txt' -o -name '*.png' -o -name stages.log \) -print0 | \
  while IFS= read -r -d '' f; do mkdir -p "$RESULTS/$(dirname "$f")"; cp "$f" "$RESULTS/$f"; done)
log "done: $OUT/compare.txt, $OUT/compare.png; copied to $RESULTS"
