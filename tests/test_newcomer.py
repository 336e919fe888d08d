"""Tests: what a newcomer meets first. Every wrong flag is one clear line (exit status 2) before any work starts,
the console says why a round trained nothing, plots and the harness CLI say what they show."""

import json

import pytest

from plumbing import config, models


def _usage_error(kz, capsys, argv):
    """(exit code, the stderr line) of a command line that must be refused before any work."""
    with pytest.raises(SystemExit) as e:
        kz.cli(argv)
    err = capsys.readouterr().err.strip()
    return e.value.code, err


@pytest.mark.parametrize("argv, says", [
    (["--round", "3"], "did you mean --rounds?"),   # no prefix matching: a typo is not a different flag
    (["--backend", "foo"], "--backend 'foo': choose from cuda, triton"),
    (["--device", "tpu"], "--device 'tpu'"),
    (["--loss-agg", "sum"], "--loss-agg 'sum'"),
    (["--adv-scale", "batch"], "--adv-scale 'batch'"),
    (["--group-size", "1"], "--group-size 1: must be 2 or more"),
    (["--temperature", "-0.5"], "--temperature -0.5"),
    (["--lr", "nan"], "--lr nan"),
    (["--tau", "1.5"], "--tau 1.5"),
    (["--frontier-low", "0.9", "--frontier-high", "0.5"], "--frontier-low 0.9 is above --frontier-high 0.5"),
    (["--eval-levels", "1,two"], "--eval-levels '1,two'"),
    (["--sft-data", "no/such/pairs.jsonl"], "--sft-data no/such/pairs.jsonl: no such file"),
    (["--rounds", "three"], "invalid int value"),
    (["eval", "--level", "9"], "--level 9: no level9 tasks"),
    (["--coder-model", "does/not/exist"], "--coder-model does/not/exist"),
    (["--proposer-model", "./no_such_dir"], "--proposer-model ./no_such_dir"),
])
def test_newcomer_wrong_flags_get_one_line_before_any_work(argv, says, capsys, monkeypatch, tmp_path):
    import kernelzero as kz
    from kernelbench_tasks import synth

    def no_work(*a, **k):
        raise AssertionError("work started before the flags were checked")
    for name in ("sft_warm_start", "make_policy", "seed_pool", "run_eval", "main"):
        monkeypatch.setattr(kz, name, no_work)
    monkeypatch.setattr(synth, "generate_pairs", no_work)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # a hub id is looked up in the cache only
    real = models.model_problem   # the default (named) models count as installed: only the flag under test is wrong
    monkeypatch.setattr(config, "model_problem", lambda name: None if name in models.NAMED_MODELS else real(name))
    code, err = _usage_error(kz, capsys, argv + ["--run-dir", str(tmp_path / "run")])
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("kernelzero.py: error: ") and says in err, err


def test_newcomer_cuda_without_a_gpu_is_refused_up_front(capsys, tmp_path):
    import torch

    import kernelzero as kz
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    for argv, says in ((["--device", "cuda"], "no GPU is visible"), (["--backend", "cuda"], "--backend triton")):
        code, err = _usage_error(kz, capsys, argv + ["--run-dir", str(tmp_path)])
        assert code == 2 and says in err and len(err.splitlines()) == 1


def test_newcomer_a_good_command_line_still_parses(tmp_path):
    import kernelzero as kz
    cfg = kz.parse_config(["--preset", "tiny", "--rounds", "0", "--eval-levels", "1,2", "--temperature", "0",
                           "--run-dir", str(tmp_path)])
    assert cfg.rounds == 0 and cfg.temperature == 0 and config.config_problem(cfg) is None
    # the config a run saves reads back as the same Config on --resume
    (tmp_path / "config.json").write_text(json.dumps(kz.dataclasses.asdict(cfg)))
    resumed = kz.parse_config(["--resume", "--preset", "tiny", "--run-dir", str(tmp_path)])
    assert resumed == kz.dataclasses.replace(cfg, resume=True)


def test_newcomer_harness_check_says_speedup_runtime_and_why(tmp_path, capsys, monkeypatch):
    """`eval_harness.py check` without --json: the verdict with its speedup and runtimes, or why there are none, and
    on failure the reason, on one or two lines."""
    import eval_harness as eh
    ref, cand = tmp_path / "ref.py", tmp_path / "cand.py"
    ref.write_text("# task\n")
    cand.write_text("# candidate\n")
    verdicts = {
        "gpu_ok": (eh.KernelResult(compiled=True, correct=True, error_kind="ok", speedup=1.5, runtime_ms=0.1,
                                   ref_runtime_ms=0.15, compile_s=11.0), "cuda", 0,
                   ["ok: correct, speedup 1.50x (0.100 ms vs 0.150 ms eager); compiled in 11.0 s"]),
        "cpu_ok": (eh.KernelResult(compiled=True, correct=True, error_kind="ok", compile_s=0.5,
                                   details={"phase_s": {"reference": 2.0, "run": 68.0}}), "cpu", 0,
                   ["ok: correct, not timed (the CPU runs Triton under its interpreter: speedup and runtime need a "
                    "GPU); compiled in 0.5 s; 70.0 s in all"]),
        "timeout": (eh.KernelResult(compiled=True, correct=False, error_kind="timeout",
                                    error="Traceback ...\nrun exceeded the 20 s limit\n"), "cpu", 1,
                    ["FAIL (timeout)", "  run exceeded the 20 s limit"]),
        "hack": (eh.KernelResult(compiled=True, correct=False, error_kind="reward_hack", error="torch.matmul in forward",
                                 details={"check": "fallback"}), "cuda", 1,
                 ["FAIL (reward_hack) [check: fallback]", "  torch.matmul in forward"]),
    }
    for name, (result, device, rc, lines) in verdicts.items():
        monkeypatch.setattr(eh, "evaluate", lambda *a, **k: result)
        assert eh.main(["check", str(ref), str(cand), "--device", device, "--backend", "triton"]) == rc, name
        assert capsys.readouterr().out.splitlines() == lines, name
    assert eh.main(["check", str(ref), str(cand), "--device", "cpu", "--backend", "triton", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error_kind"] == "reward_hack"   # --json is unchanged


def test_newcomer_console_says_why_a_round_trained_nothing():
    import kernelzero as kz
    cfg = kz.Config(preset="tiny", device="cpu", backend="triton", api_sets_per_round=2, group_size_proposer=2,
                    group_size=4, modules_per_round=2)
    idle = {"round": 0, "pool_size": 4, "proposer/valid_frac": 0.0, "proposer/invalid": {"format": 3, "lint: runs": 1},
            "proposer/frac_reward_zero_std": 1.0, "proposer/reward_mean": -1.0, "coder/errors": {"format": 8},
            "coder/pass_rate": 0.0, "coder/frac_reward_zero_std": 1.0, "coder/reward_mean": 0.0, "time/round": 300.0}
    lines = kz.console_line(idle, cfg).splitlines()
    assert lines[1:] == ["  proposer: skipped, all 2 groups zero-std (0/4 valid; 3 format, 1 lint: runs)",
                         "  coder: skipped, all 2 groups zero-std (0/8 correct; 8 format)"]
    assert " kl " not in lines[0] and " gpu " not in lines[0]   # kl_coef 0, no GPU: nothing to show
    trained = {**idle, "proposer/valid_frac": 0.5, "proposer/invalid": {"format": 2}, "proposer/unique_valid": 2,
               "proposer/p_mean": 0.25, "proposer/frac_reward_zero_std": 0.0, "proposer/loss": 0.1,
               "coder/errors": {"ok": 1, "format": 5, "compile": 2}, "coder/frac_reward_zero_std": 0.5,
               "coder/loss": 0.01}
    assert kz.console_line(trained, cfg).splitlines()[1:] == [
        "  proposer: updated on 2 of 2 groups (2/4 valid; 2 format; probe pass rate 0.25)",
        "  coder: updated on 1 of 2 groups (1/8 correct; 5 format, 2 compile)"]
    assert kz.console_line({**idle, "coder/errors": {}}, cfg).endswith("coder: skipped, the pool is empty")


def test_newcomer_plot_says_what_it_leaves_out(tmp_path, capsys):
    import kernelzero as kz
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "metrics.jsonl").write_text("")
    assert kz.cli(["plot", str(empty)]) is None   # no blank panels: a sentence instead
    assert "has no rounds yet" in capsys.readouterr().out
    for argv in (["plot", str(tmp_path / "missing")], ["plot"]):
        code, err = _usage_error(kz, capsys, argv)
        assert code == 2 and len(err.splitlines()) == 1 and ("does not exist" in err or "usage" in err), err
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"round": r, "coder/pass_rate": 0.1 * r, "coder/kl": 0.0, "proposer/kl": 0.0, "coder/clip_frac": 0.0}
            for r in range(3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    import matplotlib.figure
    saved = []
    with pytest.MonkeyPatch.context() as mp:
        real = matplotlib.figure.Figure.savefig
        mp.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: saved.append(fig) or real(fig, *a, **k))
        assert kz.cli(["plot", str(run)]) == str(run / "metrics.png")
    out = capsys.readouterr().out
    assert "KL (k3) (0 throughout)" in out and "Rewards (no data)" in out
    (run / "config.json").write_text(json.dumps({"kl_coef": 0.0, "ppo_epochs": 1}))   # zero by configuration
    kz.cli(["plot", str(run)])
    assert "KL (k3) (kl_coef 0)" in capsys.readouterr().out
    drawn = [ax for ax in saved[0].axes if ax.axison]
    assert [ax.get_title() for ax in drawn] == ["Coder pass rate"]   # the one panel that changes
    ticks = [t for t in drawn[0].get_xticks() if 0 <= t <= 2]
    assert ticks and all(float(t).is_integer() for t in ticks)   # whole rounds only


def test_newcomer_cpu_default_starts_from_shipped_pairs_and_says_its_plan(tmp_path, capsys, monkeypatch):
    """The CPU default needs no SFT pair generation (the verified pairs ship with the repo), keeps its short SFT
    apart from a GPU run's, and says what it will do, about how long it takes and where the results go before any
    work starts."""
    import torch

    import kernelzero as kz
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: no CPU fallback")
    monkeypatch.setattr(config, "model_problem", lambda name: None)   # SmolLM2 need not be installed for the plan
    cfg = kz.parse_config(["--run-dir", str(tmp_path / "run")])
    assert cfg.device == "cpu" and cfg.backend == "triton" and cfg.coder_model == "smollm2"
    assert kz.os.path.isfile(cfg.sft_data) and cfg.sft_dir and "cpu" in cfg.sft_dir
    # SFT never teaches an answer cut off by the completion budget: only kernels that fit are trained on
    assert cfg.sft_fit and cfg.group_size >= 2 and cfg.modules_per_round * cfg.group_size >= 4
    # small on disk: adapters in the SFT folder and the checkpoints, not whole models with their AdamW state
    assert cfg.lora_rank > 0 and not cfg.sft_merged and cfg.lean_rollouts and "lora" in cfg.sft_dir

    class Started(Exception):
        pass

    def stop(*a, **k):
        raise Started
    monkeypatch.setattr(kz, "sft_warm_start", stop)
    capsys.readouterr()
    with pytest.raises(Started):
        kz.main(cfg)
    out = capsys.readouterr().out
    assert f"about {kz.CPU_DEFAULT_MINUTES} min" in out and str(tmp_path / "run") in out and "SFT" in out


def test_newcomer_eval_checks_only_the_model_it_loads(tmp_path, capsys, monkeypatch):
    """`eval` loads the Coder only: a Proposer that is not installed must not stop it, a missing Coder must."""
    import kernelzero as kz
    ran = []
    monkeypatch.setattr(kz, "run_eval", lambda cfg, attempts: ran.append(cfg.coder_model))
    kz.cli(["eval", "--preset", "tiny", "--proposer-model", "./not_installed", "--run-dir", str(tmp_path)])
    assert ran == ["tiny"]
    code, err = _usage_error(kz, capsys, ["eval", "--preset", "tiny", "--coder-model", "./not_there",
                                          "--run-dir", str(tmp_path)])
    assert code == 2 and "--coder-model ./not_there" in err and ran == ["tiny"]


def test_newcomer_round_legend_and_timers_name_what_they_measured():
    """The legend explains every field of the round line; the timers say what they timed, and the harness's own
    work (which overlaps generation) is reported as worker time instead of a misleading 0.0 s."""
    import kernelzero as kz
    line = kz.console_line({"round": 0, "pool_size": 4, "time/round": 10.0}, kz.Config(device="cpu"))
    fields = ["proposer valid", " p ", "reward", "+0", "pool", "coder pass", "zero-std", "loss", "clip"]
    assert all(f in line.splitlines()[0] for f in fields)
    for word in ("valid", "p ", "reward", "+N", "pool", "pass", "zero-std", "loss", "clip", "wall time", '"-"'):
        assert word in kz.ROUND_LEGEND, word
    text = kz.phases_line({"proposer_gen": 12.0, "validate": 3.0, "coder_gen": 40.0, "coder_eval": 0.0},
                          {"coder/harness_s": {"compile": 5.0, "run": 20.5}})
    assert "coder_eval" not in text and "Coder writes kernels 40.0s" in text and "then waits for the harness 0.0s" in text
    assert "harness workers busy 25.5s on the coder kernels" in text


def test_newcomer_summary_says_what_trained_and_what_changed():
    import kernelzero as kz
    cfg = kz.Config(device="cpu", sft=True)
    sft = {"coder": [2.0, 1.5, 1.0, 0.5], "proposer": [1.0, 0.9], "batch": 2}
    flat = {"round": 0, "proposer/frac_reward_zero_std": 1.0, "coder/frac_reward_zero_std": 1.0,
            "coder/errors": {"format": 3, "compile": 1}}
    text = kz.run_summary([flat], sft, cfg, "cpu")
    assert "SFT trained the Coder: 4 steps of 2, loss 2.000 -> 1.000" in text
    assert "the Coder was updated with a gradient in 0 of 1 round(s); in 1 every group had equal rewards" in text
    assert "So RL changed nothing: the final models are the SFT warm start" in text
    assert "0 correct kernel(s) of 4" in text and "does not show that the method improves a Coder" in text
    trained = {**flat, "coder/frac_reward_zero_std": 0.5, "coder/loss": 0.1, "coder/errors": {"ok": 1, "format": 3}}
    text = kz.run_summary([flat, {**trained, "round": 1}], None, kz.Config(device="cuda", sft=False), "cuda")
    assert "the Coder was updated with a gradient in 1 of 2 round(s)" in text and "changed nothing" not in text
    assert "CPU run" not in text


def test_newcomer_plot_tells_series_apart_at_one_round_and_draws_the_sft_loss(tmp_path):
    """One round: every series of a panel is a single point, so colour and marker (not line style) must tell them
    apart; the SFT loss has its own panel, by step."""
    import matplotlib.figure

    import kernelzero as kz
    run = tmp_path / "run"
    run.mkdir()
    row = {"round": 0, "coder/frac_reward_zero_std": 1.0, "proposer/frac_reward_zero_std": 1.0,
           "coder/duplicate_frac": 0.0, "coder/pass_rate": 0.0}
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    (run / "sft_losses.json").write_text(json.dumps({"coder": [2.0, 1.0, 0.5], "proposer": [1.0, 0.8, 0.7]}))
    saved = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: saved.append(fig))
        kz.cli(["plot", str(run)])
    axes = {ax.get_title(): ax for ax in saved[0].axes if ax.axison}
    sft = axes["SFT loss (before the rounds)"]
    assert [list(ln.get_ydata()) for ln in sft.lines] == [[2.0, 1.0, 0.5], [1.0, 0.8, 0.7]]
    assert sft.get_xlabel() == "SFT step"
    lines = axes["Zero-std groups, duplicate kernels"].lines
    assert len(lines) == 3
    assert len({ln.get_color() for ln in lines}) == 3 and len({ln.get_marker() for ln in lines}) == 3
    assert lines[1].get_markerfacecolor() == "none" and lines[1].get_markersize() > lines[0].get_markersize()
    labels = [t.get_text() for t in axes["Zero-std groups, duplicate kernels"].get_legend().get_texts()]
    assert labels == ["coder/frac_reward_zero_std", "proposer/frac_reward_zero_std", "coder/duplicate_frac"]
