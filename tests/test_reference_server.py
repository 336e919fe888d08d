"""Tests for the reference server (eval_harness's reference_server option; harness.processes.ReferenceServer on the
caller's side, harness.worker._job_serve inside its worker): the verdicts are the ones each candidate gets from trials
of its own; a write to the shared inputs is seen, put back, and every candidate attached meanwhile is evaluated again
on its own trials; a worker's correct verdict stands only on the server's findings. CPU tests share the trials
through shared-memory files; the GPU test maps them with CUDA IPC.
"""
import time
import types

import pytest
import torch

import eval_harness as eh
import harness.compare as hc
import harness.processes as hp
import harness.verdict as hv
from tests.common import CASES, GOOD_RELU, GPU_RELU_TASK, RELU_TASK, ROOT, WRONG

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

# one task, candidates with every kind of verdict that comes after the reference's trials (the static ones never
# reach a worker): ok, mismatch (values, shapes, a cache keyed by data_ptr), input mutation, a tensor subclass
# returned, a patched allclose
_NAMES = ["good_relu", "stale_memory", "input_mutation", "cache_by_data_ptr", "tensor_subclass_runtime",
          "patch_allclose_runtime"]


def _verdicts(results) -> list:
    return [(r.error_kind, r.details.get("check"), r.correct) for r in results]


def test_reference_server_gives_the_verdicts_of_private_trials():
    pairs = [(CASES[n][0], CASES[n][1]) for n in _NAMES] + [(RELU_TASK, WRONG)]
    runs = {}
    for served in (False, True):
        with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False,
                          reference_server=served) as ev:
            runs[served] = ev.map(pairs)
    assert _verdicts(runs[True]) == _verdicts(runs[False])
    assert [kind for kind, _, _ in _verdicts(runs[True])][:len(_NAMES)] == [CASES[n][2] for n in _NAMES]
    assert all(r.details.get("reference_server") for r in runs[True])   # (every one got past stage 1 there)
    assert not any(r.details.get("reference_server") for r in runs[False])
    assert runs[True][0].details["trials"] == runs[False][0].details["trials"] == 6


def test_reference_server_only_for_tasks_with_two_candidates_and_then_ended():
    pairs = [(RELU_TASK, GOOD_RELU), (RELU_TASK, WRONG), (CASES["good_add"][0], CASES["good_add"][1])]
    made = []
    original = hp.ReferenceServer.__init__

    def counting(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)
    hp.ReferenceServer.__init__ = counting
    try:
        with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False) as ev:
            results = ev.map(pairs)
    finally:
        hp.ReferenceServer.__init__ = original
    assert [r.error_kind for r in results] == ["ok", "mismatch", "ok"]
    assert [bool(r.details.get("reference_server")) for r in results] == [True, True, False]
    assert len(made) == 1 and made[0].worker is None   # (one server, for the ReLU task; closed by the end of map)


def _cpu_server(task: str = RELU_TASK):
    opts = dict(eh.DEFAULTS, compile_timeout=120.0)
    pool = hp.Pool(hp.worker_env("cpu", "triton", opts, "run"), 0)
    limits = {"startup": 300.0, "reference": 300.0, "run": 60.0}
    job = {"ref_src": task, "backend": "triton", "device": "cpu", "opts": opts}
    return pool, hp.ReferenceServer(pool.take(), job, limits)


def test_reference_server_sees_a_write_to_the_shared_inputs_puts_them_back_and_taints_who_was_attached():
    pool, server = _cpu_server()
    try:
        assert server.failure is None and server.trials == 6   # 5 trials and the heavy-tailed one
        first, _ = server.attach()
        assert server.release(first) is False   # nothing written: the verdict stands
        writer, shared = server.attach()
        bystander, _ = server.attach()
        inputs = hc.unshare(shared)["inputs"]   # mapped here as in a candidate's worker
        before = [trial[0].clone() for trial in inputs]
        inputs[2][0][:10] = 7.0          # a normal trial's input
        inputs[-1][0].mul_(-1.0)         # the heavy-tailed one
        assert server.release(writer) is True
        assert server.release(bystander) is True   # attached while the inputs were changed: tainted too
        later, shared = server.attach()
        assert server.release(later) is False
        again = hc.unshare(shared)["inputs"]
        assert all(torch.equal(a[0], b) for a, b in zip(again, before))   # drawn again from their seeds
        assert all(torch.equal(a[0], b) for a, b in zip(inputs, before))   # in the same memory
    finally:
        server.close()
        pool.close()


def test_reference_server_keeps_only_its_trials_bytes_once_they_are_made():
    """The server is admitted with what making the trials takes (memory_need's "trials" part) and gives back what
    it does not keep (served_need: the trials it stores, a comparison's temporaries, one input)."""
    opts = dict(eh.DEFAULTS, compile_timeout=120.0)
    pool = hp.Pool(hp.worker_env("cpu", "triton", opts, "run"), 0)
    memory = hp.Memory(2**40, {})
    job = {"ref_src": RELU_TASK, "backend": "triton", "device": "cpu", "opts": opts}
    server = hp.ReferenceServer(pool.take(), job, {"startup": 300.0, "reference": 300.0, "run": 60.0}, memory=memory)
    try:
        per_input = 4096 * 4   # RELU_TASK: 4096 float32 values in, as many out (tests.common)
        asked = sum(hp.memory_need(per_input, per_input, opts, "cpu", part="trials"))
        kept = hp.served_need(6 * 2 * per_input, per_input, per_input)   # 5 trials and the heavy one
        assert kept == 8 * 2 * per_input and asked - kept == 3 * per_input   # (the heavy trial's temporaries)
        assert server.failure is None and server.granted == {"host": kept, "counted": False} and kept < asked
        assert memory.free["host"] == 2**40 - kept and memory.running == 0
    finally:
        server.close()
        pool.close()
    deadline = time.monotonic() + 15
    while memory.free["host"] != 2**40 and time.monotonic() < deadline:   # (given back once its worker is gone)
        time.sleep(0.05)
    assert memory.free["host"] == 2**40


def test_reference_server_whose_reference_fails_leaves_the_candidates_their_own_verdicts():
    broken = RELU_TASK + "\ndef get_inputs():\n    raise RuntimeError('no inputs today')\n"
    pool, server = _cpu_server(broken)
    server.close()
    pool.close()
    assert server.failure.error_kind == "runtime" and "no inputs today" in server.failure.error
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False) as ev:
        results = ev.map([(broken, GOOD_RELU), (broken, WRONG)])
    assert [r.error_kind for r in results] == ["runtime", "runtime"]
    assert all("no inputs today" in r.error and not r.details.get("reference_server") for r in results)
    assert all("no inputs today" in r.details["no_server"] for r in results)   # (why they went without one)


def test_reference_server_tainted_candidates_are_evaluated_again_on_their_own_trials(monkeypatch):
    monkeypatch.setattr(hp.ReferenceServer, "release", lambda self, ticket: True)   # as if the inputs had changed
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False) as ev:
        results = ev.map([(RELU_TASK, GOOD_RELU), (RELU_TASK, WRONG)])
    assert [r.error_kind for r in results] == ["ok", "mismatch"]
    assert all(r.details.get("rerun_private") == "the shared inputs changed" for r in results)
    assert not any(r.details.get("reference_server") for r in results)   # the verdicts are the private runs'


def test_reference_server_that_dies_fails_loudly_and_its_candidates_make_their_own_trials(monkeypatch):
    import os
    import signal
    pool, server = _cpu_server()
    try:
        os.kill(server.worker.pid, signal.SIGKILL)
        with pytest.raises(hp.ServerFailed):
            server.compare(0, b"")
        assert server.failure   # (the next candidates of its task go without it)
    finally:
        server.close()
        pool.close()

    def dies(self, trial, outputs):   # a server that dies under the candidates' first comparison
        self.failure = "EOFError on its pipe"
        raise hp.ServerFailed(self.failure)
    monkeypatch.setattr(hp.ReferenceServer, "compare", dies)
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False) as ev:
        results = ev.map([(RELU_TASK, GOOD_RELU), (RELU_TASK, WRONG), (RELU_TASK, GOOD_RELU + "\n_SECOND = 1\n")])
    assert [r.error_kind for r in results] == ["ok", "mismatch", "ok"]
    # the correct ones needed a comparison: made on their own trials (the wrong one's shape fails before any)
    assert not any(r.details.get("reference_server") for r in results if r.correct)
    assert any("the reference server failed" in (r.details.get("rerun_private") or "") for r in results)


def test_reference_server_a_correct_verdict_needs_every_trial_found_right_there():
    ok = hv.verdict("ok", compiled=True)
    run = types.SimpleNamespace(server=types.SimpleNamespace(trials=3), compared={0: None, 1: None, 2: None})
    assert hp.JobRun.held_to_server(run, ok) is ok
    for compared in ({0: None, 1: None}, {0: None, 1: "mismatch", 2: None}, {}):
        run.compared = compared
        held = hp.JobRun.held_to_server(run, ok)
        assert held.error_kind == "reward_hack" and held.details["check"] == "unverified" and not held.correct
    failed = hv.verdict("mismatch", "output 0: 3 of 4096 values differ", compiled=True)
    assert hp.JobRun.held_to_server(run, failed) is failed   # (only a correct verdict needs the server's word)
    run.server = None
    assert hp.JobRun.held_to_server(run, ok) is ok   # (no server: the worker compared itself)


def test_reference_server_messages_are_held_to_their_shape():
    key = "k" * 32
    assert not hp.forged(("compare", 0, b"outputs"), key, "run", "evaluate")
    assert hp.forged(("compare", 0, b"outputs"), key, "reference", "evaluate")   # only while checking correctness
    assert hp.forged(("compare", "0", b"outputs"), key, "run", "evaluate")
    assert hp.forged(("compare", 0, "outputs"), key, "run", "evaluate")
    assert hp.forged(("compare", 0, b"outputs"), key, "run", "lint")
    assert not hp.forged(("served", 6, 0, 2**30, 0, 2**31), key, "reference", "serve")
    assert hp.forged(("served", 6, 0, 2**30, 0, 2**31), key, "reference", "evaluate")   # a candidate's worker never serves


def test_reference_server_output_problem_needs_only_the_spec():
    ref = (torch.ones(3, 4), torch.zeros(2, dtype=torch.int64))
    spec = hc.output_spec(ref)
    assert all(t.is_meta for t in spec) and type(spec) is tuple
    cpu = torch.device("cpu")
    assert hc.output_problem((torch.ones(3, 4), torch.zeros(2, dtype=torch.int64)), spec, cpu) is None
    assert hc.output_problem((torch.ones(3, 4),), spec, cpu)[0] == "mismatch"
    assert hc.output_problem((torch.ones(3, 5), torch.zeros(2, dtype=torch.int64)), spec, cpu)[0] == "mismatch"
    assert hc.output_problem((torch.ones(3, 4), torch.zeros(2)), spec, cpu)[0] == "mismatch"   # dtype
    assert hc.output_problem((torch.ones(3, 4, device="meta"), torch.zeros(2, dtype=torch.int64)), spec,
                             cpu)[:2] == ("reward_hack", "output_storage")


@pytest.mark.gpu
@gpu
def test_reference_server_gpu_ipc_verdicts_and_a_write_seen():
    """On a GPU the trials are mapped with CUDA IPC: known-good CUDA and Triton candidates get the verdicts of private
    trials, timed; a write to the mapped inputs from another process is seen and put back."""
    import os
    solutions = os.path.join(ROOT, "kernelbench_tasks", "solutions", "level1")
    tasks = os.path.join(ROOT, "kernelbench_tasks", "level1")
    for backend in ("triton", "cuda"):
        pairs = []
        for name in ("001_Relu", "010_Softmax", "014_SquareMatmul"):
            with open(os.path.join(tasks, name + ".py")) as f:
                ref = f.read()
            with open(os.path.join(solutions, f"{name}_{backend}.py")) as f:
                good = f.read()
            pairs += [(ref, good), (ref, good + "\n_SECOND_COPY = 1\n")]
        runs = {}
        for served in (False, True):
            with eh.Evaluator(backend=backend, progress=False, reference_server=served, timing_budget_s=0.3) as ev:
                runs[served] = ev.map(pairs)
        assert _verdicts(runs[True]) == _verdicts(runs[False]) == [("ok", None, True)] * len(pairs), \
            [r.error for r in runs[True] + runs[False]]
        assert all(r.details["reference_server"] and r.speedup for r in runs[True])
    opts = dict(eh.DEFAULTS, compile_timeout=120.0)
    pool = hp.Pool(hp.worker_env("cuda", "triton", opts, "run", gpu=0), 0)
    server = hp.ReferenceServer(pool.take(), {"ref_src": GPU_RELU_TASK, "backend": "triton", "device": "cuda",
                                              "opts": opts}, {"startup": 300.0, "reference": 300.0, "run": 60.0})
    try:
        assert server.failure is None
        ticket, shared = server.attach()
        inputs = hc.unshare(shared)["inputs"]
        assert inputs[0][0].is_cuda
        before = inputs[1][0].clone()
        inputs[1][0].fill_(3.0)
        torch.cuda.synchronize()
        assert server.release(ticket) is True
        assert torch.equal(inputs[1][0], before)
    finally:
        server.close()
        pool.close()


@pytest.mark.gpu
@gpu
def test_reference_server_gpu_counts_a_candidates_memory_from_the_reference_work():
    """On a GPU the server measures what the reference's forward allocates beyond its output (ReLU: nothing; RMSNorm:
    nothing either, its x * x is freed before the output is made; MSE per row: the full-size squared differences,
    128 MB), and each timed candidate is admitted with memory counted from it, never above the bound and no less
    than the candidate's measured peak (the largest of its stages' peaks)."""
    import os
    solutions = os.path.join(ROOT, "kernelbench_tasks", "solutions", "level1")
    tasks = os.path.join(ROOT, "kernelbench_tasks", "level1")
    pairs = []
    for name in ("001_Relu", "013_RMSNorm", "053_MSELoss"):
        with open(os.path.join(tasks, name + ".py")) as f:
            ref = f.read()
        with open(os.path.join(solutions, f"{name if name != '053_MSELoss' else '001_Relu'}_triton.py")) as f:
            good = f.read()   # (ReLU's solution for the MSE task: wrong, but its worker reads the server's details)
        pairs += [(ref, good), (ref, good + "\n_SECOND_COPY = 1\n")]
    with eh.Evaluator(backend="triton", progress=False, timing_budget_s=0.3) as ev:
        results = ev.map(pairs)
    assert [(r.error_kind, bool(r.speedup)) for r in results[:4]] == [("ok", True)] * 4, [r.error for r in results]
    assert all(r.details["reference_server"] for r in results)
    relu, rms, mse = (results[i].details["ref_work_bytes"] for i in (0, 2, 4))
    assert relu < 2**23 and rms < 2**23 and 2**27 <= mse < 2**30, (relu, rms, mse)
    bound = hp.memory_need(2**27, 2**27, eh.DEFAULTS, "cuda", True, part="candidate")[1]
    for r in results[:4]:   # (at 128 MiB the count reaches the bound: the CPU tests show it below at gigabytes)
        peak_mb = max(peak for peak, _ in r.details["gpu_mb"].values())
        need_mb = r.details["mem_need_mb"][1]
        assert peak_mb <= need_mb <= bound / 2**20, (peak_mb, need_mb, r.details["gpu_mb"])
