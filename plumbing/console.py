"""
What a run prints and logs: the line each round prints (with what each phase's update did, or why it trained
nothing), the phase timers and what the harness's workers spent their time on, metrics.jsonl, and the summary at
the end. Nothing here trains or samples.

How this departs from common practice: the console says what each phase's update did or why it trained nothing
("coder: skipped, all 4 groups zero-std (0/32 correct; ...)"): with a weak model most updates are skipped, and a
silent skip looks like training.

Use (from kernelzero.py):
    print(console_line(rec, cfg))   # rec: one round's metrics
    with timed(times, "coder_gen"): ...
"""

import contextlib
import json
import time
from collections import Counter

import torch
from tqdm import tqdm

from plumbing.distributed import rank

# -----------------------------------------------------------------------------
# Timers, progress bars and the harness's time


@contextlib.contextmanager
def timed(times, key):
    """`with timed(times, "coder_gen"):` adds the block's wall time in seconds to times["coder_gen"]."""
    t0 = time.perf_counter()
    yield
    times[key] = times.get(key, 0.0) + time.perf_counter() - t0


def progress(items, desc, show=True):
    """items under a progress bar (rank 0, when show: where a step takes seconds, the CPU), else as they are."""
    return tqdm(items, desc=desc, leave=False, disable=rank() > 0 or not show)


def token_ticks(bar):
    """generate's stopping criteria that never stop: they move a progress bar one token per decode step."""
    from transformers import StoppingCriteria, StoppingCriteriaList   # (imported where used: the CLI starts without)

    class Ticks(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            bar.update(1)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    return StoppingCriteriaList([Ticks()])


def harness_seconds(results):
    """Per-candidate harness seconds summed over a batch, by phase (startup = waiting for a started worker,
    reference, compile, run) plus gpu_wait (waiting for a GPU turn) and mem_wait (waiting for memory admission: large
    tasks, such as official KernelBench's, run fewer at once). Candidates overlap, so the sum exceeds the wall time; it
    says what a batch's verification spends its worker slots on."""
    total = Counter()
    for r in results:
        total.update(r.details.get("phase_s") or {})
        total["gpu_wait"] += r.details.get("gpu_wait_s") or 0.0
        total["mem_wait"] += r.details.get("mem_wait_s") or 0.0
    return {k: round(v, 2) for k, v in total.items()} if any(total.values()) else {}


def gpu_peak_mb(details: dict) -> int | None:
    """A candidate's peak allocated GPU MiB: the largest over its stages (details["gpu_mb"], [peak, reserved] per
    stage); None without a GPU stage. Against details["mem_need_mb"][1] (the admission's estimate) it says how much
    the estimate over-asks."""
    stages = details.get("gpu_mb") or {}
    return max((peak for peak, _ in stages.values()), default=None)


def graph_timed_frac(results):
    """Of the timed correct kernels, the share timed as CUDA graph replays (the rest were timed eagerly, with host
    latency inside the window: a noisier speedup; a CUDA kernel launched on the legacy default stream is one); None
    when none was timed (the CPU)."""
    methods = [r.details.get("timing_method") for r in results if r.correct and r.speedup is not None]
    return sum(m == "graph" for m in methods) / len(methods) if methods else None


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
                     "and a handful of kernels are far too little (docs/results.md, \"The small replication\": a GPU run).")
    return "\n".join(lines)
