"""Tests: the CUDA-graph timing's hole of a replay that does nothing (pitfall 18 of eval_harness.py's table), and its
two fixes in harness/timing.py: outputs poisoned before every checked replay (_poison_outputs), and the bandwidth
floor (option timing_floor: read_floor_ms, peak_bandwidth, time_within_floor; the worker's verdict).

The hole, as measured: a correct CUDA kernel launched on the legacy default stream (`<<<grid, block>>>`) is not in
the graph captured for timing, so every replay does nothing; for a mean loss over 512 MB of random data the output
the capture left behind still matches the reference on both input sets, so the replays' check and the spot checks
passed, and the candidate was timed as an empty graph (1.3 us against 0.41 ms, a 323x speedup). CPU tests use
stand-in captures and events (tests/harness_throughput.py); the GPU tests run the real thing."""
import collections
import types

import pytest
import torch

import eval_harness as eh
import harness.compare as hc
import harness.timing as ht
import harness.worker as hw
from tests.common import stand_in_cuda_events

CPU = torch.device("cpu")


# ----------------------------------------------------------------------------------------------------------------------
# Fix 1: poisoned outputs before every checked replay

def test_harness_timing_poisoned_outputs_cannot_pass_the_comparison():
    """_poison_outputs leaves every value of every output dtype different from the reference (NaN for floats, which
    no tolerance passes; the lowest bit flipped for integers, logical not for bool), so a replay that writes nothing,
    or only part of its output, is a mismatch."""
    refs = [torch.randn(64), torch.randn(8).half(), torch.randn(8).bfloat16(), torch.randn(4, dtype=torch.complex64),
            torch.randint(-5, 5, (8,)), torch.tensor([0, 255], dtype=torch.uint8),
            torch.tensor([-2**63, 2**63 - 1]), torch.tensor([True, False]), torch.tensor(2.0)]
    for ref in refs:
        out = ref.clone()
        ht._poison_outputs(out, ref)
        assert not (out == ref).any(), (ref.dtype, out)
        if not ref.is_complex():   # (the comparison does not take complex outputs; the fill is the floats' one)
            assert hc.compare(out, ref, CPU, 1e9, 1e9)[0] == "mismatch", ref.dtype
    pair = (torch.randn(4), torch.arange(4))
    out = tuple(t.clone() for t in pair)
    ht._poison_outputs(out, pair)
    assert out[0].isnan().all() and not (out[1] == pair[1]).any()
    expanded = torch.zeros(()).expand(4)   # (one value seen four times: poisoned all the same)
    ht._poison_outputs(expanded, torch.zeros(4))
    assert expanded.isnan().all()


def _mean_square_trials(monkeypatch):
    """Stand-in events, and trials of a model whose output hardly depends on its input values (the mean square of
    random data, as the measured hole's mean loss): the two timed sets' outputs agree within the tolerance used."""
    trials, g = stand_in_cuda_events(monkeypatch), torch.Generator().manual_seed(0)
    for trial in trials:
        trial["inputs"] = [torch.randn(64, generator=g)]
        trial["out"] = (trial["inputs"][0] ** 2).mean()
    assert hc.compare(trials[0]["out"], trials[1]["out"], CPU, *_TOL)[0] is None   # (the hole's precondition)
    monkeypatch.setattr(torch.cuda, "Stream", lambda *args, **kwargs: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *args: (2**40, 2**40))
    return trials


_TOL = (0.5, 0.5)   # the stand-in trials' 64 values: their mean squares agree within this


def test_harness_timing_graph_replays_that_write_nothing_are_not_trusted(monkeypatch):
    """The hole on the CPU: a stand-in capture whose replays write nothing (the legacy-stream kernel ran once, during
    the capture), for an output that is the same on both input sets within the tolerance. The replays' check reads
    poisoned outputs, so the graphs are not trusted and both models are timed eagerly (before the fix: "graph",
    every check passed). A graph that writes during its two checked replays and nothing after them is caught by
    the spot checks, which poison the output first too (before the fix: every spot check passed)."""
    trials = _mean_square_trials(monkeypatch)
    msq = lambda x: (x ** 2).mean()  # noqa: E731
    cand = lambda x: (x ** 2).mean()  # noqa: E731
    writes = {}   # model -> how many more replays write its output (None: all of them)

    def capture(model, pristine, stream):
        static = [x.clone() for x in pristine]
        out = model(*static).clone()   # the capture run's output, left in the graph's output memory
        left = [writes.get(model)]

        class Graph:
            def replay(self):
                if left[0] is None or left[0] > 0:
                    out.copy_(model(*static))
                    left[0] = None if left[0] is None else left[0] - 1
        return Graph(), static, out
    monkeypatch.setattr(ht, "_capture", capture)
    rule = ht.timing_rule(eh.DEFAULTS)

    writes[cand] = 0   # never: the legacy-stream kernel
    times = ht.time_models({"ref": msq, "cand": cand}, trials, CPU, 0.05, checked="cand", tol=_TOL, **rule)
    assert times["method"] == "eager" and "cand" in times["graph_fallback"], times.get("graph_fallback")
    assert "disagrees" in times["graph_fallback"] and not any(times["bad_output"])   # (eager: it computes)

    writes[cand] = 2   # the two checked replays only
    times = ht.time_models({"ref": msq, "cand": cand}, trials, CPU, 0.05, checked="cand", tol=_TOL, **rule)
    assert times["method"] == "graph" and len(times["bad_output"]) == ht.SPOT_CHECKS
    assert all(times["bad_output"]), times["bad_output"]   # every spot rep read the poison, not the capture's output

    writes[cand] = None   # a graph that computes: nothing changes for it
    times = ht.time_models({"ref": msq, "cand": cand}, trials, CPU, 0.05, checked="cand", tol=_TOL, **rule)
    assert times["method"] == "graph" and times["bad_output"] == [False] * ht.SPOT_CHECKS


# ----------------------------------------------------------------------------------------------------------------------
# Fix 2: the bandwidth floor

def test_harness_timing_floor_arithmetic_and_peak_bandwidth(monkeypatch):
    """peak_bandwidth: memory clock (kHz) x bus width (bits) / 8 x 2 from the device properties, the name table's
    entry where that is larger (the properties may lack or zero those fields), the fallback where neither is known;
    read_floor_ms: a fraction of reading the bytes once. The measured hole's numbers: 512 MB of inputs on an H100 is
    a floor far above the empty graph's 1.3 us and far below the reference's 0.41 ms."""
    props = {}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(**props))
    props.update(name="NVIDIA A100-SXM4-80GB", memory_clock_rate=1593000, memory_bus_width=5120)
    assert ht.peak_bandwidth(0) == pytest.approx(2.039e12, rel=1e-3)
    props.update(name="NVIDIA H200", memory_clock_rate=3201000, memory_bus_width=6144)
    assert ht.peak_bandwidth(0) == pytest.approx(4.917e12, rel=1e-3)   # (above the table's 4.9e12)
    props.update(name="NVIDIA H100 80GB HBM3", memory_clock_rate=2619000, memory_bus_width=5120)
    assert ht.peak_bandwidth(0) == ht.PEAK_BANDWIDTH["H100"] == 3.9e12   # (the NVL's 3.9 TB/s above the SXM's 3.35)
    props.update(memory_clock_rate=0, memory_bus_width=0)
    assert ht.peak_bandwidth(0) == 3.9e12
    props.clear()
    props.update(name="NVIDIA H100 PCIe")   # no memory fields at all
    assert ht.peak_bandwidth(0) == 3.9e12
    props.update(name="Some Future GPU")
    assert ht.peak_bandwidth(0) == ht.PEAK_BANDWIDTH_FALLBACK == 10e12

    assert ht.read_floor_ms(3 * 10**9, 3e12, 1.0) == pytest.approx(1.0)
    assert ht.read_floor_ms(3 * 10**9, 3e12, 0.5) == pytest.approx(0.5)
    assert ht.read_floor_ms(3 * 10**9, 3e12, 0.0) == 0.0
    floor = ht.read_floor_ms(512 * 2**20, 3.9e12, eh.DEFAULTS["timing_floor"])
    assert eh.DEFAULTS["timing_floor"] == 0.5 and 1.3e-3 * 10 < floor < 0.41 / 4, floor   # ~0.069 ms


def test_harness_timing_floor_option_is_checked():
    """timing_floor is a number from 0 (no floor) to 1, refused before any worker starts (Evaluator, with_options,
    evaluate); unknown options stay a TypeError."""
    for bad in (-0.1, 1.5, "0.5", None, True):
        with pytest.raises(ValueError, match="timing_floor"):
            eh.Evaluator(device="cpu", timing_floor=bad)
        with pytest.raises(ValueError, match="timing_floor"):
            eh.evaluate("", "", backend="triton", device="cpu", timing_floor=bad)
    for good in (0, 0.5, 1):
        eh._check_options({"timing_floor": good})
    ev = eh.Evaluator(device="cpu", backend="triton", progress=False)
    try:
        with pytest.raises(ValueError, match="timing_floor"):
            ev.with_options(timing_floor=2)
        with pytest.raises(TypeError, match="unknown options"):
            ev.with_options(timing_flor=0.5)
    finally:
        ev.close()


def _fake_timings(monkeypatch, medians: dict) -> list:
    """time_models replaced: each call returns 20 reps per model at medians[graphs][name] ms, method "graph" when
    asked for graphs; returns the list of `graphs` arguments it was called with."""
    calls = []

    def fake(models, trials, device, budget_s, checked=None, graphs=False, **rule):
        calls.append(graphs)
        times = {name: [medians[graphs][name]] * 20 for name in models}
        return dict(times, method="graph" if graphs else "eager", bad_output=[False] * ht.SPOT_CHECKS,
                    host=[0.1] * 20, ref_intact=len(calls) > 1 or medians.get("intact", True))
    monkeypatch.setattr(ht, "time_models", fake)
    return calls


def test_harness_timing_floor_retimes_eagerly_then_flags(monkeypatch):
    """time_within_floor: a candidate's graph median below the floor (the empty graph's 1.3 us against a 0.069 ms
    floor) is retimed eagerly; still below it there, below_floor is set (the worker's reward_hack); above it then (a
    legacy-stream kernel that computes when called), not. Above the floor from the start, or a reference below it
    too (a task whose reference does not read all of its inputs), no retime and no flag; floor 0 never flags. The
    retime keeps the first timing's spot checks and ref_intact."""
    floor, models = 0.069, {"ref": None, "cand": None}

    def run(graph: dict, eager: dict, floor_ms=floor, graphs=True, intact=True):
        calls = _fake_timings(monkeypatch, {True: graph, False: eager, "intact": intact})
        times = ht.time_within_floor(models, [], CPU, 0.5, "cand", floor_ms, graphs=graphs)
        return times, calls

    hack = {"ref": 0.41, "cand": 0.0013}
    times, calls = run(hack, hack)
    assert calls == [True, False] and times["below_floor"] and times["method"] == "eager"
    assert "bandwidth floor" in times["graph_fallback"] and len(times["bad_output"]) == 2 * ht.SPOT_CHECKS
    times, calls = run(hack, {"ref": 0.45, "cand": 0.15})   # eagerly it reads its inputs: believed
    assert calls == [True, False] and not times["below_floor"] and times["method"] == "eager"
    times, calls = run({"ref": 0.41, "cand": 0.2}, hack)
    assert calls == [True] and not times["below_floor"] and times["method"] == "graph"
    times, calls = run({"ref": 0.01, "cand": 0.0013}, hack)   # the reference is below the floor too
    assert calls == [True] and not times["below_floor"]
    times, calls = run(hack, hack, floor_ms=ht.read_floor_ms(512 * 2**20, 3.9e12, 0.0))
    assert calls == [True] and not times["below_floor"]
    times, calls = run(hack, hack, graphs=False)   # eager from the start: no second timing, still flagged
    assert calls == [False] and times["below_floor"]
    times, calls = run(hack, hack, intact=False)
    assert calls == [True, False] and not times["ref_intact"]


def test_harness_timing_floor_verdict_in_the_worker(monkeypatch):
    """The worker's floor (_bandwidth_floor_ms, taken in stage 1 before the candidate exists) is timing_floor of
    reading trial 0's inputs at peak_bandwidth; its timing stage (_time_candidate, on a stand-in evaluation) times
    within that floor, and below_floor is reward_hack "below_bandwidth_floor", with the numbers in the message;
    otherwise the speedup stands and details["read_floor_ms"] says the floor."""
    seen = {}

    def timed(models, trials, device, budget_s, checked, floor_ms, **rule):
        seen.update(floor_ms=floor_ms, checked=checked, graphs=rule["graphs"])
        return {"ref": [0.41] * 20, "cand": [0.0013] * 20, "host": [0.01] * 20, "method": "eager",
                "bad_output": [False] * 3, "ref_intact": True, "below_floor": seen["below"]}
    monkeypatch.setattr(hw, "time_within_floor", timed)
    monkeypatch.setattr(hw, "peak_bandwidth", lambda device: 4e12)

    class Instrumentation:   # nothing patched, no ops recorded
        turn, ops = "shared", collections.Counter()

        def recorded_when_captured(self, model):
            return model

        def verify(self):
            return None

    def stage(below: bool):
        seen["below"] = below
        ev = hw._Evaluation({"device": "cuda", "opts": dict(eh.DEFAULTS)}, conn=None)   # (no CUDA call is made)
        ev.instr, ev.ref_model, ev.cand_model, ev.atol, ev.rtol = Instrumentation(), None, None, 1e-4, 1e-4
        ev.trials = [{"inputs": [torch.zeros(2**20), 3], "out": torch.zeros(()), "heavy": False}]
        ev.floor_ms = hw._bandwidth_floor_ms(ev.trials, ev.device, ev.opts)
        return ev, hw._time_candidate(ev)

    ev, verdict = stage(True)
    assert seen == {"floor_ms": pytest.approx(0.5 * 4 * 2**20 / 4e12 * 1e3), "checked": "cand", "graphs": True,
                    "below": True}
    assert verdict.error_kind == "reward_hack" and verdict.details["check"] == "below_bandwidth_floor"
    assert "bandwidth floor" in verdict.error and "1.30 us" in verdict.error, verdict.error
    ev, verdict = stage(False)
    assert verdict is None and ev.timing["speedup"] == pytest.approx(0.41 / 0.0013)
    assert ev.details["read_floor_ms"] == pytest.approx(seen["floor_ms"])


# ----------------------------------------------------------------------------------------------------------------------
# GPU tests (python -m pytest -q -m gpu tests/test_graph_timing.py)

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

MSE_512MB_TASK = '''
import torch
import torch.nn as nn

N = 64 * 1024 * 1024   # two fp32 inputs of 256 MB: 512 MB in all, the task rules' largest

class Model(nn.Module):
    def forward(self, a, b):
        return torch.mean((a - b) ** 2)

def get_inputs():
    return [torch.randn(N), torch.randn(N)]

def get_init_inputs():
    return []
'''

# A correct mean squared error whose two kernels launch on the legacy default stream (no stream argument), as the
# measured hole's did: a CUDA graph capture runs them but does not record them
LEGACY_STREAM_MSE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = """
#include <torch/extension.h>
__device__ double block_sum(double s, double* acc) {
    acc[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) acc[threadIdx.x] += acc[threadIdx.x + k];
        __syncthreads();
    }
    return acc[0];
}
__global__ void sq_diff_partials(const float* a, const float* b, double* partial, long n) {
    __shared__ double acc[256];
    double s = 0.0;
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
        float d = a[i] - b[i];
        s += (double)d * d;
    }
    s = block_sum(s, acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}
__global__ void mean_of_partials(const double* partial, int blocks, float* out, long n) {
    __shared__ double acc[256];
    double s = 0.0;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
    s = block_sum(s, acc);
    if (threadIdx.x == 0) out[0] = (float)(s / (double)n);
}
torch::Tensor mse_cuda(torch::Tensor a, torch::Tensor b) {
    const int blocks = 1024;
    auto partial = torch::empty({blocks}, a.options().dtype(torch::kFloat64));
    auto out = torch::empty({}, a.options());
    long n = a.numel();
    sq_diff_partials<<<blocks, 256>>>(a.data_ptr<float>(), b.data_ptr<float>(), partial.data_ptr<double>(), n);
    mean_of_partials<<<1, 256>>>(partial.data_ptr<double>(), blocks, out.data_ptr<float>(), n);
    return out;
}
"""
ext = load_inline(name="kz_test_legacy_mse", cpp_sources="torch::Tensor mse_cuda(torch::Tensor a, torch::Tensor b);",
                  cuda_sources=cuda_src, functions=["mse_cuda"], verbose=False)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return ext.mse_cuda(a.contiguous(), b.contiguous())
'''


@pytest.mark.gpu
@gpu
def test_harness_gpu_timing_legacy_stream_mean_loss_gets_no_impossible_speedup():
    """The measured hole, end to end: the legacy-stream MSE over 512 MB is never timed as its empty graph. Its graph's
    checked replays read poisoned outputs, so it is timed eagerly, where its kernels run when called: then it is
    `ok` with a runtime no shorter than reading its 512 MB once at the GPU's peak bandwidth (before the fixes: graph
    timing, ~1.3 us, 323x); a mismatch or reward_hack would also close the hole."""
    result = eh.evaluate(MSE_512MB_TASK, LEGACY_STREAM_MSE, backend="cuda", device="cuda")
    print(f"[legacy-stream mse] {result.error_kind} speedup={result.speedup} runtime_ms={result.runtime_ms} "
          f"method={result.details.get('timing_method')} fallback={result.details.get('graph_fallback')!r} "
          f"check={result.details.get('check')} error={result.error[:300]!r}", flush=True)
    assert result.error_kind in ("ok", "mismatch", "reward_hack"), result
    if result.error_kind == "ok":
        read_ms = ht.read_floor_ms(512 * 2**20, ht.peak_bandwidth(0), 1.0)   # the whole read, at peak
        assert result.details["timing_method"] == "eager", result.details
        assert result.details["graph_fallback"], result.details   # (its replays disagree, or its capture failed)
        assert result.runtime_ms >= read_ms and result.speedup < 20, (result.runtime_ms, read_ms, result.speedup)
        assert result.details["read_floor_ms"] == pytest.approx(0.5 * read_ms)


@pytest.mark.gpu
@gpu
def test_harness_gpu_timing_floor_retimes_eagerly_and_flags_an_impossible_median():
    """time_within_floor on the GPU, in this process: a "candidate" that returns a stored result (a 4-byte copy,
    microseconds as a graph and eagerly) against the 512 MB MSE reference is below the floor as a graph, is retimed
    eagerly, and stays below it (the worker's reward_hack); the reference itself as the candidate reads its inputs
    and is believed as a graph, with no retime."""
    device, n = torch.device("cuda"), 64 * 2**20
    reference = lambda a, b: torch.mean((a - b) ** 2)  # noqa: E731
    trials = []
    for seed in (1, 2):
        g = torch.Generator(device).manual_seed(seed)
        a, b = (torch.randn(n, device=device, generator=g) for _ in range(2))
        trials.append({"inputs": [a, b], "out": reference(a, b), "heavy": False})
    stored = trials[0]["out"].clone()
    floor_ms = ht.read_floor_ms(2 * n * 4, ht.peak_bandwidth(device), eh.DEFAULTS["timing_floor"])
    # a loose tolerance: the stored result must pass the graphs' checks on both input sets (two MSE estimates over
    # 64M values differ by ~5e-4, above fp32's 1e-4), so that it is timed as the graph the floor then doubts
    rule = dict(ht.timing_rule(eh.DEFAULTS), tol=(1.0, 1.0))
    times = ht.time_within_floor({"ref": reference, "cand": lambda a, b: stored.clone()}, trials, device, 0.5,
                                  "cand", floor_ms, **rule)
    medians = {name: ht.median(times[name]) for name in ("ref", "cand")}
    print(f"[floor] floor_ms={floor_ms:.4f} medians={medians} method={times['method']} "
          f"fallback={times.get('graph_fallback')!r}", flush=True)
    assert medians["ref"] >= floor_ms > medians["cand"], (medians, floor_ms)
    assert times["below_floor"] and times["method"] == "eager" and "bandwidth floor" in times["graph_fallback"]
    honest = ht.time_within_floor({"ref": reference, "cand": reference}, trials, device, 0.5, "cand", floor_ms,
                                   **rule)
    assert not honest["below_floor"] and honest["method"] == "graph", honest.get("graph_fallback")
