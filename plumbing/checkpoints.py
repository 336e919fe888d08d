"""
A run's files: checkpoints, the trained models in Hugging Face format, JSON and JSON-lines files. Nothing here trains
or samples; kernelzero.py's loop calls it.

How this departs from common practice:
1. Checkpoints are whole state dicts (torch.distributed.checkpoint's state_dict API with full_state_dict=True),
   written by rank 0: the same files from any number of ranks, so a run resumes on any world size (sharded DCP
   checkpoints would write faster for a 7B model; whole ones keep one format for every world size and for `eval`).
   With LoRA a checkpoint holds the adapters and their AdamW state alone (tens of MB for a 0.5B model), and the
   saved Hugging Face model is merged, with the adapter beside it (adapter.pt).
2. Every file is written atomically (a temp name, then a rename; for checkpoints the `latest` pointer is the commit
   point), so a run killed at any moment leaves the previous checkpoint intact and nothing half-written to trust.

Use (from kernelzero.py; `state` is the loop's dict: round, pool, API statistics, the python RNG):
    save_checkpoint(run_dir, coder, proposer, state); state = load_checkpoint(run_dir, coder, proposer)
"""

import glob
import gzip
import json
import os
import random
import shutil

import torch
import torch.distributed as dist

from plumbing.distributed import barrier, rank
from plumbing.lora import adapters, check_keys, merged_state_dict, trained_names
from plumbing.policy import refresh_sampler

# -----------------------------------------------------------------------------
# Files: models, state dicts, JSON lines


def plain_model(model):
    """A fresh model of the same architecture and config, without adapters, in fp32 on the CPU (its weights random
    until loaded)."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)


def save_pretrained_atomic(policy, path, merged=True):
    """The trained model in Hugging Face format (for `eval --coder-model PATH`), whole, written by rank 0. With LoRA
    the adapters are merged into the weights, and path/adapter.pt keeps them alone (a run with --sft and --lora-rank
    goes on training them); merged=False writes adapter.pt alone (a few MB instead of the whole model)."""
    lora = adapters(policy.model)
    weights = full_state(policy)[0] if dist.is_initialized() else policy.model.state_dict()   # (FSDP2: all ranks)
    if rank() == 0:
        tmp = path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        if lora:
            m = next(iter(lora.values()))
            os.makedirs(tmp)
            if merged:
                plain = plain_model(policy.model)
                plain.load_state_dict(merged_state_dict(weights, m.scale))
                plain.save_pretrained(tmp)
            torch.save({"base": policy.source, "lora_rank": m.rank, "lora_alpha": m.alpha,
                        "state": {k: weights[k].detach().cpu() for k in trained_names(policy.model)}},
                       os.path.join(tmp, "adapter.pt"))
        else:
            policy.model.save_pretrained(tmp, state_dict=weights)
        policy.tok.save_pretrained(tmp)
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    barrier()


def full_state(policy, trained_only=False):
    """(model, AdamW) state dicts, whole, on the CPU, keyed by parameter name (torch.distributed.checkpoint's
    state_dict API): the same files from any number of ranks, so a run resumes on any world size. trained_only
    leaves the frozen weights out (with LoRA: all but the adapters). Under torchrun rank 0 gets them (the others an
    empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    whole = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trained_only)
    model = get_model_state_dict(policy.model, options=whole)
    if trained_only:   # (the API keeps a frozen tied lm_head.weight: it only knows parameters by their first name)
        trained = set(trained_names(policy.model))
        model = {k: v for k, v in model.items() if k in trained}
    return model, get_optimizer_state_dict(policy.model, policy.opt, options=whole)


SFT_LOSSES = "sft_losses.json"   # in the SFT folder and the run folder: {"coder": [per step], "proposer": [...], ...}


def write_json_atomic(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f)
    os.replace(path + ".tmp", path)


def write_jsonl(path, rows):
    """One JSON object per line, to path (gzip-compressed when it ends in .gz), atomically."""
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    with (gzip.open if path.endswith(".gz") else open)(path + ".tmp", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    os.replace(path + ".tmp", path)


# -----------------------------------------------------------------------------
# Checkpoints


def save_checkpoint(run_dir, coder, proposer, state):
    """Write RUN_DIR/ckpt_NNNNN atomically (temp dir + rename, then the `latest` pointer) and drop older ones. The
    state dicts are whole (full_state) and rank 0 writes them: a run resumes on any number of ranks. Returns the
    checkpoint's size in bytes (0 on the other ranks)."""
    name = f"ckpt_{state['round']:05d}"
    # (all ranks gather; with LoRA the frozen base is not saved: a checkpoint is the adapters and their AdamW state)
    weights = {role: full_state(pol, trained_only=True) for role, pol in (("coder", coder), ("proposer", proposer))}
    if rank() == 0:
        tmp, final = os.path.join(run_dir, name + ".tmp"), os.path.join(run_dir, name)
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        for role, (model, opt) in weights.items():
            torch.save({"model": model, "opt": opt}, os.path.join(tmp, f"{role}.pt"))
        # the python RNG draws API sets and pool modules (the same on every rank); sampling has its own seeds
        # (distributed.phase_seed), and torch's generators are kept too for whatever else draws from them
        saved = {k: v for k, v in state.items() if k != "rng"}
        torch.save({**saved, "rng_state": state["rng"].getstate(), "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
                   os.path.join(tmp, "state.pt"))
        size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(tmp, "*")))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        with open(os.path.join(run_dir, "latest.tmp"), "w") as f:
            f.write(name)
        os.replace(os.path.join(run_dir, "latest.tmp"), os.path.join(run_dir, "latest"))  # the commit point
        for old in glob.glob(os.path.join(run_dir, "ckpt_*")):
            if os.path.basename(old) != name:
                shutil.rmtree(old, ignore_errors=True)
    barrier()
    return size if rank() == 0 else 0


def load_checkpoint(run_dir, coder, proposer):
    """The latest checkpoint into both policies (each rank reads the whole file and keeps its shard; the policies keep
    the learning rates they were made with); the loop's state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict
    whole = StateDictOptions(full_state_dict=True, strict=False)   # (check_keys is strict, with a clear message)
    with open(os.path.join(run_dir, "latest")) as f:
        path = os.path.join(run_dir, f.read().strip())
    for role, pol in (("coder", coder), ("proposer", proposer)):
        ckpt = torch.load(os.path.join(path, f"{role}.pt"), map_location="cpu")
        check_keys(ckpt["model"], pol.model, f"the {role} weights in {path}")
        set_model_state_dict(pol.model, ckpt["model"], options=whole)
        lrs = [group["lr"] for group in pol.opt.param_groups]
        set_optimizer_state_dict(pol.model, pol.opt, ckpt["opt"], options=whole)
        for group, lr in zip(pol.opt.param_groups, lrs):   # (the learning rate is this run's: a flag given with
            group["lr"] = lr                               # --resume applies, as make_policy set it)
        refresh_sampler(pol)
    state = torch.load(os.path.join(path, "state.pt"), weights_only=False)  # our own file: python RNG state, pool
    state["rng"] = random.Random()
    state["rng"].setstate(state.pop("rng_state"))
    torch.set_rng_state(state.pop("torch_rng", torch.get_rng_state()))   # (checkpoints before these were kept)
    cuda_rng = state.pop("cuda_rng", [])
    if torch.cuda.is_available() and len(cuda_rng) == torch.cuda.device_count():   # (another machine: left as is)
        torch.cuda.set_rng_state_all(cuda_rng)
    return state
