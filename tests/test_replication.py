"""Tests: replication (the statistics of a held-out comparison, `compare`, greedy `eval`, the self-distilled corpus).

The statistics are checked against the worked numbers in their docstrings; `compare` reads eval files written by
hand in both formats (`eval`'s and a run's eval_round{N}.json) and by a real `eval` of the tiny model; `distill` runs
the whole subcommand on the CPU with the real harness, a stubbed generator answering with golden kernels.
"""
import json
import math
import os

import pytest
import torch

from plumbing import report


def test_replication_bootstrap_ci_worked_numbers():
    assert report.bootstrap_ci([0, 1] * 20) == pytest.approx((0.5, 0.35, 0.65))
    assert report.bootstrap_ci([0.25] * 10) == (0.25, 0.25, 0.25)
    spread = [i / 7 for i in range(7)]
    assert report.bootstrap_ci(spread, 50, seed=3) != report.bootstrap_ci(spread, 50)   # the seed is used...
    assert report.bootstrap_ci(spread, seed=3) == report.bootstrap_ci(spread, seed=3)   # ...and fixes the draws
    mean, lo, hi = report.bootstrap_ci([0, 1] * 20, alpha=0.5)   # a 50% interval is narrower than the 95% one
    assert mean == 0.5 and 0.35 < lo < 0.5 < hi < 0.65
    with pytest.raises(ValueError):
        report.bootstrap_ci([])


def test_replication_paired_bootstrap_diff_worked_numbers():
    before = [0, 0.25, 0.5, 0.75] * 10
    after = [b + 0.125 for b in before]
    assert report.bootstrap_ci(before) == pytest.approx((0.375, 0.2875, 0.4625))
    assert report.bootstrap_ci(after) == pytest.approx((0.5, 0.4125, 0.5875))   # overlaps the interval before
    assert report.paired_bootstrap_diff(before, after) == pytest.approx((0.125, 0.125, 0.125))   # pairing: exact
    assert report.paired_bootstrap_diff([0, 0, 0, 1] * 10, [0, 1, 0, 1] * 10) == pytest.approx((0.25, 0.125, 0.4))
    with pytest.raises(ValueError, match="same tasks"):
        report.paired_bootstrap_diff([0, 1], [0, 1, 1])


def _task(correct, speedup):
    """A per-task record as evaluate_coder writes it (only the fields compare reads, plus the count)."""
    return dict(n=len(correct), correct=sum(correct), sample_correct=correct, sample_speedup=speedup)


def test_replication_compare_intervals_and_paired_difference(tmp_path, capsys):
    """compare: an `eval` directory (one file per level) against a run's eval_round file (both levels), tasks matched
    by name whatever their order; numbers checked by hand; different task sets are a clear error."""
    import kernelzero as kz
    base = tmp_path / "base"
    base.mkdir()
    tasks1 = {f"t{i}": _task([False, False], [None, None]) for i in range(4)}
    tasks1["t0"] = _task([True, False], [2.0, None])
    tasks2 = {"u0": _task([False, False], [None, None]), "u1": _task([False, True], [None, 0.5])}
    for level, tasks in ((1, tasks1), (2, tasks2)):
        with open(base / f"eval_level{level}_triton.json", "w") as f:
            json.dump({"config": {"level": level}, "model": "m", "temperature": 1.0, "tasks": tasks}, f)
    after = {"round": 9, "samples": 2, "model": "m", "temperature": 1.0,
             "level2": {"u1": _task([True, True], [1.0, 8.0]), "u0": _task([True, False], [2.0, None])},
             "level1": {f"t{i}": _task([True, True], [4.0, 0.5]) for i in (3, 2, 1, 0)}}
    with open(tmp_path / "after.json", "w") as f:
        json.dump(after, f)
    out = kz.cli(["compare", str(base), str(tmp_path / "after.json")])
    b1, a1 = out["level1"]
    assert b1["tasks"] == 4 and b1["samples"] == [2] and b1["pass1"][0] == 0.125 and b1["pass_k"] == 0.25
    assert b1["fast_1"] == 1 / 8 and b1["geomean_speedup"] == 2.0 and b1["diff"] is None
    assert a1["pass1"] == (1.0, 1.0, 1.0) and a1["pass_k"] == 1.0 and a1["fast_1"] == 0.5
    assert a1["geomean_speedup"] == pytest.approx(math.sqrt(2.0))   # 4x and 0.5x per task: (4 * 0.5) ** (1 / 2)
    # per task after - before: t0 0.5, t1..t3 1.0 -> mean 0.875; a resample of 4 tasks lies in [0.5, 1.0]
    assert a1["diff"][0] == 0.875 and 0.5 <= a1["diff"][1] <= 0.875 <= a1["diff"][2] == 1.0
    b2, a2 = out["level2"]
    assert b2["pass1"][0] == 0.25 and a2["pass1"][0] == 0.75 and a2["diff"][0] == 0.5
    assert b2["fast_1"] == 0 and b2["geomean_speedup"] == 0.5 and a2["fast_1"] == 0.5 and a2["diff"][1:] == (0.5, 0.5)
    printed = capsys.readouterr().out
    assert "| eval | samples | pass@1 [95% CI] | pass@2 |" in printed and "+0.875 [" in printed
    # the per-task table: t1..t3 became solved, t0 improved (it was solved before); u0 became solved
    assert a1["gained"] == ["t1", "t2", "t3"] and a1["lost"] == [] and a2["gained"] == ["u0"]
    assert "| t1 | 0/2 | 2/2 + |" in printed and "| t0 | 1/2 | 2/2 |" in printed and "| u0 | 0/2 | 1/2 + |" in printed
    assert "####" not in printed   # (these evals kept no answers: no kernels to show)
    out = kz.cli(["compare", str(tmp_path / "after.json"), str(base)])   # (the other way round: losses)
    assert out["level1"][1]["lost"] == ["t1", "t2", "t3"] and "| t1 | 2/2 | 0/2 - |" in capsys.readouterr().out

    del after["level2"]["u0"]
    with open(tmp_path / "fewer.json", "w") as f:
        json.dump(after, f)
    with pytest.raises(SystemExit, match=r"level2: .* hold different tasks \(only in the first: \['u0'\]"):
        kz.cli(["compare", str(base), str(tmp_path / "fewer.json")])
    with pytest.raises(SystemExit, match="no eval_level"):
        kz.cli(["compare", str(tmp_path), str(tmp_path / "after.json")])


def test_replication_compare_shows_kernels_before_and_after(tmp_path, capsys):
    """compare prints, for two of the tasks the second eval gained (those it solved most often first), the first
    eval's first answer with its verdict and the second's first correct answer with its speedup."""
    import kernelzero as kz

    def task(correct, kinds, answers, speedup=None):
        return dict(_task(correct, speedup or [None] * len(correct)), sample_kind=kinds, answers=answers)

    before = {"t1": task([False, False], ["mismatch", "compile"], ["old t1 a", "old t1 b"]),
              "t2": task([False, False], ["runtime", "runtime"], ["old t2 a", "old t2 b"]),
              "t3": task([False, False], ["format", "format"], ["old t3 a", "old t3 b"])}
    after = {"t1": task([False, True], ["mismatch", "ok"], ["new t1 a", "new t1 b"], [None, 1.5]),
             "t2": task([True, True], ["ok", "ok"], ["new t2 a", "new t2 b"], [0.25, 2.0]),
             "t3": task([False, True], ["compile", "ok"], ["new t3 a", "new t3 b"], [None, 3.0])}
    for name, tasks in (("before", before), ("after", after)):
        with open(tmp_path / f"{name}.json", "w") as f:
            json.dump({"round": 0, "samples": 2, "level1": tasks}, f)
    kz.cli(["compare", str(tmp_path / "before.json"), str(tmp_path / "after.json")])
    printed = capsys.readouterr().out
    # t2 (2 of 2 after) first, then t1 (the first of the tasks solved once); t3 is left out
    assert printed.index("#### t2: before (sample 1: runtime)\n\nold t2 a") < printed.index("#### t1: before")
    assert "#### t2: after (sample 1: correct, speedup 0.25x)\n\nnew t2 a" in printed
    assert "#### t1: after (sample 2: correct, speedup 1.50x)\n\nnew t1 b" in printed and "#### t3" not in printed


def test_replication_greedy_eval_records_samples_temperature_and_model(tmp_path, capsys):
    """`eval --eval-temperature 0` decodes greedily, so it evaluates one sample per task whatever --samples says; the
    file records the model and temperature, every sample's verdict, the wall seconds of generation and each task's
    harness seconds and GPU memory (none: an answer without code never reaches the harness), and `compare` reads it
    (itself: a zero difference)."""
    import kernelzero as kz
    res = kz.cli(["eval", "--preset", "tiny", "--device", "cpu", "--level", "1", "--samples", "3", "--eval-temperature", "0",
                  "--eval-max-tasks", "2", "--run-dir", str(tmp_path)])
    assert "1 sample per task" in capsys.readouterr().out
    assert res["errors"] == {"format": 2} and "pass@3" not in res and res["pass@1_ci"] == [0.0, 0.0]
    path = str(tmp_path / "eval_level1_triton.json")
    with open(path) as f:
        saved = json.load(f)
    assert saved["model"] == "tiny" and saved["temperature"] == 0.0 and saved["config"]["samples"] == 1
    assert saved["seconds"]["generate"] > 0 and saved["seconds"]["verify_after"] >= 0
    for t in saved["tasks"].values():
        assert t["n"] == 1 and t["sample_correct"] == [False] and t["sample_kind"] == ["format"]
        assert t["sample_speedup"] == [None] and t["harness_s"] == {}
        assert t["sample_gpu_mb"] == [[None, 0]]   # (no GPU stage ran: no peak, nothing admitted)
        assert t["ran_deferred"] == 0 and t["no_server"] == ""
    assert saved["ran_deferred"] == 0
    rows = kz.cli(["compare", path, path])["level1"]
    assert rows[1]["diff"] == (0.0, 0.0, 0.0) and rows[0]["tasks"] == 2


def test_replication_distill_keeps_distinct_verified_kernels(tmp_path, monkeypatch):
    """distill on the CPU (real harness, Triton interpreter) with a generator that answers module 0 with its golden
    kernel four ways (the golden one, the same with a comment, two distinct variants) and module 1 with no code or
    module 0's kernel: module 0 keeps --distill-keep 2 distinct correct kernels, module 1 none; the file is the SFT
    corpus format and the SFT warm start trains on it."""
    import kernelzero as kz
    from kernelbench_tasks import catalog, synth
    drawn = []
    real_generate_pairs = synth.generate_pairs

    def generate_pairs(*args, **kwargs):
        pairs, stats = real_generate_pairs(*args, **kwargs)
        drawn.extend(pairs)
        return pairs, stats

    def rollout(model, tok, prompts, cfg, sampler=None, desc="", gpu_turn=None, on_chunk=None, rows=None, seed=None):
        golden = drawn[0]["solution"]
        answers = {drawn[0]["module"]: [golden, golden + "\n# the same kernel\n", golden + "\nKEEP = 1\n",
                                        golden + "\nKEEP = 2\n"],
                   drawn[1]["module"]: ["no code here", golden, "no code", "none"]}
        seen = {}
        completions = []
        for p in prompts:
            module = next(m for m in answers if m in p)
            code = answers[module][seen.get(module, 0)]
            seen[module] = seen.get(module, 0) + 1
            completions.append(code if "class ModelNew" not in code else f"Here:\n```python\n{code}\n```")
        with gpu_turn():
            on_chunk(0, completions)
        return {"completions": completions}

    monkeypatch.setattr(synth, "generate_pairs", generate_pairs)
    monkeypatch.setattr(kz, "rollout", rollout)
    pairs, stats = kz.cli(["distill", "--preset", "tiny", "--device", "cpu", "--sft-pairs", "2", "--samples", "4",
                           "--distill-keep", "2", "--eval-workers", "2", "--run-dir", str(tmp_path / "self")])
    data = str(tmp_path / "self" / "pairs.jsonl")
    assert len(drawn) == 2 and drawn[0]["kind"] != drawn[1]["kind"]
    assert stats["errors"]["ok"] == 4 and stats["errors"]["format"] == 3 and sum(stats["errors"].values()) == 8
    assert stats["kept"] == 2 and stats["modules_kept"] == 1 and stats["kept_by_kind"] == {drawn[0]["kind"]: 2}
    with open(data) as f:
        saved = [json.loads(line) for line in f]
    assert saved == pairs and len(saved) == 2
    assert catalog.normalized_source_hash(saved[0]["solution"]) == catalog.normalized_source_hash(drawn[0]["solution"])
    assert "KEEP = 1" in saved[1]["solution"] and "KEEP = 2" not in saved[1]["solution"]
    for p in saved:   # the templated corpus's fields, its module and APIs, the model's own kernel
        assert {k: v for k, v in p.items() if k not in ("solution", "source")} == \
            {k: v for k, v in drawn[0].items() if k != "solution"} and p["source"] == "self"
    with open(tmp_path / "self" / "stats.json") as f:
        assert json.load(f)["kept"] == 2

    cfg = kz.Config(**{**kz.PRESETS["tiny"], "sft_data": data, "sft_dir": str(tmp_path / "sft"), "sft_steps": 1,
                       "sft_batch": 2, "micro_batch": 2})
    coder, proposer = kz.sft_warm_start(cfg, torch.device("cpu"), "cpu")
    assert os.path.exists(os.path.join(coder, "config.json")) and os.path.exists(os.path.join(proposer, "config.json"))


def test_replication_script_end_to_end_on_the_cpu(tmp_path):
    """replicate.sh with the tiny model: every stage runs (starting points, distill, the three runs side by side,
    compare, plot), the choice of start is logged, and a second invocation skips what is done; a first invocation
    out of time (MINUTES) leaves the runs checkpointed for the second. The first invocation
    runs every stage under torchrun on 2 ranks (GPUS=2; gloo on the CPU), the second plainly (one process)."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "rep"
    env = dict(os.environ, MODEL="tiny", ROUNDS="2", SAMPLES="2", PAIRS="4", OUT=str(out), RESULTS=str(tmp_path / "res"),
               EXTRA="--preset tiny --device cpu --eval-max-tasks 2 --sft-steps 2 --sft-pairs 8",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    # the first invocation is out of time when the runs start (MINUTES): they stop before round 0 with their
    # checkpoints, and the second goes on from them
    for gpus, minutes in (("2", "0.001"), ("1", "0")):
        done = subprocess.run(["bash", os.path.join(here, "replicate.sh")], env=dict(env, GPUS=gpus, MINUTES=minutes),
                              capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
        if minutes != "0":
            assert "stopped at the time limit: main 0, correctness 0, uniform 0 of 2 rounds" in done.stdout
            assert not (out / "compare.txt").exists()
    log = (out / "stages.log").read_text()
    assert log.count("start base") == 1 and log.count("start templates") == 1 and log.count("distill") >= 1
    assert log.count("chosen starting point: base (level-1 pass@1: base 0.000, templates 0.000") == 2, log
    for run in ("main", "correctness", "uniform"):
        rounds = [json.loads(line)["round"] for line in open(out / run / "metrics.jsonl")]
        assert rounds == [0, 1], (run, rounds)
        log_text = (out / f"{run}.log").read_text()
        assert "CPU x 2 ranks (torchrun)" in log_text and log_text.count("round   1 |") == 1, run   # one console
        assert "Stopped before round 0 of 2, checkpoint written" in log_text, run
        assert json.load(open(out / run / "config.json"))["rounds"] == 2
    assert json.load(open(out / "correctness" / "config.json"))["coder_reward"] == "correctness"
    assert json.load(open(out / "uniform" / "config.json"))["proposer_mode"] == "uniform"
    compare = (out / "compare.txt").read_text()
    assert compare.count("eval_round1.json") == 6 and compare.count("start_base/eval_round-1.json") == 2
    assert (out / "compare.png").exists()
    kept = sorted(str(p.relative_to(tmp_path / "res")) for p in (tmp_path / "res").rglob("*") if p.is_file())
    assert "compare.png" in kept and "compare.txt" in kept and "main/metrics.jsonl" in kept, kept
    assert "uniform/eval_round1.json" in kept and "start_base/eval_round-1.json" in kept, kept
    allowed = ("metrics.jsonl", "config.json", "stats.json", "stages.log", ".txt", ".png", ".json")
    assert all(k.count("/") <= 1 and k.endswith(allowed) for k in kept), kept   # no model, no checkpoint


def test_replication_script_one_start_probes_its_pool_beside_its_eval(tmp_path):
    """With one starting point to judge (STARTS=base), it is the chosen one before its eval ends: the seed stage
    runs beside the start's eval (logged before the choice), and the runs get its pool; out of time (MINUTES), they
    stop before round 0."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "rep"
    env = dict(os.environ, MODEL="tiny", ROUNDS="2", SAMPLES="2", STARTS="base", MINUTES="0.001", OUT=str(out),
               RESULTS=str(tmp_path / "res"), EXTRA="--preset tiny --device cpu --eval-max-tasks 2 --seed-probe 1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    done = subprocess.run(["bash", os.path.join(here, "replicate.sh")], env=env, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    log = (out / "stages.log").read_text()
    assert log.index("starting pool") < log.index("chosen starting point: base"), log
    assert "start templates" not in log and "distill" not in log and (out / "seed" / "done").exists()
    assert (out / "seed" / "seed_pool.json").exists()   # (probed: --seed-probe 1 overrides the tiny preset's 0)
    # the GPU's harness workers shared out: 8 -> 4 each for the start's eval and the seed stage, 3 for each run
    assert json.load(open(out / "seed" / "config.json"))["gpu_workers"] == 4
    assert json.load(open(out / "start_base" / "config.json"))["gpu_workers"] == 4
    for run in ("main", "correctness", "uniform"):
        config = json.load(open(out / run / "config.json"))
        assert config["seed_from"] == f"{out}/seed/seed_pool.json" and config["gpu_workers"] == 3, (run, config)
        # three updates side by side on one GPU: the memory flags, which EXTRA's come after (and so override)
        assert config["gradient_checkpointing"] and config["micro_batch"] == 2, (run, config)
    # a run that dies is reported as failed with the end of its log, and the script fails: not "stopped at the time
    # limit", which is what it said when three runs ran out of GPU memory (ROUNDS=-1: each run's config is refused)
    done = subprocess.run(["bash", os.path.join(here, "replicate.sh")], env=dict(env, ROUNDS="-1"),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    for run in ("main", "correctness", "uniform"):
        assert f"run {run} failed (exit 2); the end of {out}/{run}.log:" in done.stdout, done.stdout[-2000:]
    assert "--rounds" in (out / "stages.log").read_text() and "stopped at the time limit" not in done.stdout
