"""
Numbers from files, independent of the trainer: pass@k, fast_p, the geometric-mean speedup and bootstrap intervals
over tasks; the `compare` table of eval files; the `plot` figure of training runs' metrics.jsonl. Nothing here loads
a model or runs a kernel: plumbing/evaluation.py's evaluate_coder computes these numbers and writes the eval files,
kernelzero.py's loop writes metrics.jsonl, and its `compare` and `plot` subcommands read them back through this
module.

How this departs from common practice:
1. Intervals are percentile bootstraps over tasks (`bootstrap_ci`), and a difference between two evals resamples the
   same tasks jointly (`paired_bootstrap_diff`), rather than a binomial interval over all samples: tasks are what a
   benchmark draws, and pairing removes the spread between easy and hard tasks.
2. With several samples per task, `compare`'s fast_1 counts every sample (KernelBench's fast_p takes one per task):
   the expectation of fast_1 over the draws, every task weighing the same.
3. `plot_runs` leaves out panels with no data or one value throughout (KL with kl_coef 0) and names them under the
   figure instead of drawing flat lines.

Use:
    python kernelzero.py compare BEFORE [AFTER ...]       # eval files or dirs: pass@1 95% CIs, paired differences
    python kernelzero.py plot RUN_DIR [RUN_DIR ...]        # several: a method and its ablations on one figure
    from plumbing.report import pass_at_k, bootstrap_ci    # pass_at_k(10, 3, 1) = 0.3
This module imports none of the others (they import it); matplotlib is imported only when plotting.
"""

import contextlib
import glob
import json
import math
import os
import random


# -----------------------------------------------------------------------------
# Metrics
# From per-sample verdicts (correct, speedup): what evaluate_coder reports and what compare recomputes from files.


def pass_at_k(n, c, k):
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k), from n samples of which c are correct.

    pass_at_k(10, 3, 1) = 0.3; pass_at_k(5, 2, 2) = 1 - 3/10 = 0.7; n - c < k -> 1.0. Computed as a product so that
    large n does not overflow.
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def fast_p(correct, speedup, p):
    """KernelBench fast_p: the share of tasks whose (first) sample is correct AND has speedup > p (strict).

    correct, speedup: one entry per task of the level (a missing task counts as a failure; a missing speedup, e.g. on
    a CPU without timing, is not fast). fast_p([1, 1, 0, 1], [1.0, 2.5, 9.0, None], 1.0) = 0.25.
    """
    hits = [bool(c) and s is not None and math.isfinite(s) and s > p for c, s in zip(correct, speedup)]
    return sum(hits) / len(hits) if hits else 0.0


def geomean_speedup(correct, speedup):
    """Geometric-mean speedup over the correct samples with a timing; None when there are none."""
    logs = [math.log(s) for c, s in zip(correct, speedup) if c and s is not None and math.isfinite(s) and s > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def bootstrap_ci(values, n_boot=10000, seed=0, alpha=0.05):
    """(mean, low, high): the mean of per-task values and its 1 - alpha percentile bootstrap interval.

    Tasks are resampled with replacement, n_boot times (Efron & Tibshirani 1993, "An Introduction to the Bootstrap",
    ch. 13): tasks are the unit a benchmark draws, and each task's value (e.g. its pass@1, c/n of its samples) already
    averages its own samples, so the interval covers both which tasks were drawn and the sampling noise within them.
    Deterministic from seed (python's random.choices, the same on every platform).
    bootstrap_ci([0, 1] * 20) = (0.5, 0.35, 0.65) (the normal approximation: 0.5 +- 0.155);
    bootstrap_ci([0.25] * 10) = (0.25, 0.25, 0.25).
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("bootstrap_ci needs at least one value")
    n, rng = len(values), random.Random(seed)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(n_boot))
    cut = int(alpha / 2 * n_boot)
    return sum(values) / n, means[cut], means[n_boot - 1 - cut]


def paired_bootstrap_diff(before, after, n_boot=10000, seed=0, alpha=0.05):
    """(mean, low, high) of after - before, tasks resampled jointly: the bootstrap_ci of the per-task differences.

    before[i] and after[i] are the same task's values. Pairing removes the spread between easy and hard tasks, which
    two separate intervals would both carry: before = [0, 0.25, 0.5, 0.75] * 10 and after = before + 0.125 have
    overlapping intervals (0.2875, 0.4625) and (0.4125, 0.5875), but paired_bootstrap_diff(before, after) =
    (0.125, 0.125, 0.125). With noise: before = [0, 0, 0, 1] * 10, after = [0, 1, 0, 1] * 10 -> (0.25, 0.125, 0.4).
    """
    if len(before) != len(after):
        raise ValueError(f"paired values need the same tasks: {len(before)} before, {len(after)} after")
    return bootstrap_ci([a - b for b, a in zip(before, after)], n_boot, seed, alpha)


# -----------------------------------------------------------------------------
# Comparing evals (the compare subcommand)


def load_eval(path):
    """{"level1": {task: record}, ...} from `eval`'s eval_level{L}_{backend}.json, a run's eval_round{N}.json, or a
    directory holding `eval` files (every eval_level*.json in it: one per level). Records: see evaluate_coder."""
    if os.path.isdir(path):
        levels = {}
        for file in sorted(glob.glob(os.path.join(path, "eval_level*.json"))):
            for level, tasks in load_eval(file).items():
                if level in levels:
                    raise SystemExit(f"{path} holds two evals of {level}: name the file to compare")
                levels[level] = tasks
        if not levels:
            raise SystemExit(f"{path} holds no eval_level*.json (what `kernelzero.py eval` writes)")
        return levels
    with open(path) as f:
        data = json.load(f)
    if "tasks" in data:   # `eval`: one level
        levels = {f"level{data['config']['level']}": data["tasks"]}
    else:                 # held_out_eval: every eval level of a run
        levels = {k: v for k, v in data.items() if k.startswith("level")}
    return levels


def compare_evals(paths, n_boot=10000):
    """The compare subcommand. Per level and eval: pass@1 with its 95% bootstrap interval over tasks, pass@n (n: the
    fewest samples per task of all evals), fast_1 and the geometric-mean speedup of correct kernels; for every eval
    after the first, its pass@1 minus the first's with a paired bootstrap interval (tasks matched by name).
    Prints one markdown table per level, the per-task table, and for two tasks the second eval gained the kernels
    before and after; returns {level: [one row dict per eval]}."""
    evals = [load_eval(p) for p in paths]
    out = {}
    for level in sorted(set().union(*evals)):
        first = evals[0].get(level, {})
        for path, levels in zip(paths, evals):
            other = set(levels.get(level, {}))
            if other != set(first):
                raise SystemExit(f"{level}: {paths[0]} and {path} hold different tasks (only in the first: "
                                 f"{sorted(set(first) - other)[:5]}, only in the other: {sorted(other - set(first))[:5]})"
                                 ": compare evals of the same tasks")
        names = sorted(first)
        k = min(len(levels[level][t]["sample_correct"]) for levels in evals for t in names)
        rows, before = [], None
        for path, levels in zip(paths, evals):
            recs = [levels[level][t] for t in names]
            pass1 = [sum(r["sample_correct"]) / len(r["sample_correct"]) for r in recs]
            correct = [c for r in recs for c in r["sample_correct"]]
            speedup = [s for r in recs for s in r["sample_speedup"]]
            rows.append(dict(
                eval=path, tasks=len(names), samples=sorted({len(r["sample_correct"]) for r in recs}),
                pass1=bootstrap_ci(pass1, n_boot),
                pass_k=sum(pass_at_k(len(r["sample_correct"]), sum(r["sample_correct"]), k) for r in recs) / len(recs),
                fast_1=fast_p(correct, speedup, 1.0),   # every sample counts (see evaluate_coder)
                geomean_speedup=geomean_speedup(correct, speedup),
                diff=paired_bootstrap_diff(before, pass1, n_boot) if before is not None else None))
            if before is None:
                before = pass1
        out[level] = rows
        print(f"\n{level}: {len(names)} tasks; 95% intervals: bootstrap over tasks (pass@1), paired (difference)")
        print(f"| eval | samples | pass@1 [95% CI] | pass@{k} | fast_1 | geomean speedup | pass@1 - first [95% CI] |")
        print("|---|---|---|---|---|---|---|")
        for r in rows:
            diff = "" if r["diff"] is None else "{:+.3f} [{:+.3f}, {:+.3f}]".format(*r["diff"])
            speed = "-" if r["geomean_speedup"] is None else f"{r['geomean_speedup']:.2f}"
            print(f"| {r['eval']} | {'/'.join(map(str, r['samples']))} | {r['pass1'][0]:.3f} [{r['pass1'][1]:.3f}, "
                  f"{r['pass1'][2]:.3f}] | {r['pass_k']:.3f} | {r['fast_1']:.3f} | {speed} | {diff} |")
        for row, levels in zip(rows[1:], evals[1:]):
            row["gained"], row["lost"] = task_changes(first, levels[level])
        print_task_table(names, [levels[level] for levels in evals])
        if len(evals) > 1:
            print_before_after(rows[1]["gained"], first, evals[1][level])
    return out


def task_changes(before, after):
    """(gained, lost): the tasks with no correct sample before and one at least after, and the reverse."""
    solved = lambda tasks, t: any(tasks[t]["sample_correct"])
    return ([t for t in sorted(before) if not solved(before, t) and solved(after, t)],
            [t for t in sorted(before) if solved(before, t) and not solved(after, t)])


def print_task_table(names, evals):
    """Correct samples per task in each eval (the columns in the order given), for the tasks where the evals' counts
    differ; a mark says where a task became solved (+) or was lost (-) against the first."""
    changed = [t for t in names if len({sum(e[t]["sample_correct"]) for e in evals}) > 1]
    if not changed:
        print("\nper task: every eval solved as many samples of every task")
        return
    print(f"\nper task, correct samples of those drawn (the {len(changed)} of {len(names)} tasks where the counts "
          "differ; + became solved, - lost, against the first):")
    print("| task | " + " | ".join(f"eval {i + 1}" for i in range(len(evals))) + " |")
    print("|---|" + "---|" * len(evals))
    for t in changed:
        cells = []
        for i, e in enumerate(evals):
            c, n = sum(e[t]["sample_correct"]), len(e[t]["sample_correct"])
            c0 = sum(evals[0][t]["sample_correct"])
            mark = " +" if i and c and not c0 else " -" if i and c0 and not c else ""
            cells.append(f"{c}/{n}{mark}")
        print(f"| {t} | " + " | ".join(cells) + " |")


def print_before_after(gained, before, after, k=2):
    """For k of the tasks the second eval gained (those it solved most often first), what the Coder wrote before (the
    first sample, and its verdict) and after (its first correct sample, and its speedup), from the evals' answers
    (each kept up to evaluation.ANSWER_CHARS characters)."""
    shown = sorted((t for t in gained if before[t].get("answers") and after[t].get("answers")),
                   key=lambda t: -sum(after[t]["sample_correct"]))[:k]
    for t in shown:
        i = after[t]["sample_correct"].index(True)
        speedup = after[t]["sample_speedup"][i]
        print(f"\n#### {t}: before (sample 1: {before[t]['sample_kind'][0]})\n\n{before[t]['answers'][0].strip()}")
        print(f"\n#### {t}: after (sample {i + 1}: correct, speedup "
              f"{'-' if speedup is None else f'{speedup:.2f}x'})\n\n{after[t]['answers'][i].strip()}")


# -----------------------------------------------------------------------------
# Plots (the plot subcommand)


# kernelzero.py's command line raises it too: it lives here because plot_runs says which RUN_DIR is wrong
# with it, and this module cannot import kernelzero
class UsageError(SystemExit):
    """A wrong command line: exit status 2 (argparse's convention) and one line saying what is wrong (str())."""

    def __init__(self, message):
        super().__init__(2)
        self.message = message

    def __str__(self):
        return self.message


def _finite(v):
    return isinstance(v, (int, float)) and math.isfinite(v)


def plot_runs(run_dirs):
    """Draw RUN_DIR/metrics.jsonl to RUN_DIR/metrics.png; several runs (a method and its ablations) go on the same
    axes, one colour per run, to compare.png beside the first. A panel with no data, or with one value throughout
    (KL with kl_coef 0), is left out and named under the figure. Returns the path (None without matplotlib or with
    nothing to draw)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("plotting needs matplotlib: pip install matplotlib")
        return None
    runs, configs, sft = {}, [], {}
    for d in run_dirs:
        path = os.path.join(d, "metrics.jsonl")
        if not os.path.isfile(path):
            raise UsageError(f"{path} does not exist: pass a run directory (--run-dir of a training run)")
        rows = [json.loads(line) for line in open(path) if line.strip()]
        if not rows:
            print(f"{path} has no rounds yet (a run writes one line a finished round): left out")
            continue
        runs[os.path.basename(os.path.normpath(d))] = rows
        with contextlib.suppress(OSError, ValueError):   # the SFT warm start's losses per step (kernelzero.py writes it)
            sft[os.path.basename(os.path.normpath(d))] = json.load(open(os.path.join(d, "sft_losses.json")))
        with contextlib.suppress(OSError, ValueError):
            configs.append(json.load(open(os.path.join(d, "config.json"))))
    if not runs:
        print("nothing to plot")
        return None
    panels = [("Coder pass rate", ["coder/pass_rate", "eval/level1/pass@1", "eval/level2/pass@1"]),
              ("Coder speedup (geomean, correct)", ["coder/speedup"]),
              ("Frontier difficulty p", ["proposer/p_mean"]),
              ("Proposer validity, frontier share",
               ["proposer/valid_frac", "proposer/format_frac", "proposer/frontier_frac"]),
              ("Rewards", ["coder/reward_mean", "proposer/reward_mean"]),
              ("KL (k3)", ["coder/kl", "proposer/kl"]),
              ("Clip fraction", ["coder/clip_frac", "proposer/clip_frac"]),
              ("Zero-std groups, duplicate kernels",
               ["coder/frac_reward_zero_std", "proposer/frac_reward_zero_std", "coder/duplicate_frac"])]
    # panels that are constant by configuration in every run: no k3 term with kl_coef 0, ratio 1 with one epoch
    fixed = {"KL (k3)": ("kl_coef", 0, "kl_coef 0"), "Clip fraction": ("ppo_epochs", 1, "ppo_epochs 1: ratio 1")}
    several_rounds = any(len({r["round"] for r in rows}) > 1 for rows in runs.values())
    drawn, left_out = [], []
    for title, keys in panels:
        values = {r[k] for rows in runs.values() for r in rows for k in keys if _finite(r.get(k))}
        if title.startswith("Frontier"):
            values |= {p for rows in runs.values() for r in rows for p in r.get("proposer/pass_rates") or []}
        field, value, why = fixed.get(title, (None, None, None))
        if configs and len(configs) == len(runs) and field and all(c.get(field) == value for c in configs):
            left_out.append(f"{title} ({why})")
        elif not values:
            left_out.append(f"{title} (no data)")
        elif len(values) == 1 and several_rounds:
            left_out.append(f"{title} ({values.pop():g} throughout)")
        else:
            drawn.append((title, keys))
    sft_keys = [k for k in ("coder", "proposer") if any(v.get(k) for v in sft.values())]
    if sft_keys:   # its own x axis: SFT steps, before round 0
        drawn.insert(0, ("SFT loss (before the rounds)", sft_keys))
    else:
        left_out.append("SFT loss (no sft_losses.json)")
    rows_n = max(1, math.ceil(len(drawn) / 4))
    cols = max(1, math.ceil(len(drawn) / rows_n))   # 5 panels: 2 x 3, not 2 x 4 with three empty
    fig, axes = plt.subplots(rows_n, cols, figsize=(4.6 * cols, 4.2 * rows_n), squeeze=False, layout="constrained")
    for ax in axes.flat[len(drawn):]:
        ax.set_axis_off()
    # One run: a colour and a marker per metric. Several: a colour per run, a line style and a marker per metric.
    # Markers differ in shape and size (filled, hollow, small) so that series with equal values (a single round,
    # two shares both 1.0) stay visible on top of each other.
    styles = [dict(linestyle="-", marker="o", ms=8), dict(linestyle="--", marker="s", ms=11, mfc="none", mew=1.5),
              dict(linestyle=":", marker="^", ms=6)]
    for ax, (title, keys) in zip(axes.flat, drawn):
        if title.startswith("SFT"):
            for i, (name, losses) in enumerate(sft.items()):
                prefix = f"{name}: " if len(runs) > 1 else ""
                for j, (key, style) in enumerate(zip(keys, styles)):
                    ys = [y for y in losses.get(key) or [] if _finite(y)]
                    if ys:
                        ax.plot(range(1, len(ys) + 1), ys, color=f"C{i if len(runs) > 1 else j}",
                                label=prefix + f"{key} SFT loss", **{**style, "ms": style["ms"] * 0.6})
            ax.set_title(title)
            ax.set_xlabel("SFT step")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            handles, labels = ax.get_legend_handles_labels()
            ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)
            continue
        for i, (name, rows) in enumerate(runs.items()):
            prefix = f"{name}: " if len(runs) > 1 else ""
            for j, (key, style) in enumerate(zip(keys, styles)):
                pts = [(r["round"], r[key]) for r in rows if _finite(r.get(key))]
                if pts:
                    ax.plot(*zip(*pts), color=f"C{i if len(runs) > 1 else j}", label=prefix + key,
                            **{**style, "ms": style["ms"] if len(pts) < 12 else style["ms"] / 2})
            if title.startswith("Frontier"):  # each probed module's pass rate: the distribution behind the mean
                dots = [(r["round"], p) for r in rows for p in r.get("proposer/pass_rates") or []]
                if dots:
                    ax.scatter(*zip(*dots), s=8, alpha=0.4, color="grey" if len(runs) == 1 else f"C{i}",
                               label=prefix + "proposer/pass_rates (modules)")
        ax.set_title(title)
        ax.set_xlabel("round")
        rounds = sorted({r["round"] for rows in runs.values() for r in rows})
        if rounds[-1] - rounds[0] <= 10:   # rounds are whole numbers; a lone round gets room on both sides
            ax.set_xticks(range(rounds[0], rounds[-1] + 1))
            ax.set_xlim(rounds[0] - 0.5, rounds[-1] + 0.5)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        # the legend goes below the axes, where it covers no curve; with several runs it names the metrics only
        # (line styles), and one legend above the panels names the runs (colours)
        handles, labels = ax.get_legend_handles_labels()
        if len(runs) > 1:
            shown = [k for k in keys if any(lab.endswith(": " + k) for lab in labels)]
            handles = [Line2D([], [], color="black", **st) for k, st in zip(keys, styles) if k in shown]
            labels = shown + (["modules' pass rates (dots)"] if ax.collections else [])
            handles += [Line2D([], [], color="grey", marker="o", linestyle="", alpha=0.5)] if ax.collections else []
        if labels:   # (even one metric: its name says which field of metrics.jsonl it is)
            ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False,
                      handlelength=3)
    if len(runs) > 1:
        fig.legend([Line2D([], [], color=f"C{i}", lw=3) for i in range(len(runs))], list(runs), loc="outside upper center",
                   ncols=len(runs), frameon=False)
    if left_out:
        fig.supxlabel("not drawn: " + "; ".join(left_out), fontsize=8)
    first = os.path.normpath(run_dirs[0])
    path = os.path.join(first, "metrics.png") if len(run_dirs) == 1 else os.path.join(os.path.dirname(first),
                                                                                      "compare.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}" + (f" ({len(drawn)} panels; not drawn: {'; '.join(left_out)})" if left_out else ""))
    return path
