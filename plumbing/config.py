"""
The trainer's command line: a flag per kernelzero.Config field, with one-line errors (and a close match for a
mistyped flag), the choices and ranges of each field, and the checks that run before any work starts
(config_problem), so that a wrong flag never costs an SFT data generation or a model load first.

kernelzero.parse_config calls `parse` with its Config, presets and CPU fallback; this module never imports
kernelzero.
"""

import argparse
import dataclasses
import difflib
import json
import os
import re

import torch

from plumbing.evaluation import load_tasks
from plumbing.models import ATTENTIONS, model_problem
from plumbing.report import UsageError


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


CHOICES = {"device": lambda: ("auto", "cuda", "cpu"),
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


def parse_levels(text):
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return None


def config_problem(cfg, roles=("coder", "proposer"), presets=None):
    """Why this Config cannot run, in one line (None when it can): checked before any work starts, so that a wrong
    flag never costs an SFT data generation or a model load first. `roles`: the models the command loads; `presets`:
    the preset names (kernelzero.PRESETS), when cfg.preset is to be checked too."""
    if presets is not None and cfg.preset not in presets:
        return f"--preset {cfg.preset!r}: choose from {', '.join(presets)}"
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
    levels, ends = parse_levels(cfg.eval_levels), parse_levels(cfg.eval_ends_levels)
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


def parse(argv, config_class, presets, cpu_fallback, roles):
    """kernelzero.parse_config's work: config_class (kernelzero.Config) from argv, with the presets and the CPU
    fallback of kernelzero.py; UsageError on a wrong flag or value."""
    # allow_abbrev=False: `--round 3` must not silently become `--rounds 3`
    parser = _Parser(description="KernelZero trainer", argument_default=argparse.SUPPRESS, allow_abbrev=False)
    for f in dataclasses.fields(config_class):
        flag = "--" + f.name.replace("_", "-")
        if _field_type(f) is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(flag, type=_field_type(f))
    given = vars(parser.parse_args(argv))  # only the flags actually passed (SUPPRESS drops the rest)
    preset = given.get("preset", "default")
    if preset not in presets:
        raise UsageError(f"--preset {preset!r}: choose from {', '.join(presets)}")
    values, fell_back = dict(presets[preset]), False
    run_dir = given.get("run_dir", values.get("run_dir", config_class.run_dir))
    if given.get("resume") and os.path.exists(os.path.join(run_dir, "config.json")):
        with open(os.path.join(run_dir, "config.json")) as f:
            values = json.load(f)  # the run's own config, so that it continues exactly
        values.pop("time_limit", None)   # (but the time limit is this process's, not the run's: given or none)
    elif preset == "default" and given.get("device", "auto") != "cuda" and not torch.cuda.is_available():
        values.update(cpu_fallback)
        fell_back = True
    values.update(given)
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(config_class)})
    if unknown:
        raise UsageError(f"{os.path.join(run_dir, 'config.json')} has settings this version does not know: {unknown}")
    cfg = config_class(**values)
    why = config_problem(cfg, roles, presets)
    if why:
        raise UsageError(why)
    if fell_back:
        print("No GPU found: falling back to the Triton backend under the interpreter with small budgets "
              "(see CPU_FALLBACK in kernelzero.py). Pass flags to override.")
    return cfg
