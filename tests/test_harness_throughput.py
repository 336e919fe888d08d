"""Tests: harness throughput: memory admission, the bounded output tail of a worker, trial inputs made on the GPU,
the trainer's shorter timing, workers booted ahead."""
import os
import sys
import threading
import time

import eval_harness as eh
import harness.compare as hc
import harness.instrumentation as hi
import harness.processes as hp
import harness.timing as ht
import harness.verdict as hv
import harness.worker as hw
from tests.common import stand_in_cuda_events


def _t():
    from tests import common as t
    return t


def test_harness_memory_admission_waits_and_never_deadlocks():
    """Memory admits a job when its bytes fit, or alone when nothing else runs (a job larger than the budget)."""
    mem = hp.Memory(100, {0: 50})
    a = mem.acquire({"host": 60, 0: 10})
    got = []
    waiter = threading.Thread(target=lambda: got.append(mem.acquire({"host": 60})))
    waiter.start()
    time.sleep(0.3)
    assert not got   # 60 + 60 > 100: waits
    mem.release(a)
    waiter.join(5)
    assert got == [{"host": 60, "counted": True}]
    mem.release(got[0])
    huge = mem.acquire({"host": 10**12, 0: 10**12})   # larger than the budget: admitted alone, capped
    assert huge == {"host": 100, 0: 50, "counted": True}
    mem.release(huge)
    # a reference server's bytes are held while its candidates run, but are no running job: one of its candidates
    # that does not fit beside them still runs when nothing else does (else each would wait for the other)
    served = mem.acquire({"host": 70}, counted=False)
    candidate = mem.acquire({"host": 60})
    assert mem.free["host"] == -30 and mem.running == 1
    mem.release(candidate)
    # once its trials are made the server keeps less (shrink: never more than granted), and a job waiting for the
    # bytes it gave back is admitted
    got = []
    waiter = threading.Thread(target=lambda: got.append(mem.acquire({"host": 50, 0: 10})))
    other = mem.acquire({"host": 20})   # (a running job: the waiter must fit, not run alone)
    waiter.start()
    time.sleep(0.3)
    assert not got   # 70 + 20 + 50 > 100
    served = mem.shrink(served, {"host": 25, 0: 99})
    waiter.join(5)
    assert served == {"host": 25, "counted": False} and got == [{"host": 50, 0: 10, "counted": True}]
    for granted in (got[0], other, served):
        mem.release(granted)
    assert mem.free == {"host": 100, 0: 50} and mem.running == 0


def test_harness_memory_is_first_come_first_served_and_defers_what_waits_for_a_server():
    """A job that fits waits behind an earlier one that does not (a large job is not passed forever); with `defer`, a
    job that could fit only once a reference server has ended is refused at once (None), one that waits for counted
    jobs alone still waits and is admitted."""
    mem = hp.Memory(100, {})
    running = mem.acquire({"host": 60})
    got = []
    big = threading.Thread(target=lambda: got.append(mem.acquire({"host": 70})))
    big.start()
    time.sleep(0.2)
    small = threading.Thread(target=lambda: got.append(mem.acquire({"host": 30})))
    small.start()
    time.sleep(0.3)
    assert got == []   # 60 + 30 fits, but the 70 asked first
    mem.release(running)
    big.join(5), small.join(5)
    assert got == [{"host": 70, "counted": True}, {"host": 30, "counted": True}]
    for granted in got:
        mem.release(granted)
    server = mem.acquire({"host": 50}, counted=False)
    assert mem.acquire({"host": 60}, defer=True) is None   # 60 > 100 - 50: it would wait for the server to end
    assert mem.free["host"] == 50 and mem.running == 0 and not mem.queue
    candidate = mem.acquire({"host": 40}, defer=True)
    got = []
    waiter = threading.Thread(target=lambda: got.append(mem.acquire({"host": 30}, defer=True)))
    waiter.start()
    time.sleep(0.3)
    assert got == []   # 50 + 40 + 30 > 100, but the candidate will end: it waits, not refused
    mem.release(candidate)
    waiter.join(5)
    assert got == [{"host": 30, "counted": True}]
    # without defer, the 60 runs once no counted job does (the server's bytes stay: it is as alone as it can be)
    mem.release(got[0])
    alone = mem.acquire({"host": 60})
    assert mem.free["host"] == -10 and mem.servers["host"] == 50
    mem.release(alone)
    # a server whose process is ending (retire) gives its bytes back soon: a job waits for them, it is not deferred
    retired = mem.retire(server)
    got = []
    waiter = threading.Thread(target=lambda: got.append(mem.acquire({"host": 60}, defer=True)))
    waiter.start()
    time.sleep(0.3)
    assert got == [] and mem.servers == {"host": 0}
    mem.release(retired)
    waiter.join(5)
    assert got == [{"host": 60, "counted": True}]
    mem.release(got[0])
    assert mem.free == {"host": 100} and mem.servers == {"host": 0} and mem.running == 0


def test_harness_gpu_budget_leaves_out_the_workers_contexts():
    """A GPU's admission budget: 85% of what the workers' contexts leave, less the parent's own; a tenth of the GPU
    where the contexts would take it all."""
    gib = 2**30
    assert hp.gpu_budget_bytes(80 * gib, 24) == 0.85 * (80 - 24 * 0.75) * gib   # 8 slots: 52.7 GiB
    assert hp.gpu_budget_bytes(80 * gib, 24, own=gib) == hp.gpu_budget_bytes(80 * gib, 24) - gib
    assert hp.gpu_budget_bytes(80 * gib, 0) == 0.85 * 80 * gib
    assert hp.gpu_budget_bytes(16 * gib, 48) == 0.1 * 16 * gib   # 36 GiB of contexts on a 16 GiB GPU


def test_harness_memory_comes_back_once_the_worker_has_ended():
    """A killed worker's admitted bytes come back when its process has ended (a zombie not yet reaped counts), not
    at the kill; a process gone already gives them back at once."""
    import signal
    import subprocess
    mem = hp.Memory(100, {})
    proc = subprocess.Popen(["sleep", "30"])
    hp.release_when_gone(mem, mem.acquire({"host": 80}), proc.pid)
    time.sleep(0.3)
    assert mem.free["host"] == 20   # still running: still counted
    os.kill(proc.pid, signal.SIGKILL)   # (not waited for: a zombie, as a worker before its zygote reaps it)
    deadline = time.time() + 5
    while mem.free["host"] != 100 and time.time() < deadline:
        time.sleep(0.01)
    assert mem.free["host"] == 100 and proc.poll() is not None
    hp.release_when_gone(mem, mem.acquire({"host": 80}), proc.pid)   # reaped just now: gone
    assert mem.free["host"] == 100


def test_harness_memory_budget_serialises_evaluations_and_says_so():
    """With a host budget for about one evaluation at a time, candidates wait for memory (details["mem_wait_s"])
    and still get their verdicts."""
    t = _t()
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False, host_memory_gb=0.3) as ev:
        results = ev.map([(t.RELU_TASK, t.GOOD_RELU), (t.ADD_TASK, t.GOOD_ADD), (t.RELU_TASK, t.WRONG)])
    assert [r.error_kind for r in results] == ["ok", "ok", "mismatch"], [r.error for r in results]
    assert all(r.details["mem_need_mb"][0] > 0 for r in results)
    assert any(r.details.get("mem_wait_s", 0) > 0 for r in results), [r.details.get("mem_wait_s") for r in results]


def test_harness_map_runs_deferred_candidates_after_the_rest_task_by_task(monkeypatch):
    """Candidates Memory refuses in the side-by-side pass (deferred: their memory would fit only once a server has
    ended) are run after it, one task at a time, with their task's own server; verdicts as if never deferred."""
    t = _t()
    acquire = hp.Memory.acquire

    def refused_once(self, need, counted=True, defer=False):   # every candidate, in the side-by-side pass
        return None if defer and counted else acquire(self, need, counted, defer)
    monkeypatch.setattr(hp.Memory, "acquire", refused_once)
    pairs = [(t.RELU_TASK, t.GOOD_RELU), (t.ADD_TASK, t.GOOD_ADD), (t.RELU_TASK, t.WRONG)]
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False, host_memory_gb=4) as ev:
        results = ev.map(pairs)
    assert [r.error_kind for r in results] == ["ok", "ok", "mismatch"], [r.error for r in results]
    assert all(r.details.get("ran_deferred") and not r.details.get("deferred") for r in results)
    assert [bool(r.details.get("reference_server")) for r in results] == [True, False, True]   # (ADD: one candidate)


def test_harness_server_that_cannot_fit_beside_a_candidate_serves_nobody_and_large_tasks_finish():
    """A reference server whose trials and one candidate's part exceed the budget together serves nobody (each
    candidate would run beside it over the budget): its candidates make their own trials, and say why. With room for
    one server and its candidate but not two servers and a candidate, two such tasks still finish, whichever way
    their jobs interleave (deferred or not), and all memory comes back."""
    t = _t()
    big = t.RELU_TASK.replace("torch.randn(N)", "torch.randn(2**21)")   # 8 MiB in, 8 out: ~128 MiB of trials kept
    assert big != t.RELU_TASK
    fast = t.GOOD_RELU.replace("1024),)", "65536),)").replace("BLOCK=1024", "BLOCK=65536")   # (32 programs)
    # a candidate's part ~384 MiB (its outputs, copies, the flush), the server keeps ~128: 430 fits one, not both
    pairs = [(big, fast), (big, t.WRONG), (t.RELU_TASK, t.GOOD_RELU), (t.RELU_TASK, t.WRONG)]
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False, host_memory_gb=0.42) as ev:
        results = ev.map(pairs)
    assert [r.error_kind for r in results] == ["ok", "mismatch", "ok", "mismatch"], [r.error for r in results]
    assert [bool(r.details.get("reference_server")) for r in results] == [False, False, True, True]
    assert all("do not fit the memory budget" in r.details["no_server"] for r in results[:2])
    other = big.replace("torch.relu(x)", "torch.relu(x) + 0.0")
    pairs = [(big, fast), (other, t.WRONG), (big, t.WRONG), (other, fast), (t.RELU_TASK, t.GOOD_RELU)]
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False, host_memory_gb=0.55) as ev:
        results = ev.map(pairs)
    assert [r.error_kind for r in results] == ["ok", "mismatch", "mismatch", "ok", "ok"], [r.error for r in results]
    assert not any(r.details.get("no_server") for r in results)   # (here one server fits beside a candidate)
    deadline = time.monotonic() + 15   # (bytes come back once each worker's process has ended)
    while ev.memory.free != ev.memory.total and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ev.memory.free == ev.memory.total and ev.memory.running == 0 and not any(ev.memory.servers.values())


def test_harness_memory_estimate_from_meta_inputs():
    """A worker estimates a task's bytes from get_inputs() and the reference's forward on the meta device, before
    any data exists: a reduction's outputs are small, an upsampling's large; where the forward cannot run there (a
    value read on the host) the outputs are taken as large as the inputs, as where no outputs are known at all."""
    torch = eh.torch

    def task(forward, scale: int = 1):
        class Ref:
            class Model(torch.nn.Module):
                def __init__(self, k):
                    super().__init__()
                    self.k = k

                def forward(self, x, n):
                    return forward(self, x, n)

            @staticmethod
            def get_init_inputs():
                return [2]

            @staticmethod
            def get_inputs():
                return [torch.randn(4096, 393216 // scale), 3]   # 6.4 GB, never allocated
        return Ref
    big = 4096 * 393216 * 4
    per_input, per_output = hw._trial_bytes_on_meta(task(lambda m, x, n: x.sum(dim=1) * m.k), eh.DEFAULTS)
    assert (per_input, per_output) == (big, 4096 * 4)
    assert hw._trial_bytes_on_meta(task(lambda m, x, n: x.repeat(1, n), 4), eh.DEFAULTS) == (big // 4, 3 * big // 4)
    assert hw._trial_bytes_on_meta(task(lambda m, x, n: x * x.sum().item()), eh.DEFAULTS) == (big, None)
    half = dict(eh.DEFAULTS, dtype="bfloat16")   # (the harness's dtype option: floating tensors at 2 bytes)
    assert hw._trial_bytes_on_meta(task(lambda m, x, n: x.sum(dim=1)), half) == (big // 2, 4096 * 2)
    host, device = hp.memory_need(per_input, None, eh.DEFAULTS, "cuda")
    assert host >= 4 * per_input and device >= 4 * per_input   # one trial + the heavy one, inputs and outputs
    assert sum(hp.memory_need(per_input, per_output, eh.DEFAULTS, "cuda")) < 0.7 * (host + device)


def test_harness_memory_of_a_served_candidate_counted_from_the_reference_work():
    """With a reference server a candidate's part is counted from the measured reference work (ReLU over 6 GiB:
    54.3 GiB, not the 96.25 GiB bound), never above the bound, and bounded where nothing was measured or the
    trials are not on the GPU; the server keeps its trials, a comparison's temporaries and one input."""
    G = 2**30
    bound = hp.memory_need(6 * G, 6 * G, eh.DEFAULTS, "cuda", True, part="candidate")
    assert bound == (0, 96 * G + 2**28)
    counted = hp.memory_need(6 * G, 6 * G, eh.DEFAULTS, "cuda", True, part="candidate", ref_work=0)
    assert counted == (0, int(1.25 * (42 * G + 5 * 2**28)) + 2**28)   # (a comparison's temporaries: one step's)
    # a reduction with 8 GiB of temporaries (HingeLoss: 4 GiB in, a scalar out), then one whose count would pass
    # the bound
    hinge = hp.memory_need(4 * G, 4, eh.DEFAULTS, "cuda", True, part="candidate", ref_work=8 * G)[1]
    assert hinge == int(1.25 * (8 * G + 20 + 8 * 4 + 16 * G)) + 2**28
    assert hp.memory_need(G, G, eh.DEFAULTS, "cuda", True, part="candidate", ref_work=100 * G) == \
        hp.memory_need(G, G, eh.DEFAULTS, "cuda", True, part="candidate")
    for on_device, device in ((False, "cuda"), (True, "cpu")):   # (ref_work is measured on a GPU only)
        assert hp.memory_need(G, G, eh.DEFAULTS, device, on_device, part="candidate", ref_work=0) == \
            hp.memory_need(G, G, eh.DEFAULTS, device, on_device, part="candidate")
    assert hp.served_need(24 * G, 6 * G, 6 * G) == 39 * G


def test_harness_loud_candidate_keeps_its_verdict_and_the_tail_of_its_output():
    """A correct candidate that prints a lot is still ok (its output is drained, only the tail is kept); a crash's
    message ends with the last thing the worker printed."""
    t = _t()
    loud = t.GOOD_RELU.replace("def forward(self, x):\n", "def forward(self, x):\n        print('x' * 2**20)\n")
    assert loud != t.GOOD_RELU
    crash = t._harness_relu("print('last words before the crash', flush=True)\nimport os\nos._exit(3)")
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False) as ev:
        ok, crashed = ev.map([(t.RELU_TASK, loud), (t.RELU_TASK, crash)])
    assert ok.error_kind == "ok", ok.error
    assert ok.details["output_bytes"] >= 8 * 2**20
    assert crashed.error_kind == "crash" and "last words before the crash" in crashed.error, crashed.error


def test_harness_worker_output_tail_is_bounded():
    """The drain keeps the last TAIL_BYTES of what a worker prints and counts the rest."""
    import collections
    worker = object.__new__(hp.Worker)
    worker.tail, worker.output_bytes = collections.deque(), 0
    r, w = os.pipe()
    total = 50 * hp.Worker.TAIL_BYTES
    writer = threading.Thread(target=lambda: (os.write(w, b"x" * (total - 4) + b"END!"), os.close(w)))
    writer.start()
    worker._drain(os.fdopen(r, "rb"))
    writer.join()
    kept = sum(len(chunk) for chunk in worker.tail)
    assert worker.output_bytes == total and hp.Worker.TAIL_BYTES <= kept < hp.Worker.TAIL_BYTES + 65536
    worker.drain = threading.Thread(target=lambda: None)
    worker.drain.start()
    assert worker.log_tail(6) == "xx" + "END!"


def test_harness_median_ci_width():
    """The adaptive timing's stopping rule: the distribution-free 95% interval of the median, relative to it."""
    assert ht.median_ci_width([1.0] * 20) == 0.0
    noisy = [1.0 + 0.1 * ((i * 7) % 10) for i in range(20)]   # 1.0 .. 1.9
    assert 0.3 < ht.median_ci_width(noisy) < 1.0
    assert ht.median_ci_width(noisy * 10) < ht.median_ci_width(noisy)   # more reps: a narrower interval
    assert eh.DEFAULTS["timing_ci"] == 0.02


def test_harness_trial_draws_stop_at_the_cap():
    """A task whose first draw is over max_trial_gb gets one normal draw and the heavy one: no draw is made beyond
    them (each of an official level-1 task's draws takes 6.4 GB)."""
    class Big:
        calls = 0

        @staticmethod
        def get_inputs():
            Big.calls += 1
            return [eh.torch.randn(1024)]
    details = {}
    draws = hw._trial_inputs(Big, dict(eh.DEFAULTS, max_trial_gb=2 * 4096 / 2**30), details)
    assert [heavy for _, heavy in draws] == [False, True] and Big.calls == 2 and details["trials_capped"] == 1


def test_harness_trial_inputs_made_under_the_device_context():
    """With a device, get_inputs()'s factory calls make their tensors there (the meta device stands in for the GPU
    here); a tensor the task puts on the CPU explicitly stays there, only floating tensors are cast, and the heavy
    trial is made on the same device."""
    class Ref:
        @staticmethod
        def get_inputs():
            return [eh.torch.randn(8, 4), eh.torch.randint(0, 3, (5,)), eh.torch.ones(2, device="cpu"), 1.5]
    opts = dict(eh.DEFAULTS, dtype="float16")
    draws = hw._trial_inputs(Ref, opts, {}, eh.torch.device("meta"))
    assert len(draws) == opts["trials"] + 1 and draws[-1][1]   # the heavy trial last
    for inputs, _ in draws:
        x, idx, ones, scale = inputs
        assert x.is_meta and x.dtype == eh.torch.float16 and idx.is_meta and idx.dtype == eh.torch.int64
        assert ones.device.type == "cpu" and ones.dtype == eh.torch.float16 and scale == 1.5
    host = hw._trial_inputs(Ref, opts, {})
    assert all(t.device.type == "cpu" for inputs, _ in host for t in inputs[:3])

    class HostOnly:   # (as a task passing a CPU torch.Generator to its factories would fail on the GPU)
        @staticmethod
        def get_inputs():
            if eh.torch.empty(0).device.type != "cpu":
                raise RuntimeError("Expected a 'cuda' device type for generator")
            return [eh.torch.randn(3)]
    details = {}
    draws = hw._trial_inputs(HostOnly, eh.DEFAULTS, details, eh.torch.device("meta"))
    assert all(inputs[0].device.type == "cpu" for inputs, _ in draws) and len(draws) == eh.DEFAULTS["trials"] + 1
    assert "generator" in details["inputs_on_device_failed"]
    assert eh.DEFAULTS["inputs_on_device"]   # (on a GPU; CPU evaluations make their inputs on the host as before)
    per_input = 64 * 2**20
    host_made = hp.memory_need(per_input, per_input, eh.DEFAULTS, "cuda")
    gpu_made = hp.memory_need(per_input, per_input, eh.DEFAULTS, "cuda", inputs_on_device=True)
    assert gpu_made[0] < host_made[0] and gpu_made[1] > host_made[1]   # stored inputs counted where they live
    assert sum(gpu_made) == sum(host_made)


def test_harness_with_options_shares_the_started_workers():
    """with_options sends jobs with other options on the same workers (booted when the Evaluator starts); closing
    the view closes nothing."""
    t = _t()
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False) as ev:
        deadline = time.monotonic() + 120
        while len(ev.pools["cpu"].idle) < 2 and time.monotonic() < deadline:   # forked in the background
            time.sleep(0.1)
        assert len(ev.pools["cpu"].idle) == 2   # booted ahead, before the first candidate
        short = ev.with_options(timing_budget_s=0.25)
        assert short.pools is ev.pools and short.opts["timing_budget_s"] == 0.25
        assert ev.opts["timing_budget_s"] == eh.DEFAULTS["timing_budget_s"]
        assert [r.error_kind for r in short.map([(t.RELU_TASK, t.GOOD_RELU), (t.RELU_TASK, t.WRONG)])] == \
            ["ok", "mismatch"]
        short.close()
        del short
        assert ev.pools is not None and ev.map([(t.RELU_TASK, t.GOOD_RELU)])[0].error_kind == "ok"
        with pytest.raises(TypeError, match="unknown options"):
            ev.with_options(timing_budget=1)


def test_harness_bench_round_compares_variants_in_one_call(tmp_path, monkeypatch, capsys):
    """bench.py's round section runs every ";"-separated --round-timing variant and the baseline on one batch and
    reports verdict and speedup agreement per variant (here on the CPU, two candidates, no timing)."""
    import json
    import bench
    t = _t()
    tags = []
    monkeypatch.setattr(bench, "round_candidates", lambda tag, tasks, samples, failures, backend: tags.append(tag) or [
        (t.RELU_TASK, t.GOOD_RELU, "ok"), (t.RELU_TASK, t.WRONG, "wrong")])
    cfg = bench.Config(out=str(tmp_path), round_tasks=1, round_samples=2, gpu_workers=1,
                       round_timing="inputs_on_device=false;timing_budget_s=0.25,inputs_on_device=true,gpu_workers=2")
    bench.bench_round(cfg, "test")
    rows = [json.loads(line) for line in open(tmp_path / "bench.jsonl")]
    summary = rows[-1]
    second = "timing_budget_s=0.25,inputs_on_device=true,gpu_workers=2"   # (an Evaluator argument, not an option)
    assert [r["section"] for r in rows] == ["round_inputs_on_device=false", "round_" + second, "round_baseline",
                                            "round"]
    assert summary[second]["opts"] == {"timing_budget_s": 0.25, "inputs_on_device": True, "gpu_workers": 2}
    for name in ("inputs_on_device=false", second):
        assert summary[name]["kinds"] == ["ok", "mismatch"]
        assert summary[name]["vs_baseline"]["same_verdicts"] == 2
    assert summary[second]["vs_first"]["same_verdicts"] == 2
    assert summary["baseline"]["gate_closed_frac"] is None   # (the CPU: no GPU gate to be closed)
    opts = bench._round_opts("gpu_workers=16,trials=3,timing_budget_s=0.05,inputs_on_device=false,x=y")
    assert opts == {"gpu_workers": 16, "trials": 3, "timing_budget_s": 0.05, "inputs_on_device": False, "x": "y"}
    assert type(opts["gpu_workers"]) is int and type(opts["trials"]) is int
    assert "verdicts = baseline" in capsys.readouterr().out
    assert len(set(tags[1:])) == 3   # every run's candidates tagged anew: no Triton cache hit from the run before


def test_harness_bench_round_warm_verifies_other_candidates_first(tmp_path, monkeypatch):
    """--round-warm N: each Evaluator verifies N candidates of their own tag before the timed batch (a loop's later
    round), and the timed batch's verdicts are those of a cold run."""
    import json
    import bench
    t = _t()
    tags = []
    monkeypatch.setattr(bench, "round_candidates", lambda tag, tasks, samples, failures, backend: tags.append(tag) or [
        (t.RELU_TASK, t.GOOD_RELU, "ok"), (t.RELU_TASK, t.WRONG, "wrong")])
    cfg = bench.Config(out=str(tmp_path), round_tasks=1, round_samples=2, gpu_workers=1, round_baseline="none",
                       round_warm=1)
    bench.bench_round(cfg, "test")
    summary = [json.loads(line) for line in open(tmp_path / "bench.jsonl")][-1]
    assert summary["new"]["kinds"] == ["ok", "mismatch"] and summary["new"]["warm"] == 1
    assert summary["new"]["warm_s"] > 0
    assert tags == ["test-round", "test-round0", "test-warm0"]   # the warm-up's candidates carry their own tag


def test_harness_bench_round_profiles_the_workers(tmp_path, monkeypatch, capsys):
    """--round-profile: every worker job of a run writes its cProfile file (KZ_WORKER_PROFILE), and the run's merged
    profile is printed with the harness's own stages in it; the variable is gone after the run."""
    import bench
    t = _t()
    monkeypatch.delenv("KZ_WORKER_PROFILE", raising=False)
    monkeypatch.setattr(bench, "round_candidates", lambda tag, tasks, samples, failures, backend: [
        (t.RELU_TASK, t.GOOD_RELU, "ok"), (t.RELU_TASK, t.WRONG, "wrong")])
    # (each candidate makes its own trials: a reference server's profile is written as it is ended, which races
    # with its kill)
    cfg = bench.Config(out=str(tmp_path), round_tasks=1, round_samples=2, gpu_workers=1,
                       round_timing="reference_server=false", round_profile=str(tmp_path / "prof"),
                       round_baseline="none")
    bench.bench_round(cfg, "test")
    files = os.listdir(tmp_path / "prof" / "run0")   # (one run: no baseline)
    assert sum(f.startswith("evaluate-") and f.endswith(".prof") for f in files) == 2, files
    assert not os.path.exists(tmp_path / "prof" / "run1")
    out = capsys.readouterr().out
    assert "2 worker jobs profiled" in out and "_job_evaluate" in out and "_make_trials" in out
    assert "merged.pstats" in out and out.count("evaluate-") == 0   # (the merged file's name, not each job's)
    assert "was called by" in out
    assert "KZ_WORKER_PROFILE" not in os.environ


def test_harness_bench_baseline_directory_runs_its_own_files(tmp_path):
    """--round-baseline DIR with a harness package in DIR: both sides run DIR's files. The parent modules are DIR's
    eval_harness.py and harness/processes.py (loaded under their own names; they never import the worker side); the
    workers boot from DIR, so they import DIR's harness/worker.py and, through it, DIR's eval_harness.py (the copy
    here records both). This checkout's modules stay as they were."""
    import glob
    import shutil
    import bench
    t = _t()
    shutil.copy(os.path.join(t.ROOT, "eval_harness.py"), tmp_path / "eval_harness.py")
    shutil.copytree(os.path.join(t.ROOT, "harness"), tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    os.symlink(os.path.join(t.ROOT, "cuda_ext"), tmp_path / "cuda_ext")
    with open(tmp_path / "harness" / "worker.py", "a") as f:   # each process that imports it leaves a note where from
        f.write("\nimport eval_harness as _eh\n"
                "with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "
                "f'imported-{os.getpid()}'), 'w') as _f:\n    _f.write(_eh.__file__)\n")
    module = bench._harness_module(str(tmp_path))
    assert module is not eh and os.path.dirname(os.path.abspath(module.__file__)) == str(tmp_path)
    assert module.run_job is not hp.run_job
    assert os.path.dirname(module.run_job.__code__.co_filename) == str(tmp_path / "harness")
    assert sys.modules["harness.processes"] is hp and eh.run_job is hp.run_job   # (this checkout's, untouched)
    assert str(tmp_path) not in sys.path and not glob.glob(str(tmp_path / "imported-*"))
    assert not any(getattr(v, "__name__", None) == "harness.worker" for v in vars(module).values())
    result = module.evaluate(t.RELU_TASK, t.GOOD_RELU, backend="triton", device="cpu", trials=1)
    assert result.error_kind == "ok", (result.error, result.details)
    notes = glob.glob(str(tmp_path / "imported-*"))
    assert notes   # (the zygote imported it: its workers are forks of it)
    for note in notes:
        with open(note) as f:
            assert os.path.dirname(os.path.abspath(f.read())) == str(tmp_path)


def test_harness_bench_round_takes_a_models_failing_answers(tmp_path):
    """--round-answers: a task's synthetic wrong/failing candidates (samples 5-7) become a model's failing answers
    from an eval JSON (every sample's answer, or the first one in older files), labelled by their recorded verdict,
    each with a kernel tag of its own; an answer without a code block stays one (format: None); correct answers and
    tasks without failures keep the golden and synthetic candidates."""
    import json
    import bench
    t = _t()
    bad = t.GOOD_RELU.replace("tl.maximum(x, 0.0)", "tl.maximum(x, 1.0)")
    assert bad != t.GOOD_RELU
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"tasks": {
        "001_Relu": {"answers": [f"```python\n{bad}```", "no code here", "```python\n" + t.GOOD_RELU + "```"],
                     "sample_kind": ["mismatch", "format", "ok"]},
        "002_Gelu": {"first_answer": "```python\nimport torch\nx = (\n```", "first_kind": "compile"}}}))
    failures = bench.model_failures(str(path))
    assert [k for _, k in failures["001_Relu"]] == ["mismatch", "format"] and len(failures["002_Gelu"]) == 1
    pairs = bench.round_candidates("t", 3, 8, failures)
    relu, gelu, silu = pairs[:8], pairs[8:16], pairs[16:]
    assert [label for *_, label in relu] == ["ok"] * 5 + ["wrong", "fail", "wrong"]
    assert relu[5][1].replace('    "kz-bench t-001_Relu-5"\n', "").strip() == bad.strip() and relu[6][1] is None
    assert relu[7][1].replace('    "kz-bench t-001_Relu-7"\n', "").strip() == bad.strip()   # (cycled through)
    assert [label for *_, label in gelu][5:] == ["fail"] * 3 and "x = (" in gelu[5][1]
    assert [label for *_, label in silu] == ["ok"] * 5 + ["wrong", "fail", "fail"]   # no answers: synthetic
    assert len({c for _, c, _ in relu[:5]}) == 5   # the golden ones, each tagged differently,
    tagged = [c for _, c, _ in relu + silu if c]   # and no two tagged candidates are one program to the harness's
    assert len({eh._same_code_key(c) for c in tagged}) == len(tagged) == 15   # deduplication (it would run one)


def test_harness_bench_round_cuda_candidates_are_labelled_right_on_the_cpu_checks():
    """--round-backend cuda: golden CUDA solutions, each tagged before its first __global__ (a cold build each), a
    wrong one (one element set: glue, not a fallback), a cut one and one raising after its kernel; the static check
    sees only the cut one (the rest need a GPU to run)."""
    import bench
    pairs = bench.round_candidates("t", 2, 8, backend="cuda")
    assert [label for *_, label in pairs] == (["ok"] * 5 + ["wrong", "fail", "fail"]) * 2
    assert all("// kz-bench t-001_Relu-%d\n__global__" % i in pairs[i][1] for i in range(8) if i != 6)
    assert len({c for _, c, _ in pairs}) == 16 == len({eh._same_code_key(c) for _, c, _ in pairs})
    early = [eh._precheck(c, "cuda") for _, c, _ in pairs]
    assert [e is None for e in early] == ([True] * 6 + [False, True]) * 2, [e and e.error for e in early]
    assert early[6].error_kind in ("compile", "format")


# ----------------------------------------------------------------------------------------------------------------------
# GPU

import pytest  # noqa: E402

_gpu = pytest.mark.skipif(not eh.torch.cuda.is_available(), reason="needs a CUDA GPU")


BIG_TASK = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.{op}(x)

def get_inputs():
    return [torch.randn(4096, 393216)]   # 6.4 GB, the size of official KernelBench level-1 inputs

def get_init_inputs():
    return []
'''


@pytest.mark.gpu
@_gpu
@pytest.mark.skipif(os.environ.get("KZ_HARNESS_BIG") != "1", reason="KZ_HARNESS_BIG=1: minutes, ~100 GB of host memory")
def test_harness_gpu_big_inputs_all_ok_within_memory():
    """8 correct kernels of 6.4 GB-input tasks in one map call all come back ok: admission keeps the host and the
    GPU within memory (some wait for it), and the peak host memory is reported."""
    import resource

    import bench
    t = _t()
    tanh = t.GOOD_RELU.replace("tl.maximum(x, 0.0)", "2.0 * tl.sigmoid(2.0 * x) - 1.0")
    assert tanh != t.GOOD_RELU
    pairs = [(BIG_TASK.format(op="relu"), t.GOOD_RELU)] * 4 + [(BIG_TASK.format(op="tanh"), tanh)] * 4
    start = time.time()
    with eh.Evaluator(backend="triton", progress=False, timing_budget_s=0.5, dedupe=False) as ev:
        results = ev.map(pairs)
    peak = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 2**20
    print(f"8 big candidates: {time.time() - start:.0f} s, peak RSS (parent + largest worker) {peak:.1f} GB, waits",
          [r.details.get("mem_wait_s") for r in results], [r.error_kind for r in results], "peak GPU GiB",
          [round((bench.gpu_peak_mb(r.details) or 0) / 1024, 1) for r in results],
          "trials on", [r.details.get("trials_on") for r in results])
    assert [r.error_kind for r in results] == ["ok"] * 8, [(r.error_kind, r.error[:300]) for r in results]
    assert not any(r.details.get("rerun_alone") for r in results)   # admitted within memory: no out-of-memory first


@pytest.mark.gpu
@_gpu
def test_harness_gpu_inputs_on_device_agree_with_host_inputs():
    """Trial inputs made on the GPU (the default) against host-made ones: the same verdicts and checks, speedups
    within 10%, the trials' inputs said to live on the GPU, and input generation in milliseconds; the job's device
    memory reserved in one block (_reserve_device_memory)."""
    t = _t()
    task = t.GPU_RELU_TASK
    pairs = [(task, t.GOOD_RELU)] * 3 + [(task, t.WRONG), (task, t.CASES["input_mutation"][1]),
                                         (task, t.CASES["cache_by_data_ptr"][1]), (task, t.CASES["stale_memory"][1])]
    runs = {}
    for on_device in (True, False):
        with eh.Evaluator(backend="triton", progress=False, inputs_on_device=on_device, dedupe=False) as ev:
            runs[on_device] = ev.map(pairs)
    gpu, host = runs[True], runs[False]
    verdicts = {on: [(r.error_kind, r.details.get("check")) for r in rs] for on, rs in runs.items()}
    assert verdicts[True] == verdicts[False], verdicts
    assert [r.error_kind for r in gpu[:3]] == ["ok"] * 3
    # each job put its admitted device bytes in its allocator's cache first, and the stale-memory candidate (the
    # last) is still caught: the reserved block is NaN-filled before each candidate call like any free block
    assert all(r.details["reserved_mb"] > 0 for r in gpu + host)
    assert verdicts[True][-1][0] != "ok"
    for g, h in zip(gpu[:3], host[:3]):
        assert g.details["trials_on"] == "cuda" and h.details["trials_on"] == "cpu"
        assert abs(g.speedup / h.speedup - 1) < 0.10, (g.speedup, h.speedup)
    print("ref_inputs_s gpu", [r.details["ref_inputs_s"] for r in gpu[:3]], "host",
          [r.details["ref_inputs_s"] for r in host[:3]], "speedups gpu", [round(r.speedup, 3) for r in gpu[:3]],
          "host", [round(r.speedup, 3) for r in host[:3]])


# gc through a torch module that imported it, by an alias the static check does not follow (it bans importing gc
# and torch.cuda.graphs.gc), called through a library wrapper, so that the worker's audit hook, which notes only the
# candidate's own calls, does not see it either: what the tampering writes is left to the reference's fingerprints
TAMPER_REFERENCE = """
import functools
import torch.cuda.graphs
_graphs = torch.cuda.graphs
_objects = functools.partial(functools.singledispatch(_graphs.gc.get_objects), None)
"""


@pytest.mark.gpu
@_gpu
def test_harness_gpu_candidate_rewriting_the_timing_reference_is_caught():
    """A candidate correct through the trials, then wrong while timed, that copies its output over the reference
    outputs the timing spot checks use (on the GPU since they stopped being copied from the host per check): the
    re-check after timing makes it reward_hack, not ok."""
    t = _t()
    cand = t._harness_relu('''
self.calls += 1
y = torch.empty_like(x)
n = x.numel() if self.calls <= 12 else x.numel() // 2   # after the trials and warm-up: half the output unwritten
relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
if self.calls == 13:
    for o in _objects():
        if type(o) is tuple and len(o) == 2 and isinstance(o[1], torch.Tensor) and o[1].is_cuda \\
                and o[1].shape == y.shape:
            o[1].copy_(y)
return y
''', extra=TAMPER_REFERENCE, init="self.calls = 0")
    assert eh._precheck(cand, "triton") is None   # it gets past the static check
    r = eh.evaluate(t.GPU_RELU_TASK, cand, backend="triton", timing_budget_s=0.25, **eh.FIXED_TIMING)
    assert (r.error_kind, r.details.get("check")) == ("reward_hack", "reference_outputs"), (r.error_kind, r.error)
    # Timed as a CUDA graph no Python runs between reps: the same candidate acts while it is captured, and the copy
    # over the reference outputs becomes part of every replay (the replays then "agree" with the reference)
    captured = t._harness_relu('''
y = torch.empty_like(x)
capturing = torch.cuda.is_current_stream_capturing()
n = x.numel() // 2 if capturing else x.numel()
relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
if capturing:
    for o in _objects():
        if type(o) is tuple and len(o) == 2 and isinstance(o[1], torch.Tensor) and o[1].is_cuda \\
                and o[1].shape == y.shape:
            o[1].copy_(y)
return y
''', extra=TAMPER_REFERENCE)
    assert eh._precheck(captured, "triton") is None
    r = eh.evaluate(t.GPU_RELU_TASK, captured, backend="triton", timing_budget_s=0.25)
    assert (r.error_kind, r.details.get("check")) == ("reward_hack", "reference_outputs"), (r.error_kind, r.error)
    # The trials' reference outputs live on the GPU too (their keyed fingerprints on the host): a candidate that
    # writes its own half-done output over them passes every comparison; the fingerprints after the trials see it
    trial_tamper = t._harness_relu('''
y = torch.empty_like(x)
n = x.numel() // 2
relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
for o in _objects():
    if type(o) is dict and isinstance(o.get("out"), torch.Tensor) and o["out"].is_cuda and o["out"].shape == y.shape:
        o["out"].copy_(y)
return y
''', extra=TAMPER_REFERENCE)
    # A candidate that computes with PyTorch only while its forward is captured for timing (torch's ReLU is faster
    # than this kernel): the capture is recorded like a trial call
    fallback_when_captured = t._harness_relu('''
if torch.cuda.is_current_stream_capturing():
    relu_kernel[(1,)](x, torch.empty_like(x), 1, BLOCK=1024)
    return torch.relu(x)
y = torch.empty_like(x)
relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
return y
''')
    assert eh._precheck(fallback_when_captured, "triton") is None
    r = eh.evaluate(t.GPU_RELU_TASK, fallback_when_captured, backend="triton", timing_budget_s=0.25)
    assert (r.error_kind, r.details.get("check")) == ("reward_hack", "pytorch_fallback"), (r.error_kind, r.error)
    assert eh._precheck(trial_tamper, "triton") is None
    r = eh.evaluate(t.GPU_RELU_TASK, trial_tamper, backend="triton", timing_budget_s=0.25)
    assert (r.error_kind, r.details.get("check")) == ("reward_hack", "reference_outputs"), (r.error_kind, r.error)


def test_harness_lint_determinism_allows_reordered_sums_not_randomness():
    """A task's two runs must agree to a tenth of the candidates' tolerance: a CPU GEMM whose first and second calls
    differ by ~5e-6 relative is deterministic enough; fresh randomness is not."""
    import torch
    x = torch.randn(1000)
    assert hw._repeatable(x, x.clone())
    assert hw._repeatable(x, x * (1 + 5e-6))              # a reordered GEMM sum
    assert not hw._repeatable(x, x * (1 + 1e-4))           # a candidate-sized error is not "the same"
    assert not hw._repeatable(x, torch.randn(1000))        # dropout-like randomness
    ints = torch.arange(10)
    assert hw._repeatable(ints, ints.clone()) and not hw._repeatable(ints, ints + 1)   # integers stay exact


# ---------------------------------------------------------------------------------------------------------------------
# Workers forked from a zygote

def _good_relu_verdict(worker) -> str:
    """The verdict of one job on `worker`: the Triton ReLU candidate that is correct, on the CPU."""
    t = _t()
    job = {"kind": "evaluate", "ref_src": t.RELU_TASK, "cand_src": t.GOOD_RELU, "backend": "triton", "device": "cpu",
           "opts": eh.DEFAULTS}
    return hp.run_job(worker, job, {"startup": 120.0, "reference": 60.0, "compile": 60.0, "run": 60.0}).error_kind


def _hold_output(worker) -> threading.Event:
    """Make `worker`'s output look open (as when a child that escaped its group holds the pipe) until the returned
    event is set."""
    release, output = threading.Event(), worker.drain
    worker.drain = threading.Thread(target=lambda: (release.wait(60), output.join(60)), daemon=True)
    worker.drain.start()
    return release


def test_harness_run_job_lets_go_of_its_worker_in_the_background():
    """run_job returns its verdict without waiting for the worker's output to end (a GPU worker's exit takes up to
    a few hundred ms; a child that escaped the group holds the pipe open for seconds), and the worker is still let
    go of: once its output ends, its pipe is closed and its directory removed. kill() itself waits."""
    pool = hp.Pool(hp.worker_env("cpu", "triton", eh.DEFAULTS, "run"), spare=0)
    try:
        worker = pool.take()
        release = _hold_output(worker)
        assert _good_relu_verdict(worker) == "ok"
        assert worker.drain.is_alive() and os.path.isdir(worker.dir) and not worker.conn.closed   # not waited for
        assert len(pool.letting_go) == 1 and pool.letting_go[0].is_alive()
        thread = pool.letting_go[0]
        release.set()
        thread.join(60)
        assert not os.path.isdir(worker.dir) and worker.conn.closed and pool.letting_go == []   # (done: unlisted)
        other = pool.take()
        release = _hold_output(other)
        threading.Timer(0.5, release.set).start()
        other.kill()   # (waits for the output's end)
        assert release.is_set() and not os.path.isdir(other.dir) and other.conn.closed
        last = pool.take()   # one still letting go when its pool closes
        release = _hold_output(last)
        assert _good_relu_verdict(last) == "ok" and os.path.isdir(last.dir)
        threading.Timer(0.5, release.set).start()
    finally:
        pool.close()
    assert not os.path.isdir(last.dir)   # close() waited for it


def test_harness_gpu_workers_get_one_hardware_queue_per_context(monkeypatch):
    """GPU workers' environment sets CUDA_DEVICE_MAX_CONNECTIONS from the gpu_max_connections option (1 by default:
    each fresh process's context is then cheaper for the driver to create and tear down), over the caller's own
    value; None leaves the caller's environment as it is; CPU workers never see a GPU, so it is not set there."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert eh.DEFAULTS["gpu_max_connections"] == 1
    env = hp.worker_env("cuda", "triton", eh.DEFAULTS, "run", gpu=0)
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "0"
    assert hp.worker_env("cuda", "cuda", dict(eh.DEFAULTS, gpu_max_connections=4), "compile")[
        "CUDA_DEVICE_MAX_CONNECTIONS"] == "4"
    assert hp.worker_env("cuda", "triton", dict(eh.DEFAULTS, gpu_max_connections=None), "run", gpu=0)[
        "CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS")
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in hp.worker_env("cpu", "triton", eh.DEFAULTS, "run")


class _ScriptedWorker:
    """A stand-in for harness.processes.Worker whose other end of the pipe a test drives (run_job's side is real)."""
    output_bytes, pid = 0, 0

    def __init__(self):
        import multiprocessing
        self.conn, self.other = multiprocessing.Pipe()

    def exit_code(self, timeout=5.0):
        return 0

    def log_tail(self, n=1200):
        return ""

    def kill(self, wait=True):
        self.conn.close()


def _scripted_details(script, gate, limits: dict) -> dict:
    """run_job's details for one job whose worker side `script(conn)` plays, through `gate`."""
    worker, box = _ScriptedWorker(), {}
    thread = threading.Thread(target=lambda: box.update(r=hp.run_job(worker, {"kind": "evaluate"}, limits, gate)))
    thread.start()
    script(worker.other)
    thread.join(30)
    return box["r"].details


def test_harness_jit_compile_has_its_own_time_limit():
    """A Triton JIT compile the worker announces ("jit") gets limits["jit"] within the phase's: one that runs past it
    is a `timeout` that says so (details["jit"], not compiled), long before the run phase's limit; compiles that end
    in time give the phase its own deadline back, so a job whose run outlasts the JIT limit still gets its verdict."""
    limits = {"startup": 30.0, "run": 30.0, "jit": 0.5}

    def reply(script) -> dict:
        worker, box = _ScriptedWorker(), {}
        thread = threading.Thread(target=lambda: box.update(r=hp.run_job(worker, {"kind": "evaluate"}, limits)))
        thread.start()
        script(worker.other)
        thread.join(30)
        return box["r"]

    def start(conn):
        conn.send(("ready", 0))
        job = conn.recv()
        assert job["kind"] == "evaluate"
        conn.send(("phase", "run"))
        return job

    def stuck_in_ptxas(conn):
        start(conn)
        conn.send(("jit", True))   # ... and never ends

    clock = time.monotonic()
    hung = reply(stuck_in_ptxas)
    assert hung.error_kind == "timeout" and "a Triton JIT compile ran past 0.5 s" in hung.error, hung
    assert hung.details["jit"] and hung.compiled is False, hung
    assert time.monotonic() - clock < 20   # (the run phase's limit, 30 s, did not decide it)

    def compiles_then_runs(conn):
        job = start(conn)
        conn.send(("jit", False))   # (an end without a start changes nothing)
        for _ in range(3):   # three quick compiles, then a run longer than the JIT limit
            conn.send(("jit", True))
            time.sleep(0.1)
            conn.send(("jit", False))
        time.sleep(1.0)
        conn.send(("result", hv.verdict("ok"), job["key"]))

    assert reply(compiles_then_runs).error_kind == "ok"


def _ill_formed_verdicts() -> dict:
    """KernelResults that verdict() never makes, each as a candidate could pickle one onto the pipe: what
    hv.well_formed rejects (name -> result)."""
    import dataclasses

    class Subclass(eh.KernelResult):
        pass
    extra, missing, lying = hv.verdict("ok", speedup=50.0), hv.verdict("ok", speedup=50.0), hv.verdict("ok")
    extra.trusted = True
    del missing.details
    lying.__class__ = Subclass
    return {"correct but a mismatch": dataclasses.replace(hv.verdict("mismatch"), correct=True),
            "ok but not correct": dataclasses.replace(hv.verdict("ok"), correct=False),
            "correct as 1": dataclasses.replace(hv.verdict("ok"), correct=1),
            "no such kind": eh.KernelResult(compiled=True, correct=False, error_kind="great"),
            "compiled as 1": eh.KernelResult(compiled=1, correct=True, error_kind="ok"),
            "speedup as text": eh.KernelResult(compiled=True, correct=True, error_kind="ok", speedup="50"),
            "speedup as a bool": eh.KernelResult(compiled=True, correct=True, error_kind="ok", speedup=True),
            "error not text": eh.KernelResult(compiled=True, correct=False, error_kind="runtime", error=None),
            "details not a dict": eh.KernelResult(compiled=True, correct=True, error_kind="ok", details=[]),
            "an extra attribute": extra, "a field missing": missing, "a subclass": lying}


def test_harness_result_forged_on_the_pipe_is_a_reward_hack():
    """The candidate runs in the worker and can write to the worker's pipe: a result there without the job's key
    (run_job sends a fresh one with each job), or bytes that are no message, make the verdict `reward_hack`
    (check "forged_message"), whatever the forged result says; so does a result with the key that is no verdict as
    the worker makes one (a dict, or a KernelResult whose fields disagree: hv.well_formed); the worker's own result,
    with the key, stands, and run_job returns that very object."""
    limits = {"startup": 30.0, "reference": 30.0, "run": 30.0}

    def reply(send, kind: str = "evaluate") -> eh.KernelResult | dict:
        worker, box = _ScriptedWorker(), {}
        thread = threading.Thread(target=lambda: box.update(r=hp.run_job(worker, {"kind": kind}, limits)))
        thread.start()
        worker.other.send(("ready", 0))
        job = worker.other.recv()
        send(worker.other, job)
        thread.join(30)
        return box["r"]

    ok = hv.verdict("ok", compiled=True, speedup=50.0, runtime_ms=0.01, ref_runtime_ms=0.5, compile_s=0.1)
    keys = set()
    for send in (lambda conn, job: conn.send(("result", ok)),                 # no key
                 lambda conn, job: conn.send(("result", ok, "0" * 32)),       # a guessed key
                 lambda conn, job: conn.send_bytes(b"\x80\x04not a pickle"),  # bytes that are no message
                 lambda conn, job: conn.send("result"),                       # not a message tuple
                 # a phase entered again (its clock would restart: a candidate that sent it in a loop never timed
                 # out), or one the harness does not have
                 lambda conn, job: (conn.send(("phase", "run")), conn.send(("phase", "run"))),
                 lambda conn, job: (conn.send(("phase", "run")), conn.send(("phase", "compile"))),
                 lambda conn, job: conn.send(("phase", "forever")),
                 # requests of no known shape (before the check they crashed run_job: a harness error, not a verdict)
                 lambda conn, job: conn.send(("gpu", "everything")),
                 lambda conn, job: conn.send(("mem", -1, 0)),
                 lambda conn, job: conn.send(("hello",))):
        r = reply(lambda conn, job, send=send: (keys.add(job["key"]), send(conn, job)))
        assert r.error_kind == "reward_hack" and r.details["check"] == "forged_message", r
        assert not r.correct and r.speedup is None and isinstance(r, eh.KernelResult)
    assert len(keys) == 10 and all(len(k) == 32 for k in keys)   # (a fresh key per job)
    # with the key (a candidate that found it), a result that is no verdict of the worker's: an untyped dict (also
    # a lint job's report: not for an evaluation), or a KernelResult as verdict() never makes one
    forgeries = {"a dict": {"error_kind": "ok", "correct": True, "speedup": 50.0},
                 "a lint report": {"ok": True, "problems": [], "eager_ms": 1.0, "input_mb": 1.0},
                 **{k: v for k, v in _ill_formed_verdicts().items() if k != "a subclass"}}   # (a local class)
    for name, forgery in forgeries.items():
        r = reply(lambda conn, job, forgery=forgery: conn.send(("result", forgery, job["key"])))
        assert r.error_kind == "reward_hack" and r.details["check"] == "forged_message", (name, r)
    # the worker's own phases, forward (some skipped), then its result with the key: the verdict stands
    r = reply(lambda conn, job: [conn.send(m) for m in (
        ("phase", "reference"), ("phase", "run"), ("result", ok, job["key"]))])
    assert r.error_kind == "ok" and r.correct and r.speedup == 50.0 and r.compile_s == 0.1, r
    assert r.details["phase_s"].keys() == {"startup", "reference", "run"}   # (the parent's timings, added to it)
    assert reply(lambda conn, job: conn.send(("result", ok, job["key"]))).error_kind == "ok"
    # a lint job's result is its report (a dict), or a verdict where it has none (the worker's own error)
    report = {"ok": True, "problems": [], "eager_ms": 1.0, "input_mb": 1.0}
    r = reply(lambda conn, job: conn.send(("result", report, job["key"])), kind="lint")
    assert type(r) is dict and r["ok"] and "phase_s" in r["details"], r
    r = reply(lambda conn, job: conn.send(("result", hv.verdict("runtime", "boom"), job["key"])), kind="lint")
    assert r.error_kind == "runtime" and r.error == "boom", r


def test_harness_forged_knows_every_message_the_worker_sends():
    """hp.forged passes the worker's own messages, each in the shape it sends them (a check that rejected one would
    make honest candidates reward hacks), and rejects each kind in another shape; a result is a well-formed verdict
    (a lint job's: or its report, a dict)."""
    key = "k" * 32
    honest = [("ready", 123), ("phase", "reference"), ("gpu", "shared"), ("gpu", "exclusive"), ("gpu", "none"),
              ("mem", 2**30, 0), ("jit", True), ("jit", False), ("timer?",), ("result", hv.verdict("ok"), key)]
    assert [m for m in honest if hp.forged(m, key, "startup")] == []
    # a reference server's and its candidates' own messages, in the phase and job that send them
    served = [(("served", 6, 0, 2**30, 0, 2**31), "reference", "serve"), (("compare", 5, b"outputs"), "run", "evaluate")]
    assert [m for m, phase, job in served if hp.forged(m, key, phase, job)] == []
    assert set(hp.MESSAGES) == {m[0] for m in honest} | {m[0] for m, _, _ in served}   # (a new kind gets its case)
    bad = [("ready",), ("phase", "startup"), ("phase", "reference", 1), ("gpu", "all"), ("mem", 1.0, 0),
           ("mem", 1, -1), ("mem", True, 0), ("jit", 1), ("timer?", 1), ("result", hv.verdict("ok"), "x" * 32),
           ("result", {"error_kind": "ok"}, key), ("result", [], key), ("nothing",), (), ["ready", 1], "result",
           ("served", 6, 0, 0, 0, 0), ("compare", 0, b"outputs"), ("compare", 0)]
    assert [m for m in bad if not hp.forged(m, key, "startup")] == []
    assert hp.forged(("served", "6", 0, 0, 0, 0), key, "reference", "serve")
    assert hp.forged(("served", 6, 0, 0, -1, 0), key, "reference", "serve")
    assert hp.forged(("served", 6, 0, 0), key, "reference", "serve")   # (the candidate's bytes left out)
    assert hp.forged(("phase", "run"), key, "run") and not hp.forged(("phase", "run"), key, "compile")
    # every kind of verdict the worker and the parent make is well formed; none of the ill-formed ones is
    made = [hv.verdict(kind) for kind in eh.ERROR_KINDS] + [
        hv.verdict("ok", compiled=True, compile_s=0.5, speedup=2.0, runtime_ms=0.1, ref_runtime_ms=0.2,
                   details={"trials": 5}), hv.verdict("mismatch", "wrong " * 1000, compiled=True, compile_s=1)]
    assert all(hv.well_formed(v) and not hp.forged(("result", v, key), key, "run") for v in made)
    ill = _ill_formed_verdicts()
    assert [name for name, v in ill.items() if hv.well_formed(v) or not hp.forged(("result", v, key), key, "run")] == []
    # a lint job's report is a dict; its verdicts (a worker's error) pass too; an evaluation's dict does not
    report = {"ok": False, "problems": ["degenerate"], "eager_ms": None, "input_mb": 1.0}
    assert not hp.forged(("result", report, key), key, "reference", "lint")
    assert not hp.forged(("result", hv.verdict("runtime", "x"), key), key, "reference", "lint")
    assert hp.forged(("result", report, key), key, "reference", "evaluate")
    assert hp.forged(("result", report, key), key, "compile", "compile")
    assert hp.forged(("result", [], key), key, "reference", "lint")


def test_harness_exclusive_turn_time_is_reported():
    """run_job reports how long a job held the GPU alone (exclusive_s: every other worker on the GPU waits that long)
    and how long it waited for that turn (exclusive_wait_s, part of gpu_wait_s), counted until it asks for another
    turn; a job that never timed reports neither."""
    gate, limits = hp.Gate(), {"startup": 30.0, "run": 30.0}

    def run(script) -> dict:
        return _scripted_details(script, gate, limits)

    def timer(conn):
        conn.send(("ready", 0))
        job = conn.recv()
        assert job["kind"] == "evaluate"
        conn.send(("gpu", "shared"))
        conn.recv()
        other = gate.acquire("shared")   # another worker is mid-trial: the timer waits for it
        threading.Timer(0.3, lambda: gate.release("shared", other)).start()
        conn.send(("gpu", "exclusive"))
        conn.recv()
        time.sleep(0.4)   # the timed reps
        conn.send(("gpu", "shared"))
        conn.recv()
        time.sleep(1.0)   # checks after timing, not alone: not counted
        conn.send(("result", hv.verdict("ok"), job["key"]))

    details = run(timer)
    assert 0.35 < details["exclusive_s"] < 0.95 and 0.25 < details["exclusive_wait_s"] < 0.95, details
    assert details["gpu_wait_s"] >= details["exclusive_wait_s"] and details["gpu_turns"] == 3

    def checker(conn):
        conn.send(("ready", 0))
        job = conn.recv()
        conn.send(("gpu", "shared"))
        conn.recv()
        conn.send(("result", hv.verdict("mismatch"), job["key"]))

    assert "exclusive_s" not in run(checker)


def test_harness_longest_shared_stretch_is_reported():
    """run_job reports the longest stretch a worker held its shared GPU turn without a chance to give it up (a turn
    request or a "timer?"; a phase message is none: longest_shared_s, what a waiting timer waits for) and the phases
    it spanned, or "timing" for the stretch that ends in its request to time alone; waits and time alone do not
    count, and a job that never held the turn reports none."""
    gate, limits = hp.Gate(), {"startup": 30.0, "reference": 30.0, "run": 30.0}

    def run(script) -> dict:
        return _scripted_details(script, gate, limits)

    def ask(conn, *message):
        conn.send(message)
        return conn.recv() if message[0] in ("gpu", "timer?") else None

    def worker(prelude: float, trial: float, tail: float = 0.0):
        def script(conn):
            conn.send(("ready", 0))
            job = conn.recv()
            time.sleep(0.5)                # no turn yet: not counted
            ask(conn, "phase", "reference")
            ask(conn, "gpu", "shared")
            time.sleep(0.1)
            ask(conn, "timer?")
            ask(conn, "phase", "run")
            time.sleep(trial)              # a trial
            ask(conn, "timer?")
            time.sleep(prelude)            # captures and warm-up, then the turn alone
            ask(conn, "gpu", "exclusive")
            time.sleep(0.6)                # alone: not a shared stretch
            ask(conn, "gpu", "shared")
            time.sleep(tail)               # checks after timing, up to the verdict
            conn.send(("result", hv.verdict("ok"), job["key"]))
        return script

    details = run(worker(prelude=0.4, trial=0.2))
    assert details["longest_shared_phase"] == "timing" and 0.35 < details["longest_shared_s"] < 0.6, details
    details = run(worker(prelude=0.1, trial=0.4))   # (from the reference's "timer?" on, over the phase message)
    assert details["longest_shared_phase"] == "reference..run" and 0.35 < details["longest_shared_s"] < 0.6, details
    details = run(worker(prelude=0.1, trial=0.1, tail=0.45))
    assert details["longest_shared_phase"] == "run" and 0.4 < details["longest_shared_s"] < 0.65, details

    def never(conn):
        conn.send(("ready", 0))
        job = conn.recv()
        time.sleep(0.2)
        conn.send(("result", hv.verdict("compile"), job["key"]))
    assert "longest_shared_s" not in run(never)


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()   # state, ppid, pgrp, session, ...


def test_harness_zygote_forks_fresh_workers_in_their_own_sessions():
    """Every worker is a new child of its pool's zygote, leads its own session (the kill reaches its group), runs
    one job, and its exit code comes back through the zygote (a kill reads as -SIGKILL)."""
    import signal
    pool = hp.Pool(hp.worker_env("cpu", "triton", eh.DEFAULTS, "run"), spare=0)
    try:
        a, b = pool.take(), pool.take()
        assert a.pid != b.pid and pool.zygote.alive()
        for worker in (a, b):
            deadline = time.monotonic() + 60   # (setsid() is the child's first act after the fork returned)
            while int(_stat(worker.pid)[3]) != worker.pid and time.monotonic() < deadline:
                time.sleep(0.01)
            state = _stat(worker.pid)
            assert int(state[1]) == pool.zygote.proc.pid, state   # forked by the zygote, not spawned by us
            assert int(state[3]) == worker.pid and int(state[2]) == worker.pid   # its own session and group
        assert _good_relu_verdict(a) == "ok"   # (run_job kills it afterwards)
        # the signal kill() sends first, on its own: kill() itself asks the zygote to reap at once, and where the
        # worker is dead by then (a busy zygote: run_job lets go of `a` in the background) it takes the exit code
        os.killpg(b.pid, signal.SIGKILL)
        assert b.exit_code(timeout=5) == -signal.SIGKILL
        assert not os.path.exists(f"/proc/{b.pid}")   # reaped: no zombie left
        assert b.exit_code(timeout=1) is None   # (the zygote knows no such child any more)
        b.kill()   # (gone already: no error; its pipe closed, its directory removed)
        assert not os.path.isdir(b.dir)
    finally:
        pool.close()
    assert pool.zygote is None


def test_harness_worker_exit_code_through_the_zygote():
    """A worker killed by a signal reports that signal, read by its zygote (the worker is not our child)."""
    import signal
    zygote = hp.Zygote(hp.worker_env("cpu", "triton", eh.DEFAULTS, "run"))
    try:
        worker = hp.Worker(zygote)
        assert worker.conn.poll(120) and worker.conn.recv()[0] == "ready"
        os.kill(worker.pid, signal.SIGSEGV)
        assert worker.exit_code(timeout=30) == -signal.SIGSEGV
        worker.kill()   # (already gone: no error)
    finally:
        zygote.close()


def test_harness_pool_restarts_a_dead_zygote():
    """A zygote that died (killed for memory, say) takes its idle workers with it; the next take() starts a new
    zygote, drops the dead idle workers, and its worker runs the job."""
    pool = hp.Pool(hp.worker_env("cpu", "triton", eh.DEFAULTS, "run"), spare=1)
    try:
        pool.fill()
        first = pool.zygote
        first.proc.kill()
        first.proc.wait()
        worker = pool.take()
        assert pool.zygote is not first and pool.zygote.alive()
        assert _good_relu_verdict(worker) == "ok"
    finally:
        pool.close()


def test_harness_zygote_imports_touch_no_driver_and_start_no_thread():
    """torch refuses CUDA in a child forked after the parent asked the driver anything ("Cannot re-initialize CUDA
    in forked subprocess"; importing torch.utils.cpp_extension does), and fork copies only the calling thread. So the
    zygote's imports and warm-ups, here with a GPU's settings, leave no CUDA state, no new thread (native ones
    counted too) and no cpp_extension; the Triton compiler warm-up for sm_90 succeeds without a GPU."""
    import json
    import subprocess
    import sys
    code = ("import os, sys, json, threading, torch, harness.worker as hw; before = len(os.listdir('/proc/self/task'));"
            "hw._zygote_imports(); print(json.dumps({'threads': len(os.listdir('/proc/self/task')) - before,"
            "'py_threads': threading.active_count(), 'cuda': torch.cuda.is_initialized(),"
            "'cpp_extension': 'torch.utils.cpp_extension' in sys.modules, 'triton': 'triton' in sys.modules,"
            "'compiled': hw._warm_up_triton_compiler(90)}))")
    env = dict(os.environ, KZ_BACKEND="triton", KZ_DEVICE="cuda", KZ_TRITON_ARCH="90")
    env.pop("TRITON_INTERPRET", None)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=here, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    facts = json.loads(out.stdout.strip().splitlines()[-1])
    assert facts == {"threads": 0, "py_threads": 1, "cuda": False, "cpp_extension": False, "triton": True,
                     "compiled": True}, facts


def test_harness_zygote_with_the_compiler_warm_up_still_runs_candidates():
    """A CPU-mode pool whose zygote also warmed the Triton compiler up for a GPU: its forked workers still run
    candidates (the warm-up left the zygote safe to fork)."""
    env = dict(hp.worker_env("cpu", "triton", eh.DEFAULTS, "run"), KZ_TRITON_ARCH="90")
    pool = hp.Pool(env, spare=0)
    try:
        assert _good_relu_verdict(pool.take()) == "ok"
    finally:
        pool.close()


def _timer_during(ref_src: str, cand_src: str, calls) -> tuple[dict, int, int]:
    """Evaluate one candidate on a CPU worker behind a gate; once the file `calls` exists (a slow forward has begun
    and holds the shared turn), a timer asks for the gate alone. Returns (the worker's reply, how many forwards had
    written to `calls` when the timer got the gate, how many in all)."""
    gate, box = hp.Gate(), {}
    job = {"kind": "evaluate", "ref_src": ref_src, "cand_src": cand_src, "backend": "triton", "device": "cpu",
           "opts": dict(eh.DEFAULTS, timing=False)}
    limits = {"startup": 120.0, "reference": 120.0, "compile": 60.0, "run": 120.0}
    pool = hp.Pool(hp.worker_env("cpu", "triton", eh.DEFAULTS, "run"), spare=0)
    worker = threading.Thread(target=lambda: box.update(r=hp.run_job(pool.take(), job, limits, gate)), daemon=True)

    def timer():
        while not calls.exists():
            time.sleep(0.01)
        gate.acquire("exclusive")
        box["calls"] = len(calls.read_text())
        gate.release("exclusive")
    timing = threading.Thread(target=timer, daemon=True)
    worker.start()
    timing.start()
    try:
        timing.join(120)
        worker.join(120)
    finally:
        pool.close()
    return box["r"], box["calls"], len(calls.read_text())


def test_harness_a_waiting_timer_gets_the_gpu_between_trials(tmp_path):
    """A worker checking correctness gives its shared GPU turn back between trials: a timer that starts waiting
    during the first trial gets the GPU before the check is over, and the check then goes on to its verdict."""
    t = _t()
    calls = tmp_path / "calls"
    slow = t._harness_relu(f'''
        open({str(calls)!r}, "a").write("x")
        time.sleep(0.3)
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out''', extra="import time\n")
    reply, when, total = _timer_during(t.RELU_TASK, slow, calls)
    assert reply.error_kind == "ok", reply
    assert total >= eh.DEFAULTS["trials"] + 1   # trials + the two self-agreement reruns
    assert 1 <= when < total, (when, total)   # in before the end (typically after the first trial: 2 forwards)


def test_harness_a_waiting_timer_gets_the_gpu_between_reference_outputs(tmp_path):
    """The same between the reference outputs of a worker's trials: a timer that starts waiting during the first
    reference forward gets the GPU before the last one, and the candidate's verdict still comes."""
    t = _t()
    calls = tmp_path / "ref_calls"
    slow_task = t.RELU_TASK.replace("        return torch.relu(x)", f'''        import time
        open({str(calls)!r}, "a").write("x")
        time.sleep(0.3)
        return torch.relu(x)''')
    reply, when, total = _timer_during(slow_task, t.GOOD_RELU, calls)
    assert reply.error_kind == "ok", reply
    assert total >= eh.DEFAULTS["trials"] + 1   # one reference forward per trial (the heavy one included)
    assert 1 <= when < total, (when, total)   # (typically 1: in after the first reference output)


def test_harness_worker_threads_follow_the_pool():
    """A pool's `threads` reaches torch in its workers (OMP_NUM_THREADS, set before the zygote imports torch), on a
    GPU's pools too: 8 workers per GPU each starting one CPU thread per core would oversubscribe the machine."""
    t = _t()
    assert hp.worker_env("cuda", "triton", eh.DEFAULTS, "run", gpu=0, threads=2)["OMP_NUM_THREADS"] == "2"
    task = t.RELU_TASK.replace("        return torch.relu(x)", "        assert torch.get_num_threads() == 1, "
                                                               "torch.get_num_threads()\n        return torch.relu(x)")
    job = {"kind": "evaluate", "ref_src": task, "cand_src": t.GOOD_RELU, "backend": "triton", "device": "cpu",
           "opts": dict(eh.DEFAULTS, timing=False)}
    limits = {"startup": 120.0, "reference": 60.0, "compile": 60.0, "run": 60.0}
    kinds = {}
    for threads in (1, 2):   # (torch takes at most one thread per core: this box has at least 2, CI's has 2)
        pool = hp.Pool(hp.worker_env("cpu", "triton", eh.DEFAULTS, "run", threads=threads), spare=0)
        try:
            reply = hp.run_job(pool.take(), job, limits)
        finally:
            pool.close()
        kinds[threads] = (reply.error_kind, reply.error[:200])
    assert kinds[1][0] == "ok", kinds
    if len(os.sched_getaffinity(0)) >= 2:
        assert kinds[2][0] == "runtime" and "AssertionError: 2" in kinds[2][1], kinds


def test_harness_timing_spot_checks_are_few_and_still_catch_replays(monkeypatch):
    """time_models on the CPU with stand-in CUDA events: SPOT_CHECKS outputs are compared (each is GPU work that
    every other worker waits for), covering both input sets, so a model replaying an old output is always caught,
    and a reference output the candidate overwrote during timing is seen (ref_intact)."""
    trials = stand_in_cuda_events(monkeypatch)
    torch = eh.torch
    cpu = torch.device("cpu")
    for adaptive in (False, True):
        times = ht.time_models({"ref": torch.relu, "cand": torch.relu}, trials, cpu, 0.05, checked="cand",
                                tol=(1e-4, 1e-4), adaptive=adaptive)
        assert len(times["cand"]) >= 20 and times["ref_intact"]
        assert times["bad_output"] == [False] * ht.SPOT_CHECKS, times["bad_output"]
    first = torch.relu(trials[0]["inputs"][0])
    for _ in range(3):   # every input set is among the checked reps: a replay of one set's output is always seen
        replay = ht.time_models({"ref": torch.relu, "cand": lambda x: first.clone()}, trials, cpu, 0.05,
                                 checked="cand", tol=(1e-4, 1e-4))
        assert any(replay["bad_output"]) and len(replay["bad_output"]) == ht.SPOT_CHECKS
    import random
    for n in (1, 2, 3, 30, 300):
        picks = ht._spot_reps(n, 2, ht.SPOT_CHECKS, random.Random(n))
        assert len(picks) == min(n, ht.SPOT_CHECKS) and all(0 <= r < n for r in picks)
        assert {r % 2 for r in picks} == ({0, 1} if n > 1 else {0})

    def overwrite(x):   # a kernel writing where the harness keeps its GPU copies of the reference outputs
        for obj in gpu_copies:
            obj.fill_(0.0)
        return torch.relu(x)
    gpu_copies = []
    original = hc.copy_out
    monkeypatch.setattr(ht, "copy_out", lambda out, where: gpu_copies.append(original(out, where)) or gpu_copies[-1])
    times = ht.time_models({"ref": torch.relu, "cand": overwrite}, trials, cpu, 0.05, checked="cand",
                            tol=(1e-4, 1e-4))
    assert not times["ref_intact"] and any(times["bad_output"])


def test_harness_graph_timing_replays_what_was_captured_or_falls_back(monkeypatch):
    """The CUDA-graph timing path on the CPU, with a stand-in capture whose "replay" reruns the model on the captured
    input tensors: the default (graph) method is used when every model's replays reproduce the reference on both
    input sets, and the spot checks still read the replayed outputs. A capture that fails, or a graph that does not
    recompute (a kernel launched on the legacy stream runs once during the capture and is not in the graph), makes
    every model be timed eagerly, with the reason, and the verdict data stays right. The caller's exclusive turn
    is asked for once, after the captures and the warm-up reps, before the timed ones, and given back (after())
    once, right after the last timed rep and its spot check. Before that turn, under the shared one, where every
    host read waits for the other workers' time slices, the replays' checks are read once and the warm-up reps not
    at all."""
    log = []
    trials = stand_in_cuda_events(monkeypatch, log)
    torch, cpu = eh.torch, eh.torch.device("cpu")
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: log.append("read") or tolist(self))
    monkeypatch.setattr(eh.torch.cuda, "Stream", lambda *args, **kwargs: None)
    free = [2**40]
    monkeypatch.setattr(eh.torch.cuda, "mem_get_info", lambda *args: (free[0], 2**40))

    def capture(model, pristine, stream, recompute=True):
        static = [x.clone() for x in pristine]
        out = model(*static).clone()

        class Graph:
            def replay(self):
                log.append("replay")
                if recompute:
                    out.copy_(model(*static))
        return Graph(), static, out
    monkeypatch.setattr(ht, "_capture", capture)
    rule = ht.timing_rule(eh.DEFAULTS)
    assert rule["graphs"] and rule["adaptive"]   # the defaults
    exclusive, after = lambda: log.append("exclusive"), lambda: log.append("after")  # noqa: E731
    times = ht.time_models({"ref": torch.relu, "cand": torch.relu}, trials, cpu, 0.05, checked="cand",
                            tol=(1e-4, 1e-4), exclusive=exclusive, after=after, **rule)
    assert times["method"] == "graph" and "graph_fallback" not in times and times["ref_intact"]
    assert times["bad_output"] == [False] * ht.SPOT_CHECKS
    i, j = log.index("exclusive"), log.index("after")
    assert log.count("exclusive") == 1 and log[:i].count("record") == 2 * 2 * 2   # warm-up: 2 reps x 2 models
    assert log[:i].count("replay") == 2 * 2 + 2 * 2   # the two-set check, then 2 warm-up reps, per model
    assert log[:i].count("read") == 1 and log[:i].count("sync") == 0, log[:i]   # (the check's numbers at once)
    assert log[i - 1] == "device sync" and log[:i].count("device sync") == 1   # (the warm-up done before the turn)
    assert log[i + 1:j].count("replay") == len(times["ref"]) + len(times["cand"]) >= 2 * eh.DEFAULTS["timing_min_reps"]
    assert log.count("after") == 1 and "replay" not in log[j:] and "record" not in log[j:]

    first = torch.relu(trials[0]["inputs"][0])   # a candidate whose output is the first set's, whatever its input
    replay = ht.time_models({"ref": torch.relu, "cand": lambda x: first.clone()}, trials, cpu, 0.05,
                             checked="cand", tol=(1e-4, 1e-4), **rule)
    assert replay["method"] == "eager" and "cand" in replay["graph_fallback"] and any(replay["bad_output"])

    monkeypatch.setattr(ht, "_capture", lambda *args: capture(*args, recompute=False))   # not in the graph
    times = ht.time_models({"ref": torch.relu, "cand": torch.relu}, trials, cpu, 0.05, checked="cand",
                            tol=(1e-4, 1e-4), **rule)
    assert times["method"] == "eager" and "disagrees" in times["graph_fallback"]
    assert times["bad_output"] == [False] * ht.SPOT_CHECKS and times["ref_intact"]

    free[0] = 1000   # the graphs' copies of two models' inputs and outputs (4 x 256 bytes) would not fit
    times = ht.time_models({"ref": torch.relu, "cand": torch.relu}, trials, cpu, 0.05, checked="cand",
                            tol=(1e-4, 1e-4), **rule)
    assert times["method"] == "eager" and "do not fit" in times["graph_fallback"]
    free[0] = 2**40

    def refuse(model, pristine, stream):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(ht, "_capture", refuse)
    times = ht.time_models({"ref": torch.relu, "cand": torch.relu}, trials, cpu, 0.05, checked="cand",
                            tol=(1e-4, 1e-4), **rule)
    assert times["method"] == "eager" and "not permitted" in times["graph_fallback"]
    assert len(times["cand"]) >= eh.DEFAULTS["timing_min_reps"] and times["bad_output"] == [False] * ht.SPOT_CHECKS


def test_harness_the_captured_forward_is_recorded_like_a_trial(monkeypatch):
    """Graph timing runs a candidate's Python once, while its forward is captured: that call's aten ops are recorded
    as the trials' calls are, so a candidate that computes with PyTorch while captured is seen; any other call (eager
    timing reps) runs unrecorded, with nothing added inside the timed window."""
    torch = eh.torch
    capturing = [False]   # (torch.cuda's own answer needs a CUDA build)
    monkeypatch.setattr(eh.torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    instr = hi.Instrumentation("triton", "cpu", "kz_candidate")
    timed = instr.recorded_when_captured(lambda x: torch.relu(x) * 2)
    x = torch.randn(8)
    assert torch.equal(timed(x), torch.relu(x) * 2) and not instr.ops   # not capturing: unrecorded
    capturing[0] = True
    assert torch.equal(timed(x), torch.relu(x) * 2)
    assert instr.ops == {"relu": 1, "mul": 1} and not instr.recording
    glue = instr.recorded_when_captured(lambda x: torch.empty_like(x).copy_(x).view(2, 4))
    glue(x)
    assert instr.ops == {"relu": 1, "mul": 1}   # allocation, copies and views are glue


def _fingerprint(out, key):
    return hc.host_ints(hc.fingerprint_sums(out, key))


def test_harness_output_fingerprint_sees_any_change_and_not_the_chunking(monkeypatch):
    """The keyed fingerprint that guards reference outputs kept on the GPU (computed here on the CPU, same code):
    equal for equal bytes, different after one changed word or bit, under another key, or for a tuple with one
    changed member; independent of how many words one step takes; odd byte counts and every dtype work.
    outputs_intact checks every trial that has one and ignores those without (host-kept outputs)."""
    torch = eh.torch
    x = torch.randn(1000, 7)
    key = 123456789123
    fp = _fingerprint(x, key)
    assert fp == _fingerprint(x.clone(), key) and len(fp) == 1
    y = x.clone()
    y[500, 3] = -y[500, 3]   # one sign bit
    assert _fingerprint(y, key) != fp
    y = x.clone()
    y.view(-1)[[10, 11]] = y.view(-1)[[11, 10]]   # two words swapped: the weights are positional
    assert _fingerprint(y, key) != fp
    assert _fingerprint(x, key + 1) != fp
    monkeypatch.setattr(hc, "_FINGERPRINT_CHUNK", 97)   # many steps, a ragged last one
    assert _fingerprint(x, key) == fp
    # the definition, in Python integers: sum of word_i * ((a*i + b) mod p), wrapped to a signed 64-bit value
    import struct
    for k in (key, 2**64 - 1, 0):
        p = hc._FINGERPRINT_PRIME
        a, b = k % (p - 1) + 1, (k >> 32) % p
        words = struct.unpack(f"<{x.numel()}i", x.numpy().tobytes())
        total = sum(w * ((a * i + b) % p) for i, w in enumerate(words)) % 2**64
        assert _fingerprint(x, k) == [total - 2**64 if total >= 2**63 else total]
    for t in (torch.arange(7, dtype=torch.uint8), torch.ones(3, dtype=torch.bool), torch.randn(5).half(),
              torch.randn(4, 4).t()):   # 7 and 3 bytes: byte words; a transposed (non-contiguous) view
        assert _fingerprint(t, key) == _fingerprint(t.clone(), key)
    pair = (x, torch.arange(10))
    assert _fingerprint(pair, key) == [fp[0], _fingerprint(pair[1], key)[0]]
    trials = [{"inputs": [], "out": x.clone(), "heavy": False, "fp": (key, fp)},
              {"inputs": [], "out": torch.zeros(3), "heavy": False}]   # (kept on the host: no fingerprint)
    assert hc.outputs_intact(trials)
    trials[0]["out"][0, 0] += 1
    trials[1]["out"][0] = 5
    assert not hc.outputs_intact(trials)
    # several fingerprinted trials are read in one go: a change in any one of them shows
    z = torch.randn(5)
    trials = [{"out": x.clone(), "fp": (key, fp)},
              {"out": (z.clone(), x.clone()), "fp": (key + 1, _fingerprint((z, x), key + 1))}]
    assert hc.outputs_intact(trials)
    trials[1]["out"][1][999, 6] += 1
    assert not hc.outputs_intact(trials)
    assert hc.outputs_intact([]) and hc.host_ints([]) == []


def test_harness_reference_trials_read_their_checks_at_once(monkeypatch):
    """_make_trials reads the reference's input checks and the heavy draw's finiteness with the fingerprints, in one
    host read at the end: a reference that writes to its inputs is seen (its candidates' input checks are then off),
    and a heavy-tailed draw on which the reference is not finite is dropped, the normal ones kept."""
    torch = eh.torch
    cpu, opts = torch.device("cpu"), dict(eh.DEFAULTS)
    torch.manual_seed(0)
    draws = [([torch.randn(8)], False), ([torch.randn(8)], False), ([torch.randn(8) * 100], True)]

    def run(forward):
        details = {}
        trials, mutates = hw._make_trials(forward, [([x.clone() for x in xs], h) for xs, h in draws], cpu, opts,
                                          details)
        return trials, mutates, details["heavy_trial"]

    trials, mutates, heavy = run(torch.relu)
    assert len(trials) == 3 and not mutates and heavy is True
    assert torch.equal(trials[2]["out"], torch.relu(draws[2][0][0]))
    trials, mutates, heavy = run(lambda x: x.mul_(2).clone())   # in place: the stored inputs stay as drawn
    assert mutates and len(trials) == 3 and torch.equal(trials[0]["inputs"][0], draws[0][0][0])
    blows_up = lambda x: torch.where(x.abs() < 50, x, torch.tensor(float("inf")))  # noqa: E731  (finite when normal)
    trials, mutates, heavy = run(blows_up)
    assert len(trials) == 2 and not any(tr["heavy"] for tr in trials) and not mutates
    assert heavy == "skipped: the reference is not finite on heavy-tailed inputs"
    # outputs on the GPU get fingerprints, read in the same go: each trial's own, and the checks still right
    monkeypatch.setattr(hw, "within_kernels_reach", lambda out: True)
    for forward, mutating in ((torch.relu, False), (lambda x: x.mul_(2).clone(), True)):
        trials, mutates, heavy = run(forward)
        assert mutates == mutating and heavy is True and len(trials) == 3
        assert all(tr["fp"][1] == _fingerprint(tr["out"], tr["fp"][0]) for tr in trials)
    trials, mutates, heavy = run(blows_up)
    assert len(trials) == 2 and heavy.startswith("skipped") and hc.outputs_intact(trials)


def test_harness_compare_verdicts_messages_and_error_stats():
    """compare reads the numbers of all outputs at once; its verdicts, messages and error statistics: NaN where the
    reference has none comes first, then the count of values outside the tolerance; empty and integer outputs; the
    largest absolute and relative errors over the outputs of a tuple; the caller's device values read along
    (read_with), also where the host alone gave the verdict."""
    torch = eh.torch
    cpu = torch.device("cpu")
    r = torch.tensor([1.0, -2.0, 4.0, float("nan")])
    assert hc.compare(r.clone(), r, cpu, 1e-4, 1e-4) == (None, None, "", {"max_abs_err": 0.0, "max_rel_err": 0.0,
                                                                           "read_with": []})
    flags = [torch.tensor(True), torch.tensor(False)]
    assert hc.compare(r.clone(), r, cpu, 1e-4, 1e-4, read_with=flags)[3]["read_with"] == [1, 0]
    kind, _, _, stats = hc.compare(r.half(), r, cpu, 1e-4, 1e-4, read_with=flags)   # (a dtype mismatch: no numbers)
    assert kind == "mismatch" and stats["read_with"] == [1, 0]
    kind, _, message, stats = hc.compare((r.clone(), torch.tensor([1, 5])), (r, torch.tensor([1, 2])), cpu, 1e-4,
                                          1e-4, read_with=flags[:1])   # outputs in order: the integer one differs
    assert kind == "mismatch" and message == "output 1: 1 of 2 values differ" and stats["read_with"] == [1]
    o = r.clone()
    o[0] += 0.5
    o[2] = float("nan")
    kind, _, message, _ = hc.compare(o, r, cpu, 1e-4, 1e-4)
    assert kind == "mismatch" and "NaN where the reference is not" in message
    o[2] = 4.0 + 1e-5   # within tolerance: only output 0 is outside
    kind, check, message, stats = hc.compare(o, r, cpu, 1e-4, 1e-4)
    assert (kind, check) == ("mismatch", None) and message.startswith("output 0: 1 of 4 values outside atol=0.0001")
    assert abs(stats["max_abs_err"] - 0.5) < 1e-6 and abs(stats["max_rel_err"] - 0.5) < 1e-6
    pair_ref = (torch.zeros(0), torch.tensor([2.0, 4.0]))
    kind, _, _, stats = hc.compare((torch.zeros(0), torch.tensor([2.0, 4.00001])), pair_ref, cpu, 1e-4, 1e-4)
    assert kind is None and 0 < stats["max_abs_err"] < 2e-5
    kind, _, message, _ = hc.compare(torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]), cpu, 0, 0)
    assert kind == "mismatch" and "1 of 3 values differ" in message
    h = torch.tensor([1.0, 2.0]).half()
    assert hc.compare(h.clone(), h, cpu, 1e-2, 1e-2)[0] is None


def test_harness_pool_survives_a_zygote_dying_while_it_forks(monkeypatch):
    """The zygote's answer to a fork request never comes (it died meanwhile): the pool starts a new zygote and the
    worker it forks runs the job; nothing reaches map() as an exception."""
    pool = hp.Pool(hp.worker_env("cpu", "triton", eh.DEFAULTS, "run"), spare=0)
    ask = hp.Zygote.ask
    died = []

    def dying(zygote, *request, **kwargs):
        if request[0] == "fork" and not died:
            died.append(zygote)
            zygote.proc.kill()
            zygote.proc.wait()
        return ask(zygote, *request, **kwargs)
    monkeypatch.setattr(hp.Zygote, "ask", dying)
    try:
        worker = pool.take()
        assert died and pool.zygote is not died[0] and pool.zygote.alive()
        assert _good_relu_verdict(worker) == "ok"
    finally:
        pool.close()


def test_harness_a_zygote_that_cannot_start_is_a_clear_error(tmp_path, monkeypatch):
    """Workers whose zygote dies at start (here: its environment lacks KZ_BACKEND, a KeyError): take() says so after
    one retry, instead of hanging or handing out dead workers."""
    import glob
    import tempfile
    import pytest
    # a private temp dir: other harness runs on this machine create and remove kz_worker_* dirs of their own
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = hp.worker_env("cpu", "triton", eh.DEFAULTS, "run")
    del env["KZ_BACKEND"]
    pool = hp.Pool(env, spare=0)
    try:
        with pytest.raises(RuntimeError, match="zygote exited with code 1"):
            pool.take()
    finally:
        pool.close()
    # the workers that could not be forked left no directory behind
    assert glob.glob(os.path.join(tmp_path, "kz_worker_*")) == []


def _kernel_ms(task_src: str, cand_src: str, tmp) -> tuple[float, float]:
    """A host-independent time of one forward of the reference and of the candidate, in ms: the median over 10
    forwards (L2 flushed before each) of the summed durations of the GPU kernels it ran, from the profiler's device
    timestamps. Gaps between kernels, and whatever the host does, do not count."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    import bench
    ref, cand = (bench.load_source(src, name, str(tmp))   # (real files: Triton reads kernel source from them)
                 for name, src in (("kz_kernel_ms_ref", task_src), ("kz_kernel_ms_cand", cand_src)))
    torch.manual_seed(0)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in ref.get_inputs()]
    flush = torch.empty(64 * 2**20, dtype=torch.int32, device="cuda")   # 256 MB, larger than the L2
    medians = []
    for cls in (ref.Model, cand.ModelNew):
        torch.manual_seed(0)
        model, per_forward = cls(*ref.get_init_inputs()).cuda(), []
        with torch.no_grad():
            model(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])   # Triton's JIT, cuBLAS
            for _ in range(10):
                args = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
                flush.zero_()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    model(*args)
                    torch.cuda.synchronize()
                per_forward.append(sum(e.time_range.elapsed_us() for e in prof.events()
                                       if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3)
        medians.append(sorted(per_forward)[5])
    return medians[0], medians[1]


@pytest.mark.gpu
@_gpu
def test_harness_gpu_graph_timing_agrees_with_kernel_durations_and_is_stable(tmp_path):
    """On the GPU, one candidate at a time: golden Triton solutions of a 1-kernel task (256 MB ReLU), a fused level-2
    chain and a matmul, timed as CUDA graphs under the adaptive rule (the default). Five graph runs of each vary by at
    most 5% (max/min), and their median speedup is within 8% of the ratio of the kernels' own durations
    (_kernel_ms), a measure that no host latency enters. The old eager rule is printed beside them, not checked: it
    synchronizes before its end event, so the host's wake-up latency is inside its window, and that moves with the
    machine's load (the RMSNorm chain's eager speedup was 3.74-3.80 in runs of 2026-12-04 and 2.43 on 2026-12-05,
    against 4.10-4.12 as graphs: ~12 us and ~120 us of latency on a ~0.1 ms candidate)."""
    import pathlib
    t = _t()
    root = pathlib.Path(__file__).resolve().parent.parent / "kernelbench_tasks"
    pairs = [("relu 256 MB", t.GPU_RELU_TASK, t.GOOD_RELU)] + [
        (name, (root / f"{name}.py").read_text(), (root / "solutions" / f"{name}_triton.py").read_text())
        for name in ("level2/004_ResidualRMSNorm", "level1/014_SquareMatmul")]

    def ms(r):   # candidate / reference medians and the candidate's host wall time per rep
        return [r.runtime_ms, r.ref_runtime_ms, r.details.get("host_median_ms")]
    for name, task, cand in pairs:
        graph = [eh.evaluate(task, cand, backend="triton", device="cuda") for _ in range(5)]
        eager = eh.evaluate(task, cand, backend="triton", device="cuda", **eh.FIXED_TIMING)
        ref_ms, cand_ms = _kernel_ms(task, cand, tmp_path)
        speedups = [r.speedup for r in graph]
        print(f"{name}: graph speedups {[round(s, 3) for s in speedups]} reps {[r.details['reps'] for r in graph]} "
              f"timing_s {[r.details['timing_s'] for r in graph]}; kernel durations {ref_ms:.4f} / {cand_ms:.4f} ms "
              f"= {ref_ms / cand_ms:.3f}; eager {eager.speedup:.3f} reps {eager.details['reps']} timing_s "
              f"{eager.details['timing_s']}; ms graph {ms(graph[0])} eager {ms(eager)}", flush=True)
        assert all(r.error_kind == "ok" and r.details["timing_method"] == "graph" for r in graph), graph[0]
        assert eager.error_kind == "ok" and eager.details["timing_method"] == "eager"
        assert max(speedups) / min(speedups) <= 1.05, speedups
        median = sorted(speedups)[2]
        assert 0.92 <= median / (ref_ms / cand_ms) <= 1.08, (median, ref_ms, cand_ms)


def test_harness_compare_in_steps_gives_the_numbers_of_one_step(monkeypatch):
    """A large output is compared in steps of _COMPARE_STEP values (bounded temporaries): NaN and outside counts add
    up over the steps, the largest errors are the largest of any step, an error in the last, short step counts.
    Every number equals the one-step comparison's."""
    torch = eh.torch
    cpu = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    r = torch.randn(5, 7, generator=g)
    o = r.clone()
    o[0, 1] += 0.25          # step 0
    o[2, 3] = float("nan")   # a middle step
    o[4, 6] -= 3.0           # the last value (35 = 4 steps of 8 and one of 3)
    idx = torch.arange(35).reshape(5, 7)
    wrong_idx = idx.clone()
    wrong_idx[0, 0], wrong_idx[4, 5] = -1, -2
    cases = [(o, r), (r.clone(), r), (o.half(), r.half()), (wrong_idx, idx), ((o, wrong_idx), (r, idx))]
    whole = [hc.compare(out, ref, cpu, 1e-4, 1e-4) for out, ref in cases]
    numbers = [[[float(x) for x in xs] for _, _, xs in hc.output_numbers(out, ref, cpu, 1e-4, 1e-4)[1]]
               for out, ref in cases]
    monkeypatch.setattr(hc, "_COMPARE_STEP", 8)
    assert [hc.compare(out, ref, cpu, 1e-4, 1e-4) for out, ref in cases] == whole
    stepped = [[[float(x) for x in xs] for _, _, xs in hc.output_numbers(out, ref, cpu, 1e-4, 1e-4)[1]]
               for out, ref in cases]
    assert stepped == numbers
    assert numbers[0][0][0] == 1 and numbers[0][0][3] == 3 and numbers[3][0] == [2.0]   # (what the steps summed)
    assert abs(numbers[0][0][1] - 3.0) < 1e-5   # the largest error sits in the last, short step
    assert "output 1: 2 of 35 values differ" in hc.compare((r.clone(), wrong_idx), (r, idx), cpu, 1e-4, 1e-4)[2]
