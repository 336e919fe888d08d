"""
Measuring the Coder: the held-out evaluation (pass@k with a bootstrap interval, fast_p, the geometric-mean speedup)
that the loop runs every `eval_every` rounds and the `eval` subcommand runs on one level, and self-distillation (the
`distill` subcommand: an SFT corpus of the Coder's own verified answers).

How this departs from KernelBench's evaluation:
1. Samples are drawn through the trainer's own rollouts (the same prompt, temperature and sampler as training), and
   verified by the same harness, so an eval measures exactly what the loop trains: the caller passes the method's
   kernelzero.coder_attempts in as `attempts` (this package never imports kernelzero).
2. pass@1 comes with a percentile-bootstrap interval over tasks (report.bootstrap_ci): tasks are what a benchmark
   draws. With n samples per task, fast_p counts every sample: the expectation of KernelBench's one-sample fast_p.
3. Each eval writes every sample's verdict, speedup and (truncated) answer, so `kernelzero.py compare` can compute
   intervals and paired differences from the files alone, and bench.py can build harness batches from real answers.
4. Held-out tasks are kernelbench_tasks/level1 and level2 (or an official KernelBench checkout's); the loop never
   trains on them (kernelzero.validate_modules rejects a proposed module that is one of them at any size).

Use (through kernelzero.py's command line, which parses the Config these functions take and passes `attempts`):
    python kernelzero.py eval --coder-model PATH --level 1 --samples 10 [--backend cuda|triton] [--kernelbench-dir D]
    python kernelzero.py distill --sft-pairs 256 --samples 8 --run-dir D   # D/pairs.jsonl for --sft-data
"""

import dataclasses
import glob
import json
import os
from collections import Counter

import torch

from eval_harness import extract_code
from kernelbench_tasks import catalog, synth
from plumbing.checkpoints import write_jsonl
from plumbing.console import gpu_peak_mb, graph_timed_frac, harness_seconds
from plumbing.distributed import harness_device_for, open_evaluator, phase_seed, rank, say, setup_ranks
from plumbing.lora import adapter_header
from plumbing.policy import make_policy
from plumbing.report import bootstrap_ci, fast_p, geomean_speedup, pass_at_k

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository

# -----------------------------------------------------------------------------
# Held-out evaluation


FAST_PS = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)


def load_tasks(level, kernelbench_dir="", max_tasks=0):
    """[(name, source)] of a level: kernelbench_tasks/levelN, or DIR/KernelBench/levelN / DIR/levelN of a checkout."""
    if kernelbench_dir:
        cands = [os.path.join(kernelbench_dir, "KernelBench", f"level{level}"), os.path.join(kernelbench_dir, f"level{level}")]
    else:
        cands = [os.path.join(HERE, "kernelbench_tasks", f"level{level}")]
    folder = next((c for c in cands if os.path.isdir(c)), None)
    if folder is None:
        raise SystemExit(f"no level{level} tasks found in {' or '.join(cands)}")
    files = sorted(glob.glob(os.path.join(folder, "*.py")))
    files = [f for f in files if not os.path.basename(f).startswith("_")][:max_tasks or None]
    return [(os.path.basename(f)[:-3], open(f).read()) for f in files]


ANSWER_CHARS = 4000   # of each answer kept in an eval's JSON (a level's 8 samples per task: ~2 MB)


def evaluate_coder(policy, cfg, ev, level, samples, attempts, kernelbench_dir="", max_tasks=0, seed=None):
    """pass@k (with a bootstrap interval for pass@1), fast_p and the geometric-mean speedup of the Coder on one level.
    attempts: the method's way of asking the Coder for verified kernels (kernelzero.coder_attempts).

    fast_p counts every sample: with one sample per task it is KernelBench's fast_p, with n it is that number's
    expectation over the n draws (every task has n samples, so each task weighs the same)."""
    tasks = load_tasks(level, kernelbench_dir, max_tasks)
    times = {}
    _, results, answers = attempts(ev, policy, [src for _, src in tasks], samples, cfg, times, "eval", seed,
                                   f"eval level{level}")
    per_task = [results[i * samples:(i + 1) * samples] for i in range(len(tasks))]
    n_correct = [sum(r.correct for r in rs) for rs in per_task]
    out = {f"pass@{k}": sum(pass_at_k(samples, c, k) for c in n_correct) / len(tasks)
           for k in (1, 5, 10, samples) if k <= samples}
    out["pass@1_ci"] = list(bootstrap_ci([c / samples for c in n_correct])[1:])
    correct, speedup = [r.correct for r in results], [r.speedup for r in results]
    out.update({f"fast_{p:g}": fast_p(correct, speedup, p) for p in FAST_PS})
    out["geomean_speedup"] = geomean_speedup(correct, speedup)
    out["graph_timed_frac"] = graph_timed_frac(results)   # how many of those speedups came from graph replays
    out["errors"] = dict(Counter(r.error_kind for r in results))
    out["harness_s"] = harness_seconds(results)
    # kernels the harness ran after the rest, task by task (their memory fitted only beside fewer reference servers)
    out["ran_deferred"] = sum(bool(r.details.get("ran_deferred")) for r in results)
    # wall seconds: generation (verification overlaps it) and the verification left after the last generate call
    out["seconds"] = {"generate": round(times["eval_gen"], 1), "verify_after": round(times["eval_eval"], 1)}
    # per task every sample's verdict (so that `compare` can compute intervals from the file alone), its answer
    # (truncated: what the Coder actually writes; bench.py builds harness batches from the failing ones) and the first
    # sample's error; its harness seconds (where a slow level spends its worker slots, task by task) and, on a GPU,
    # every sample's [peak, admitted] MiB (how far memory admission's estimate is from what the kernels took)
    out["tasks"] = {name: dict(n=samples, correct=c, sample_correct=[r.correct for r in rs],
                               sample_speedup=[r.speedup for r in rs], sample_kind=[r.error_kind for r in rs],
                               first_kind=rs[0].error_kind, speedup=rs[0].speedup, first_error=rs[0].error[:500],
                               harness_s=harness_seconds(rs),
                               sample_gpu_mb=[[gpu_peak_mb(r.details), (r.details.get("mem_need_mb") or [0, 0])[1]]
                                              for r in rs],
                               # how the harness ran them: after the rest (memory), without the task's reference
                               # server (why)
                               ran_deferred=sum(bool(r.details.get("ran_deferred")) for r in rs),
                               no_server=next((r.details["no_server"] for r in rs if r.details.get("no_server")), ""),
                               answers=[a[:ANSWER_CHARS] for a in answers[i * samples:(i + 1) * samples]])
                    for i, ((name, _), c, rs) in enumerate(zip(tasks, n_correct, per_task))}
    return out


def held_out_eval(coder, cfg, ev, round_, attempts):
    """{"eval/level{L}/<metric>": value} for the eval_levels, eval_samples kernels per task (see evaluate_coder).
    Which tasks were solved goes to RUN_DIR/eval_round{round_}.json (per level: task -> samples, correct count, every
    sample's verdict and speedup, the first one's error and answer; `compare` reads it), not to metrics.jsonl."""
    out, tasks = {}, {}
    for level in [int(x) for x in cfg.eval_levels.split(",") if x.strip()]:
        res = evaluate_coder(coder, cfg, ev, level, cfg.eval_samples, attempts, max_tasks=cfg.eval_max_tasks,
                             seed=phase_seed(cfg, round_, f"eval level{level}"))
        # (the wall seconds are the metrics' time/eval; the tasks go to the eval file)
        out.update({f"eval/level{level}/{k}": v for k, v in res.items() if k not in ("tasks", "seconds")})
        tasks[f"level{level}"] = res["tasks"]
    if rank() > 0:
        return out
    with open(os.path.join(cfg.run_dir, f"eval_round{round_}.json"), "w") as f:
        json.dump({"round": round_, "samples": cfg.eval_samples, "model": cfg.coder_model,
                   "temperature": cfg.temperature, **tasks}, f, indent=1)
    return out


def coder_policy(cfg, device):
    """The Coder that `eval` and `distill` ask: --coder-model names a model, or a folder of LoRA adapters saved alone
    (an SFT folder written with --no-sft-merged, a run's checkpoint adapters), which loads its base model with them,
    at the adapters' own rank and alpha."""
    saved = adapter_header(cfg.coder_model)
    if saved is None:
        return make_policy(cfg.coder_model, cfg, cfg.lr, device)
    cfg = dataclasses.replace(cfg, lora_rank=saved["lora_rank"], lora_alpha=saved["lora_alpha"])
    return make_policy(saved["base"], cfg, cfg.lr, device, sft_path=cfg.coder_model)


def run_eval(cfg, attempts):
    """The eval subcommand: one level, `samples` kernels per task, metrics printed and written to RUN_DIR (under
    torchrun each rank generates and verifies its share)."""
    device = setup_ranks(cfg)
    harness_device = harness_device_for(cfg, device)
    # the held-out evals during training sample at eval_temperature: so does this one, so that its pass@1 compares;
    # no scoring pass after generation (lean_rollouts): an eval needs the answers, not their log-probs
    cfg = dataclasses.replace(cfg, temperature=cfg.eval_temperature, lean_rollouts=True)
    say("config: " + json.dumps(dataclasses.asdict(cfg)))
    if cfg.temperature == 0 and cfg.samples > 1:
        say(f"note: greedy decoding (--eval-temperature 0) gives every sample the same answer: 1 sample per task, "
            f"not {cfg.samples}")
        cfg = dataclasses.replace(cfg, samples=1)
    torch.manual_seed(cfg.seed)
    policy = coder_policy(cfg, device)
    with open_evaluator(cfg, harness_device, device) as ev:
        res = evaluate_coder(policy, cfg, ev, cfg.level, cfg.samples, attempts, cfg.kernelbench_dir,
                             cfg.eval_max_tasks, phase_seed(cfg, -1, f"eval level{cfg.level}"))
    if rank() > 0:
        return res
    if harness_device == "cpu":
        print("note: the CPU has no timing: fast_p and the speedup need one, so they are 0 / null here")
    summary = {k: v for k, v in res.items() if k != "tasks"}
    print(json.dumps(summary, indent=1))
    os.makedirs(cfg.run_dir, exist_ok=True)
    path = os.path.join(cfg.run_dir, f"eval_level{cfg.level}_{cfg.backend}.json")
    with open(path, "w") as f:
        json.dump({"config": dataclasses.asdict(cfg), "model": cfg.coder_model, "temperature": cfg.temperature,
                   **res}, f, indent=1)
    print(f"wrote {path}")
    return res


# -----------------------------------------------------------------------------
# Self-distillation (the distill subcommand)


def self_distill(policy, cfg, ev, n_modules, samples, keep, attempts):
    """(pairs, stats): an SFT corpus from the Coder's own verified answers, by rejection sampling (STaR, Zelikman et
    al. 2022; RFT, Yuan et al. 2023: sample, keep what a checker accepts, fine-tune on it).

    `samples` kernels per synthetic module (kernelbench_tasks.synth, which never draws a held-out level1/level2 task)
    through the trainer's rollouts, verified by the harness; of each module's correct kernels the first `keep` distinct
    ones (catalog.normalized_source_hash: comments, formatting and local names do not count) become pairs in the
    templated corpus's format, marked "source": "self". `keep` bounds how much the easiest modules weigh.
    """
    # seed + 2: other modules than the templated corpus (drawn with seed) and the RL seed pool (seed + 1)
    modules, _ = synth.generate_pairs(n_modules, cfg.backend, cfg.seed + 2, verify=False)
    times = {}
    _, results, answers = attempts(ev, policy, [m["module"] for m in modules], samples, cfg, times, "distill",
                                   phase_seed(cfg, -1, "distill"))
    pairs, kinds = [], Counter()
    for i, module in enumerate(modules):
        kept = set()
        for j in range(i * samples, (i + 1) * samples):
            if results[j].correct and len(kept) < keep:
                code = extract_code(answers[j])
                h = catalog.normalized_source_hash(code)
                if h not in kept:
                    kept.add(h)
                    pairs.append({**module, "solution": code, "source": "self"})
                    kinds[module["kind"]] += 1
    stats = dict(model=cfg.coder_model, temperature=cfg.temperature, modules=len(modules), samples=samples,
                 keep=keep, errors=dict(Counter(r.error_kind for r in results)), kept=len(pairs),
                 modules_kept=len({p["seed"] for p in pairs}), kept_by_kind=dict(kinds),
                 seconds={k: round(v, 1) for k, v in times.items()}, harness_s=harness_seconds(results))
    return pairs, stats


def run_distill(cfg, attempts):
    """The distill subcommand: self_distill with --coder-model on --sft-pairs synthetic modules, --samples kernels
    each, at most --distill-keep kept per module, written like `python -m kernelbench_tasks.synth --out RUN_DIR`:
    RUN_DIR/pairs.jsonl and RUN_DIR/stats.json. `--sft-data RUN_DIR/pairs.jsonl` then warm-starts from it;
    concatenate it with the templated corpus for a mix."""
    if cfg.distill_keep < 1:
        raise SystemExit(f"--distill-keep {cfg.distill_keep}: keep at least 1 kernel per module")
    device = setup_ranks(cfg)
    harness_device = harness_device_for(cfg, device)
    say("config: " + json.dumps(dataclasses.asdict(cfg)))
    torch.manual_seed(cfg.seed)
    policy = coder_policy(cfg, device)
    # no timing: only correctness decides what is kept, and untimed candidates share the GPU (as in synth)
    with open_evaluator(cfg, harness_device, device, timing=False) as ev:
        pairs, stats = self_distill(policy, cfg, ev, cfg.sft_pairs, cfg.samples, cfg.distill_keep, attempts)
    if rank() > 0:
        return pairs, stats
    path = os.path.join(cfg.run_dir, "pairs.jsonl")
    write_jsonl(path, pairs)
    with open(os.path.join(cfg.run_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(json.dumps(stats))
    print(f"wrote {len(pairs)} verified pairs from {stats['modules_kept']} of {stats['modules']} modules to {path}")
    return pairs, stats
