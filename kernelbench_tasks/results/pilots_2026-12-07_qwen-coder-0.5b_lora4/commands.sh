#!/usr/bin/env bash
# pilots.sh MIN: LoRA SFT of both models (the replication's templated warm start), the lint GPU test beside it,
# then four pilot runs side by side from the committed seed pool until MIN minutes after this script's start.
export PYTHONPATH=/tmp/site KZ_CACHE_DIR=/tmp/kzcache
cd /tmp/kz/repo
R=/tmp/kz/runs; mkdir -p $R
log() { echo "$(date +%T) $*" >> $R/stages.log; }
MIN=$1; T0=$SECONDS
POOL=kernelbench_tasks/results/replication_2026-12-07_qwen-coder-0.5b/seed/seed_pool.json
COMMON="--backend triton --coder-model qwen-coder-0.5b --proposer-model qwen-coder-0.5b --lora-rank 4 --sft-lr 2e-4
  --proposer-lr 2e-5 --apis-per-set 1 --no-sft-merged --sft --sft-data kernelbench_tasks/sft_data/triton_2000.jsonl.gz
  --sft-dir $R/sft"
log "sft start"
(python -m pytest -q -m gpu -k lint test_kernelzero.py > $R/gputest_lint.log 2>&1; log "lint gpu tests exit $?") &
python kernelzero.py $COMMON --rounds 0 --seed-pool 0 --eval-every 0 --run-dir $R/sft_run > $R/sft.log 2>&1
log "sft exit $?"
wait
left=$(python -c "print(max($MIN - ($SECONDS - $T0) / 60, 0.5))")
log "pilots start, $left min"
pilot() {
  local name=$1; shift
  python kernelzero.py $COMMON --seed-from $POOL --rounds 40 --eval-every 0 --no-eval-last --time-limit $left \
    --gpu-workers 2 --gradient-checkpointing --micro-batch 2 --lr 2e-5 --temperature 0.7 --group-size 8 \
    --modules-per-round 8 "$@" --run-dir $R/$name > $R/$name.log 2>&1
  log "pilot $name exit $?"
}
pilot base &
pilot lr1e-4 --lr 1e-4 &
pilot temp1.0 --temperature 1.0 &
pilot group16 --group-size 16 --modules-per-round 4 &
wait
log "all done"
echo done > /tmp/kz/done
