"""Tests for bench.py: attention, rollout, train and the processes section on the CPU (tiny models; the numbers come
from the H200), the rollout profile, the forced full-length generate and the greedy check."""
import copy
import dataclasses
import json
import time

import pytest
import torch

import bench
import kernelzero as kz
from plumbing import evaluation
from plumbing.console import gpu_peak_mb

_BENCH_CPU = torch.device("cpu")


def _bench_run(tmp_path, *argv):
    bench.main(bench.parse_args([*argv, "--out", str(tmp_path)]))
    return [json.loads(line) for line in open(tmp_path / "bench.jsonl")]


def test_bench_attention_cpu_times_each_variant_and_checks_it_against_float64(tmp_path):
    """bench.py attention on the CPU: a record per variant with its median time and its error against a float64
    reference (fp32 here: far below bf16's 1e-3)."""
    rows = _bench_run(tmp_path, "attention", "--attention-models", "qwen-tiny-shape", "--attention-batches", "2",
                      "--attention-cache", "64", "--attention-filled", "48", "--attention-reps", "2",
                      "--attention-variants", "sdpa_gqa,sdpa_gqa_compiled")
    assert [(r["section"], r["variant"]) for r in rows] == [("attention_step", "sdpa_gqa"),
                                                           ("attention_step", "sdpa_gqa_compiled")]
    for r in rows:
        assert r["model"] == "qwen-tiny-shape" and r["batch"] == 2 and r["layers"] == 2 and r["floor_ms"] is None
        assert 0 < r["min_ms"] <= r["ms_per_step"] <= r["max_ms"] and r["rel_err"] < 1e-5
    with pytest.raises(SystemExit, match="attention-variants"):
        _bench_run(tmp_path, "attention", "--attention-variants", "flash")


def _bench_tiny_policy(name="tiny"):
    kcfg = bench.trainer_config(_BENCH_CPU)
    return bench.bench_policy(name, kcfg, _BENCH_CPU), kcfg


def _bench_prompts(n):
    tasks = evaluation.load_tasks(1)
    return [kz.coder_prompt(tasks[i][1], "triton", False) for i in range(n)]


def test_bench_rollout_cpu_writes_records_with_full_length_and_greedy_identity(tmp_path):
    rows = _bench_run(tmp_path, "rollout", "--rollout-models", "tiny", "--rollout-batches", "1,2", "--rollout-new-tokens", "8",
               "--baseline-new-tokens", "4", "--greedy-batch", "2", "--greedy-new-tokens", "6",
               "--greedy-update-lr", "1e-2")
    rollouts = [r for r in rows if r["section"] == "rollout"]
    assert [r["batch"] for r in rollouts] == [1, 2]
    for r in rollouts:
        assert r["model"] == "tiny" and r["gpu"] is None and r["ours"]["peak_gb"] is None and r["attention"] == "sdpa_gqa"
        assert r["ours"]["new_tokens"] == r["batch"] * 8   # EOS masked: every completion is full length
        assert r["ours_tok_s"] > 0 and r["plain_tok_s"] > 0 and r["plain"]["decode_ms"] >= 0
        assert r["speedup"] == pytest.approx(r["ours_tok_s"] / r["plain_tok_s"])
        assert r["plain"]["prompt_len"] % kz.PRESETS["tiny"]["prompt_bucket"] == 0
    (greedy,) = [r for r in rows if r["section"] == "greedy"]
    assert greedy["match_before"] and greedy["match_after"] and greedy["agree_after"] == 1.0
    assert greedy["weights_changed_output"] and not greedy["stale"]   # the update moved the output: not vacuous


def test_bench_rollout_cpu_random_qwen_shape_attention_on_and_off(tmp_path):
    rows = _bench_run(tmp_path, "rollout", "--rollout-models", "qwen-tiny-shape", "--rollout-batches", "2",
               "--rollout-new-tokens", "6", "--baseline-new-tokens", "2", "--greedy-batch", "0",
               "--rollout-attention", "sdpa_gqa,sdpa")
    *rollouts, ratio = rows
    assert [(r["section"], r["attention"]) for r in rollouts] == [("rollout", "sdpa_gqa"), ("rollout", "sdpa")]
    for r in rollouts:
        assert r["model"] == "qwen-tiny-shape" and r["ours"]["new_tokens"] == 12
    assert ratio["section"] == "attention" and ratio["batch"] == 2
    ms = {r["attention"]: r["ours_ms_per_step"] for r in rollouts}
    assert ratio["attention"] == "sdpa_gqa"
    assert ratio["ms_per_step"] == pytest.approx(ms["sdpa_gqa"]) and ratio["sdpa_ms_per_step"] == pytest.approx(ms["sdpa"])
    assert ratio["ratio"] == pytest.approx(ms["sdpa"] / ms["sdpa_gqa"])
    with pytest.raises(SystemExit, match="rollout-attention"):
        _bench_run(tmp_path, "rollout", "--rollout-models", "qwen-tiny-shape", "--rollout-attention", "flash")
    policy, _ = _bench_tiny_policy("qwen-tiny-shape")
    assert type(policy.model).__name__ == "Qwen2ForCausalLM" and policy.model.config.num_key_value_heads == 2
    assert policy.model.config.tie_word_embeddings and policy.sampler is policy.model   # CPU: no bf16 copy
    assert policy.sampler.config._attn_implementation == "sdpa_gqa"   # the trainer's default
    policy, _ = _bench_tiny_policy("qwen-tiny-shape")
    assert type(policy.model).__name__ == "Qwen2ForCausalLM" and policy.model.config.num_key_value_heads == 2
    assert policy.model.config.tie_word_embeddings and policy.sampler is policy.model   # CPU: no bf16 copy


def test_bench_rollout_profile_skipped_on_cpu_and_its_window_holds_exactly_the_steps(tmp_path, capsys):
    rows = _bench_run(tmp_path, "rollout", "--rollout-models", "qwen-tiny-shape", "--rollout-batches", "1",
                      "--rollout-new-tokens", "4", "--baseline-new-tokens", "2", "--greedy-batch", "0",
                      "--rollout-profile")
    assert "rollout profile: skipped" in capsys.readouterr().out
    assert [r["section"] for r in rows] == ["rollout"]
    assert bench.parse_args(["rollout"]).rollout_profile is False   # a real flag, not type=bool
    # the profiling itself (CPU activities only here): the window spans `steps` decode steps, one sample each
    policy, kcfg = _bench_tiny_policy()
    res, prof = bench.profile_decode(policy, _bench_prompts(2), dataclasses.replace(kcfg, max_new_tokens=20,
                                                                                    gen_batch_size=2), 5, warm=3)
    assert sum(e.name == "aten::multinomial" for e in prof.events()) == 5
    assert res["steps"] == 5 and res["wall_ms_per_step"] > 0 and res["top"] == [] and res["gpu_busy"] == 0


def test_bench_train_cpu_writes_records(tmp_path):
    rows = _bench_run(tmp_path, "train", "--train-models", "tiny", "--train-seqs", "4", "--train-seq-len", "48",
               "--train-prompt-len", "16", "--train-steps", "1", "--train-micro-batch", "2",
               "--train-logprob-chunk", "0,20", "--train-lora", "0,4")   # 32 completion tokens: chunks of 20 and 12
    assert rows[0]["section"] == "matmul" and rows[0]["tflops"] is None   # GPU-only
    trains = [r for r in rows if r["section"] == "train"]
    assert [(r["lora_rank"], r["grad_ckpt"], r["logprob_chunk"]) for r in trains] == [
        (lora, ckpt, chunk) for lora in (0, 4) for ckpt in ("off", "on") for chunk in (0, 20)]
    params = sum(p.numel() for p in _bench_tiny_policy()[0].model.parameters())
    # layers x rank x (in + out) summed over q, o; k, v (2 K/V heads of 16); gate, up, down
    adapters = 2 * 4 * (2 * (64 + 64) + 2 * (64 + 32) + 3 * (64 + 192))
    for r in trains:
        n = params + adapters * (r["lora_rank"] > 0)
        assert r["micro_batch"] == 2 and r["params"] == n and r["step_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(4 * 48 / r["step_s"])
        assert r["tflops"] == pytest.approx((4 if r["lora_rank"] else 6) * n * 4 * 48 / r["step_s"] / 1e12)
        assert r["peak_gb"] is None and r["frac_of_matmul"] is None


def test_bench_forced_generate_masks_eos_and_restores_generate():
    policy, kcfg = _bench_tiny_policy()
    enc = bench.encode(policy.tok, _bench_prompts(1), kcfg)
    kw = dict(input_ids=enc.input_ids, attention_mask=enc.attention_mask, do_sample=False,
              pad_token_id=policy.tok.pad_token_id)
    first = int(policy.model.generate(**kw, max_new_tokens=1)[0, -1])
    stopped = policy.model.generate(**kw, max_new_tokens=5, eos_token_id=first)   # its first token is the EOS
    assert stopped.shape[1] == enc.input_ids.shape[1] + 1
    with bench.forced_generate(policy.model):
        full = policy.model.generate(**kw, max_new_tokens=5, eos_token_id=first)
    assert full.shape[1] == enc.input_ids.shape[1] + 5 and first not in full[0, enc.input_ids.shape[1]:].tolist()
    assert "generate" not in vars(policy.model)   # the method is back


def test_bench_greedy_check_catches_a_rollout_path_that_keeps_old_weights(monkeypatch):
    """A compiled decode that kept its own copy of the weights would sample from the old policy: simulate it."""
    policy, kcfg = _bench_tiny_policy()
    cfg = bench.Config(greedy_new_tokens=6, greedy_update_lr=1e-2)
    real_rollout, frozen = kz.rollout, []

    def stale_rollout(model, tok, prompts, kcfg, sampler=None, desc=""):
        frozen.append(frozen[0] if frozen else copy.deepcopy(sampler))   # the sampler as it was at the first call
        with bench.forced_generate(frozen[-1]):   # (greedy_check runs rollout at temperature 0)
            return real_rollout(model, tok, prompts, kcfg, frozen[-1])
    monkeypatch.setattr(kz, "rollout", stale_rollout)
    res = bench.greedy_check(policy, _bench_prompts(2), kcfg, cfg, _BENCH_CPU)
    assert res["match_before"] and res["weights_changed_output"]
    assert not res["match_after"] and res["stale"]


def test_bench_host_cpu_sampler_sees_a_busy_core_and_summarises():
    """The round's CPU record: fractions of all cores in [0, 1], a spinning thread shows up as busy time, and the
    summary's mean and share of periods over 90%."""
    import threading
    import time
    samples, stop = [], threading.Event()
    sampler = threading.Thread(target=bench.sample_host_cpu, args=(samples, stop, 0.05), daemon=True)
    sampler.start()
    end = time.monotonic() + 0.4
    while time.monotonic() < end:   # one core busy
        sum(range(1000))
    stop.set()
    sampler.join()
    assert len(samples) >= 3 and all(0.0 <= x <= 1.0 for x in samples) and max(samples) > 0
    assert bench.busy_summary([0.5, 0.95, 1.0], "cpu") == {"cpu_busy_mean": 0.817, "cpu_busy_over_90pct": 0.667}
    assert bench.busy_summary([], "gpu") == {"gpu_busy_mean": None, "gpu_busy_over_90pct": None}


def test_bench_slot_occupancy_sums_phases_and_waits():
    """The round's slot occupancy: every candidate's phases plus its GPU and memory waits, over slots x seconds;
    a duplicate's empty details count nothing; no candidates or no time: None."""
    one = {"phase_s": {"startup": 0.1, "reference": 0.3, "run": 0.4}, "gpu_wait_s": 0.2}
    assert bench.slot_occupancy([one, {**one, "mem_wait_s": 0.5}, {}], 2, 1.5) == 0.833   # 2.5 / 3.0
    assert bench.slot_occupancy([], 8, 10.0) is None and bench.slot_occupancy([one], 8, 0.0) is None


def test_bench_stretches_group_by_phase_and_skip_older_harnesses():
    """The round's line on the candidates' longest shared-turn stretches: grouped by what they did, counted, median
    and largest; candidates of an older harness (no such detail) are left out, and a run with none says so."""
    line = bench.stretches([[0.1, "run"], [0.4, "timing"], [None, None], [0.3, "run"], [0.2, "run"]])
    assert line == "longest shared stretches run 3 x median 0.200 max 0.300 s, timing 1 x median 0.400 max 0.400 s"
    assert bench.stretches([[None, None]]).endswith("not reported")


def test_bench_gate_closed_sums_the_gpus_and_knows_older_harnesses():
    """The round's closed share reads every GPU gate's closed_s; an Evaluator whose pools have not started, or an
    older harness whose gates do not count, gives None (not 0: that would claim the GPU was never closed)."""
    import types
    import harness.processes as hp
    one, two = hp.Gate(), hp.Gate()
    one.closed_s, two.closed_s = 1.5, 0.25
    assert bench.gate_closed_s(types.SimpleNamespace(gates={0: one, 1: two})) == 1.75
    assert bench.gate_closed_s(types.SimpleNamespace(gates={})) is None
    assert bench.gate_closed_s(types.SimpleNamespace(gates={0: types.SimpleNamespace(shared=0)})) is None


def test_bench_gpu_peak_is_the_largest_stage_peak():
    """A candidate's peak GPU memory is the largest stage peak (not the reserved bytes, not the last stage's); no
    GPU stage: None."""
    details = {"gpu_mb": {"load_reference": [47616, 50180], "check_correctness": [62466, 62468],
                          "time_candidate": [10, 62468]}}
    assert gpu_peak_mb(details) == 62466
    assert gpu_peak_mb({}) is None and gpu_peak_mb({"gpu_mb": {}}) is None


def test_bench_gpu_sampler_reads_nvidia_smi_lines_and_stops(tmp_path):
    """The round's GPU record: nvidia-smi's utilization lines (percent) as fractions, "[N/A]" skipped, the query
    asked for one GPU in a loop, and the sampler's nvidia-smi killed once the run stops; no nvidia-smi: no samples."""
    import threading
    smi, args = tmp_path / "fake-smi", tmp_path / "args"
    smi.write_text(f"#!/bin/sh\necho \"$@\" > {args}\nprintf '12\\n95\\n[N/A]\\n100\\n'\nexec sleep 30\n")
    smi.chmod(0o755)
    samples, stop = [], threading.Event()
    sampler = threading.Thread(target=bench.sample_gpu_busy, args=(samples, stop, 0.25, str(smi)), daemon=True)
    sampler.start()
    deadline = time.monotonic() + 10
    while len(samples) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()   # (the fake prints nothing more: the sampler ends only because its nvidia-smi is killed)
    sampler.join(10)
    assert not sampler.is_alive() and samples == [0.12, 0.95, 1.0]
    assert "--query-gpu=utilization.gpu" in args.read_text() and "--loop-ms=250" in args.read_text()
    nothing = []
    bench.sample_gpu_busy(nothing, threading.Event(), 0.25, str(tmp_path / "absent"))
    assert nothing == []


def test_bench_processes_cpu_times_forked_children_and_syncing_processes(tmp_path):
    """bench.py's processes section on the CPU (the numbers come from the H200): per environment variant, a record per
    concurrency with every forked child accounted for (none failed), and one per count of syncing processes, each
    process's median there."""
    cfg = bench.Config(out=str(tmp_path), processes_children=4, processes_at_once="1,3", processes_syncing="1,2",
                       processes_sync_reps=20, processes_env=";KZ_BENCH_PROBE=1")
    bench.bench_processes(cfg, device="cpu")
    assert "KZ_BENCH_PROBE" not in bench.os.environ   # (a variant's environment is restored)
    rows = [json.loads(line) for line in open(tmp_path / "bench.jsonl")]
    life = [r for r in rows if r["section"] == "processes_lifecycle"]
    sync = [r for r in rows if r["section"] == "processes_sync" and r["env"] == "as is"]
    assert [(r["env"], r["at_once"], r["children"], r["failed"]) for r in life] == [
        ("as is", 1, 4, 0), ("as is", 3, 4, 0), ("KZ_BENCH_PROBE=1", 1, 4, 0), ("KZ_BENCH_PROBE=1", 3, 4, 0)]
    assert all(r["wall_s"] > 0 and r["ms_per_child"] == pytest.approx(r["wall_s"] / 4 * 1e3) for r in life)
    assert [(r["processes"], len(r["per_process_ms"])) for r in sync] == [(1, 1), (2, 2)]
    assert all(0 < r["median_ms"] < 1000 for r in sync)


def test_bench_processes_counts_a_child_that_fails():
    """A child whose op fails (a device that does not exist) is counted, not lost: the floor is only a floor if
    every child did its work."""
    ctx = bench.multiprocessing.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=bench.process_lifecycles, args=("no_such_device", 2, 2, results))
    proc.start()
    wall, failed = results.get(timeout=120)
    proc.join()
    assert failed == 2 and wall > 0


def test_bench_kernelbench_cpu_private_and_server_runs_agree_and_are_labelled(tmp_path, monkeypatch):
    """Section (g) on the CPU, on two small tasks in an official checkout's layout: each run's verdicts as the
    candidates were made (a correct copy then a PyTorch fallback, an off-by-one copy, one raising, then our ReLU
    solution for the task named as official ReLU, and, mapped here to the Add task too, where it fails), the server's
    run equal to the private one, the one verdict unlike its label recorded with its error, a record per run and one
    for the section."""
    from tests.common import ADD_TASK, RELU_TASK
    level = tmp_path / "KernelBench" / "level1"
    level.mkdir(parents=True)
    (level / "19_ReLU.py").write_text(RELU_TASK)
    (level / "2_Add.py").write_text(ADD_TASK)
    monkeypatch.setitem(bench.KB_GOLDEN, "2_Add", "001_Relu")   # (one input where Add takes two: a TypeError)
    cfg = bench.Config(out=str(tmp_path), kb_dir=str(tmp_path), kb_tasks=2, kb_samples=4, kb_runs="private,server",
                       gpu_workers=2)
    bench.bench_kernelbench(cfg, "t")
    records = {r["section"]: r for r in map(json.loads, open(tmp_path / "bench.jsonl"))}
    summary = records["kernelbench"]
    assert summary["tasks"] == ["19_ReLU", "2_Add"]
    verdicts = ["reward_hack", "mismatch", "runtime", "ok", "reward_hack", "mismatch", "runtime", "runtime"]
    assert summary["private0"]["kinds"] == summary["server1"]["kinds"] == verdicts
    assert summary["private0"]["checks"] == summary["server1"]["checks"]
    assert summary["private0"]["checks"][0] == "pytorch_fallback"
    assert summary["server1"]["served"] == 8 and summary["private0"]["served"] == 0
    for run in ("private0", "server1"):   # (JSON keys: strings)
        assert list(summary[run]["unexpected"]) == ["7"] and "runtime: " in summary[run]["unexpected"]["7"]
        assert "argument" in summary[run]["unexpected"]["7"]
    assert "kernelbench_private0" in records and "kernelbench_server1" in records
