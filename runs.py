"""
A run's files and its console: checkpoints, the trained models in Hugging Face format, metrics.jsonl, and the line
each round prints. Nothing here trains or samples; kernelzero.py's loop calls it.

How this departs from common practice:
1. Checkpoints are whole state dicts (torch.distributed.checkpoint's state_dict API with full_state_dict=True),
   written by rank 0: the same files from any number of ranks, so a run resumes on any world size (sharded DCP
   checkpoints would write faster for a 7B model; whole ones keep one format for every world size and for `eval`).
   With LoRA a checkpoint holds the adapters and their AdamW state alone (tens of MB for a 0.5B model), and the
   saved Hugging Face model is merged, with the adapter beside it (adapter.pt).
2. Every file is written atomically (a temp name, then a rename; for checkpoints the `latest` pointer is the commit
   point), so a run killed at any moment leaves the previous checkpoint intact and nothing half-written to trust.
3. The console says what each phase's update did or why it trained nothing ("coder: skipped, all 4 groups
   zero-std (0/32 correct; ...)"): with a weak model most updates are skipped, and a silent skip looks like training.

Use (from kernelzero.py; `state` is the loop's dict: round, pool, API statistics, the python RNG):
    save_checkpoint(run_dir, coder, proposer, state); state = load_checkpoint(run_dir, coder, proposer)
    print(console_line(rec, cfg))   # rec: one round's metrics
"""

import glob
import gzip
import json
import os
import random
import shutil

import torch
import torch.distributed as dist

from sampling import adapters, barrier, check_keys, merged_state_dict, rank, refresh_sampler, trained_names

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
        # (sampling.phase_seed), and torch's generators are kept too for whatever else draws from them
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
    """The latest checkpoint into both policies (each rank reads the whole file and keeps its shard); the loop's
    state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict
    whole = StateDictOptions(full_state_dict=True, strict=False)   # (check_keys is strict, with a clear message)
    with open(os.path.join(run_dir, "latest")) as f:
        path = os.path.join(run_dir, f.read().strip())
    for role, pol in (("coder", coder), ("proposer", proposer)):
        ckpt = torch.load(os.path.join(path, f"{role}.pt"), map_location="cpu")
        check_keys(ckpt["model"], pol.model, f"the {role} weights in {path}")
        set_model_state_dict(pol.model, ckpt["model"], options=whole)
        set_optimizer_state_dict(pol.model, pol.opt, ckpt["opt"], options=whole)
        refresh_sampler(pol)
    state = torch.load(os.path.join(path, "state.pt"), weights_only=False)  # our own file: python RNG state, pool
    state["rng"] = random.Random()
    state["rng"].setstate(state.pop("rng_state"))
    torch.set_rng_state(state.pop("torch_rng", torch.get_rng_state()))   # (checkpoints before these were kept)
    cuda_rng = state.pop("cuda_rng", [])
    if torch.cuda.is_available() and len(cuda_rng) == torch.cuda.device_count():   # (another machine: left as is)
        torch.cuda.set_rng_state_all(cuda_rng)
    return state


# -----------------------------------------------------------------------------
# Console and metrics


def _counts(counter):
    return ", ".join(f"{n} {k}" for k, n in sorted(counter.items(), key=lambda kv: -kv[1]))


def update_note(rec, role, cfg):
    """What one phase's update did, in a few words: on how many GRPO groups, or why it trained nothing, with what the
    samples scored ("coder: skipped, all 2 groups zero-std (0/8 correct; 8 format)")."""
    if role == "coder":
        errors = rec.get("coder/errors") or {}
        n, size = sum(errors.values()), cfg.group_size
        if not n:
            return "coder: skipped, the pool is empty"
        outcome = f"{errors.get('ok', 0)}/{n} correct" + (f"; {_counts({k: v for k, v in errors.items() if k != 'ok'})}"
                                                          if n > errors.get("ok", 0) else "")
    else:
        n, size = cfg.api_sets_per_round * cfg.group_size_proposer, cfg.group_size_proposer
        valid = round(rec.get("proposer/valid_frac", 0.0) * n)
        outcome = f"{valid}/{n} valid" + (f"; {_counts(rec.get('proposer/invalid') or {})}" if valid < n else "")
        if rec.get("proposer/unique_valid"):
            outcome += f"; probe pass rate {rec['proposer/p_mean']:.2f}"
    groups = n // size
    flat = round(rec.get(f"{role}/frac_reward_zero_std", 0.0) * groups)
    if f"{role}/loss" not in rec:
        return f"{role}: skipped, all {groups} groups zero-std ({outcome})"
    used = groups - flat if cfg.filter_zero_std else groups
    skipped = " (step skipped: non-finite gradient)" if rec.get(f"{role}/skipped_steps") else ""
    return f"{role}: updated on {used} of {groups} groups ({outcome}){skipped}"


def console_line(rec, cfg=None):
    """The round's line; with cfg, a line per phase saying what its update did or why it trained nothing."""
    def f(key, fmt):
        v = rec.get(key)
        return format(v, fmt) if isinstance(v, (int, float)) else "-"
    kl = f" kl {f('coder/kl', '.4f')}" if cfg is None or cfg.kl_coef > 0 else ""   # 0 by configuration otherwise
    speed = f" speedup {f('coder/speedup', '.2f')}" if "coder/speedup" in rec and rec["coder/speedup"] is not None \
        or cfg is None or cfg.device != "cpu" else ""   # the CPU interpreter does not time kernels
    gpu = f" gpu {f('gpu_peak_gb', '.1f')}GB" if "gpu_peak_gb" in rec else ""
    line = (f"round {rec['round']:3d} | proposer valid {f('proposer/valid_frac', '.2f')} p {f('proposer/p_mean', '.2f')}"
            f" reward {f('proposer/reward_mean', '+.2f')} +{rec.get('proposer/added', 0)} pool {rec['pool_size']}"
            f" | coder pass {f('coder/pass_rate', '.3f')}{speed}"
            f" reward {f('coder/reward_mean', '.3f')} zero-std {f('coder/frac_reward_zero_std', '.2f')}"
            f" loss {f('coder/loss', '+.4f')}{kl} clip {f('coder/clip_frac', '.3f')}"
            f" | {f('time/round', '.0f')}s{gpu}")
    if cfg is not None:
        line += "".join("\n  " + update_note(rec, role, cfg) for role in ("proposer", "coder"))
    return line


def append_metrics(metrics_path, state, rec):
    """One JSON line per record (rank 0 writes); state["metrics_lines"] counts them so that a resume drops lines
    written after the checkpoint it restarts from."""
    if rank() == 0:
        with open(metrics_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
    state["metrics_lines"] += 1


ROUND_LEGEND = """\
How to read the round line (printed once):
  proposer valid  share of the Proposer's modules that passed validation (code block, APIs used, new, linted)
           p      the Coder's mean pass rate on its probes of the valid modules ("-": no valid module to probe)
           reward the Proposer's mean reward (-1 to -0.5 for an invalid module; 1 - 2|p - 1/2| for a valid one)
           +N     modules that joined the Coder's training pool this round; pool: the pool's size
  coder    pass   share of the Coder's kernels the harness found correct
           reward mean CA-GRPO reward; zero-std: share of groups whose rewards were all equal (no gradient: dropped)
           loss   the update's loss ("-": no update ran); clip: share of clipped probability ratios
  the last field  the round's wall time. "-" always means: not measured this round"""

# what each timer of a round measured (kernelzero.py's `times`), in the order the round runs
PHASE_NAMES = {"proposer_gen": "Proposer writes modules", "validate": "lint them",
               "probe_gen": "Coder writes probe kernels", "probe_eval": "then waits for the harness",
               "proposer_update": "Proposer update", "coder_gen": "Coder writes kernels",
               "coder_eval": "then waits for the harness", "coder_update": "Coder update",
               "eval": "held-out eval", "eval_ends": "held-out eval"}


def phases_line(times, rec):
    """The round's timers by what they measured. A phase's kernels are checked while the rest of it still generates,
    so "waits for the harness" is only what is left after generation; the harness's own work is the worker time."""
    parts = [f"{PHASE_NAMES.get(k, k)} {v:.1f}s" for k, v in times.items()]
    for role, what in (("proposer/probe_harness_s", "probe"), ("coder/harness_s", "coder")):
        busy = sum((rec.get(role) or {}).values())
        if busy:
            parts.append(f"harness workers busy {busy:.1f}s on the {what} kernels (overlapping generation)")
    return "  time: " + ", ".join(parts)


def run_summary(records, sft, cfg, device_type):
    """What a finished run did, in plain words: what trained, what changed, and (on the CPU) what the run shows.
    records: the rounds' metrics; sft: the SFT losses (sft_losses.json) or None when no SFT ran or was reused."""
    lines = ["Summary:"]
    if sft:
        for role in ("coder", "proposer"):
            ls = sft.get(role) or []
            if ls:
                tail = ls[-min(3, len(ls)):]
                lines.append(f"  SFT trained the {role.capitalize()}: {len(ls)} steps of {sft.get('batch', '?')}, "
                             f"loss {ls[0]:.3f} -> {sum(tail) / len(tail):.3f}")
    elif cfg.sft:
        lines.append("  SFT: none recorded for this run")
    rounds = [r for r in records if r.get("round", -1) >= 0]
    changed = False
    for role in ("proposer", "coder"):
        # a step moves the weights only when some group had reward spread (equal rewards: every advantage is 0)
        moved = [r for r in rounds if f"{role}/loss" in r and not r.get(f"{role}/skipped_steps")
                 and r.get(f"{role}/frac_reward_zero_std", 0.0) < 1.0]
        flat = [r for r in rounds if r.get(f"{role}/frac_reward_zero_std") == 1.0]
        changed |= bool(moved)
        why = (f"; in {len(flat)} every group had equal rewards (zero reward spread: no gradient, the update was "
               f"skipped or moved nothing)" if flat else "")
        lines.append(f"  RL: the {role.capitalize()} was updated with a gradient in {len(moved)} of {len(rounds)} "
                     f"round(s){why}")
    if rounds and not changed:
        lines.append("  So RL changed nothing: the final models are the SFT warm start" if cfg.sft else
                     "  So RL changed nothing: the final models are the models the run started from")
    if rounds:
        n = sum(sum((r.get("coder/errors") or {}).values()) for r in rounds)
        ok = sum((r.get("coder/errors") or {}).get("ok", 0) for r in rounds)
        lines.append(f"  The Coder wrote {ok} correct kernel(s) of {n} in its phase")
    if device_type == "cpu":
        lines.append("  This CPU run shows that every stage runs on your machine: SFT, proposing, linting, probing, "
                     "writing kernels, checking them under the Triton interpreter, the CA-GRPO update path, "
                     "checkpoints. It does not show that the method improves a Coder: a 135M model, a few steps "
                     "and a handful of kernels are far too little (README, \"The small replication\": a GPU run).")
    return "\n".join(lines)
