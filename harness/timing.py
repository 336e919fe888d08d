"""harness/timing.py: how a worker times a candidate against its reference on the GPU. Runs inside a worker process
only (harness/worker.py's stage 5, _time_candidate, which owns the GPU turns and the checks after timing).

The rule (harness/README.md, "How a kernel is timed", has it with its measurements)
  Reference and candidate are timed in the candidate's process, interleaved rep by rep (who goes first rotates), on
  the same two input sets. Each model's forward is captured once as a CUDA graph and replayed between two CUDA
  events; where either cannot be captured (a host sync in its forward), or a replay does not reproduce the
  reference outputs (a CUDA kernel launched on the legacy default stream runs during the capture but is not in the
  graph), both are called eagerly with a device-wide synchronize before the end event. Every replay whose output is
  compared starts from poisoned outputs (_poison_outputs), so a replay that writes nothing never passes on what the
  capture left there. Before every rep a 256 MB buffer is zeroed (an L2 flush). Reps go on until both medians' 95%
  confidence intervals are within `ci` (2%) of them, at least `min_reps`, at most 300 reps or `budget_s` of wall
  time. A few unpredictable reps have the candidate's output compared with the reference's. A candidate median
  below a fraction of the time its inputs take to read once at the GPU's peak bandwidth is not believed
  (time_within_floor): retimed eagerly, and still below it is the caller's `reward_hack`.

How it departs from KernelBench's timing (src/eval.py: the model called between two CUDA events, a fixed number of
trials, reference and candidate timed separately)
  1. Graph replays: no host latency inside the timed window (a small kernel's time would otherwise be mostly the
     Python launch path); eager as a fallback, for both models alike (details["timing_method"]).
  2. Reference and candidate interleaved in the same process on the same inputs (pitfall 15): a GPU's clocks and
     its neighbours' load drift over seconds, and both see the same drift.
  3. An L2 flush before every rep: a kernel is not timed on inputs its previous rep left in cache.
  4. Adaptive repetitions: the reward uses clip(ln speedup), so a few percent of precision is enough; fast, stable
     kernels stop after `min_reps`.
  5. Spot checks (SPOT_CHECKS) on reps the candidate cannot predict: an output cached or replayed while timed is a
     `mismatch` (check "timing_output").
  6. `exclusive()` / `after()`: the caller holds the GPU alone only for the timed reps; input copies, captures and
     warm-up overlap other workers' correctness checks.
  7. A physical floor (read_floor_ms): no kernel reads its inputs faster than the GPU's memory allows.

Nothing to run: harness/worker.py imports it (bench.py harness --sections stability measures it); it imports
harness/verdict.py (truncate) and harness/compare.py, neither of which imports it: no import cycle. To a candidate
it is part of the harness: harness/static_checks.py bans importing it, and the identity snapshot covers its functions.
"""
from __future__ import annotations
import contextlib
import os
import random
import time

import torch

from harness.compare import (compare, copy_out, host_floats, judge_numbers, nbytes, output_numbers, same,
                             tensors, tolerance)
from harness.verdict import truncate


# ---------------------------------------------------------------------------------------------------------------------
# CUDA graphs: one capture per model, checked by replaying it on both input sets

def _capture(model, pristine: list, stream) -> tuple:
    """(graph, static_args, static_out): one forward of `model` captured as a CUDA graph, on copies of `pristine`.
    A replay reruns the captured kernels on whatever static_args hold then, with no Python in between. Raises where
    a forward cannot be captured: a host sync (.item(), a device-to-host copy), an unjoined side stream, an
    allocation outside the graph's pool. (A kernel launched on the legacy default stream runs during the capture
    but is not in the graph: _graph_runners' replays, on poisoned outputs, find it out.)"""
    static = [x.clone() if isinstance(x, torch.Tensor) else x for x in pristine]
    graph = torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())   # (the copies above first)
    with torch.no_grad(), torch.cuda.stream(stream):
        model(*static)   # a warm-up on the capture's stream first (cuBLAS workspaces, lazy inits), as torch's CUDA
        stream.synchronize()   # graph notes ask; then the capture itself. (Not `with torch.cuda.graph(...)`: it
        graph.capture_begin()   # also empties the allocator's and pinned-host caches: driver calls for nothing here)
        try:
            out = model(*static)
        except BaseException:
            with contextlib.suppress(Exception):
                graph.capture_end()   # (the capture is invalid: the forward's own error is the reason)
            raise
        graph.capture_end()
    return graph, static, out


def _graph_runners(models: dict, sets: list, tol: tuple, device) -> tuple[dict | None, str | None]:
    """({name: (graph, static_args, static_out)}, None) when every model's forward captures as a CUDA graph whose
    replays reproduce the reference outputs of every input set; else (None, why not): then all of them are timed
    eagerly, so that reference and candidate are always measured the same way. `tol`: (atol, rtol); (0, 0) takes
    the output dtype's TOLERANCES entry (a replay of the reference runs its own kernels again, cuBLAS may pick
    another algorithm under capture)."""
    runners = {}
    tol = tol if any(tol) else tolerance(sets[0][1], {"atol": None, "rtol": None})
    need = len(models) * (nbytes(sets[0][0]) + nbytes(tensors(sets[0][1])))   # captured inputs and outputs
    try:
        # a multi-GB task whose copies do not fit: eager (its kernels take milliseconds, where host latency is noise)
        if need > 0.8 * torch.cuda.mem_get_info(device)[0]:
            return None, f"the graphs' copies ({need / 2**30:.1f} GB) do not fit in free GPU memory"
        stream = torch.cuda.Stream(device)
        for name, model in models.items():
            runners[name] = _capture(model, sets[0][0], stream)
        replays = []   # (name, its output's numbers on the device): all read at once below (a host read under
        for name, (graph, static, out) in runners.items():   # the shared turn waits for the other workers' slices)
            for inputs, ref_out in sets:   # (set 0 was the capture's own input: set 1 shows what replay reruns)
                _poison_outputs(out, ref_out)   # (a replay that writes nothing must not pass on what the capture
                _load_static(static, inputs)    # left there: a mean over random data barely changes between sets)
                graph.replay()   # (the numbers are computed on the stream before the next replay rewrites `out`)
                early, numbers = output_numbers(out, ref_out, device, *tol)
                if early:
                    return None, f"{name}: a replay of its captured forward disagrees with the reference ({early[2]})"
                replays.append((name, numbers))
        values = iter(host_floats([x for _, numbers in replays for _, _, xs in numbers for x in xs]))
        for name, numbers in replays:
            kind, _, message = judge_numbers(numbers, values, {"max_abs_err": 0.0, "max_rel_err": 0.0}, *tol)
            if kind:
                return None, f"{name}: a replay of its captured forward disagrees with the reference ({message})"
    except Exception as e:   # not capturable: the eager method, which needs none of this
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return None, truncate(f"{type(e).__name__}: {e}", 300)
    return runners, None


def _poison_outputs(out, ref_out) -> None:
    """Overwrite a captured graph's outputs with values its comparison with `ref_out` cannot pass: NaN for floating
    (and complex) outputs, the reference's values with their lowest bit flipped (logical not for bool) otherwise.
    Stream-ordered before a check replay or a spot-checked rep, so that only what the replay itself writes is
    compared: a kernel launched on the legacy default stream ran during the capture but is not in the graph, and
    its output from then may still match the reference where the output hardly depends on the inputs (a mean loss
    over random data). Raises where an output cannot be written: _graph_runners then times eagerly."""
    for o, r in zip(tensors(out), tensors(ref_out)):
        if o.is_floating_point() or o.is_complex():
            o.fill_(float("nan"))
        elif o.dtype == torch.bool:
            torch.logical_not(r.to(o.device), out=o)
        else:
            torch.bitwise_xor(r.to(o.device), 1, out=o)


def _load_static(static: list, inputs: list) -> None:
    """Copy one input set's values into a captured graph's input tensors (stream-ordered, before the flush)."""
    for s, x in zip(static, inputs):
        if isinstance(s, torch.Tensor):
            s.copy_(x)


# ---------------------------------------------------------------------------------------------------------------------
# The bandwidth floor: no kernel reads its inputs faster than the GPU's memory delivers them

# peak memory bandwidth in bytes/s by device name, for where the device properties lack the memory clock and bus
# width (some CUDA and torch versions do): each name's fastest variant (H100 NVL 3.9 TB/s, SXM 3.35, PCIe 2.0), as a
# higher peak is a lower floor and the floor must only catch the impossible; other GPUs get PEAK_BANDWIDTH_FALLBACK,
# above any GPU's memory of today (B200: 8 TB/s)
PEAK_BANDWIDTH = {"H200": 4.9e12, "H100": 3.9e12}
PEAK_BANDWIDTH_FALLBACK = 10e12


def peak_bandwidth(device) -> float:
    """The GPU's peak memory bandwidth in bytes/s: memory clock (kHz) x bus width (bits) / 8 x 2 (double data rate)
    from its device properties (H100 SXM: 2619 MHz x 5120 bits = 3.35 TB/s), or PEAK_BANDWIDTH's entry for its name
    where that is larger; PEAK_BANDWIDTH_FALLBACK where neither is known."""
    props = torch.cuda.get_device_properties(device)
    known = [getattr(props, "memory_clock_rate", 0) * 1e3 * getattr(props, "memory_bus_width", 0) / 8 * 2]
    known += [bandwidth for name, bandwidth in PEAK_BANDWIDTH.items() if name in props.name][:1]
    return max(known) if max(known) > 0 else PEAK_BANDWIDTH_FALLBACK


def read_floor_ms(nbytes: int, bandwidth: float, fraction: float) -> float:
    """`fraction` (the option timing_floor) of the ms that reading `nbytes` once at `bandwidth` bytes/s takes: the
    floor below which a median is not believed (0: none). 512 MB on an H100 (taken at 3.9 TB/s): 0.069 ms."""
    return fraction * nbytes / bandwidth * 1e3


def time_within_floor(models: dict, trials: list, device, budget_s: float, checked: str, floor_ms: float,
                       **rule) -> dict:
    """time_models, then the bandwidth floor: where the `checked` model's median is below `floor_ms` (the caller's
    read_floor_ms of the inputs) and no other model's is, the graph timing is not believed and every model is timed
    again eagerly (graph_fallback says why; the spot checks and ref_intact of both timings count). Adds
    times["below_floor"]: still below it (the caller's reward_hack). A reference below the floor too does not read
    all of its inputs (a task may not), and then the floor says nothing about the candidate."""
    def below(times: dict) -> bool:
        return median(times[checked]) < floor_ms and all(median(times[name]) >= floor_ms for name in models
                                                          if name != checked)

    times = time_models(models, trials, device, budget_s, checked=checked, **rule)
    if times["method"] == "graph" and below(times):
        first = times
        times = time_models(models, trials, device, budget_s, checked=checked, **dict(rule, graphs=False))
        times.update(bad_output=first["bad_output"] + times["bad_output"],
                     ref_intact=first["ref_intact"] and times["ref_intact"],
                     graph_fallback=f"{checked}: its graph's median ({median(first[checked]) * 1e3:.2f} us) is below "
                                    f"the bandwidth floor ({floor_ms * 1e3:.2f} us)")
    times["below_floor"] = below(times)
    return times


# ---------------------------------------------------------------------------------------------------------------------
# The timed reps

SPOT_CHECKS = 3   # timing reps whose output is compared with the reference, per timed candidate


def _spot_reps(n: int, sets: int, k: int, rng: random.Random) -> set[int]:
    """k distinct rep indices of range(n), drawn by rng, with at least one rep of every input set (rep % sets)."""
    picks = {rng.randrange(s, n, sets) for s in range(min(sets, n))}
    rest = [r for r in range(n) if r not in picks]
    return picks | set(rng.sample(rest, max(0, min(k - len(picks), len(rest)))))


def median_ci_width(xs: list) -> float:
    """Width of the distribution-free 95% confidence interval of the median (order statistics), relative to it."""
    xs, n = sorted(xs), len(xs)
    k = max(0, int((n - 1.96 * n ** 0.5) / 2))
    return (xs[n - 1 - k] - xs[k]) / max(xs[n // 2], 1e-9)


def median(xs: list) -> float:
    return sorted(xs)[len(xs) // 2]


def timing_rule(opts: dict) -> dict:
    return {"adaptive": opts["timing_adaptive"], "ci": opts["timing_ci"], "min_reps": opts["timing_min_reps"],
            "graphs": opts["timing_graphs"]}


def time_models(models: dict, trials: list, device, budget_s: float, checked: str | None = None,
                 tol: tuple = (0.0, 0.0), adaptive: bool = False, ci: float = 0.02, min_reps: int = 20,
                 graphs: bool = False, exclusive=None, after=None) -> dict:
    """Interleaved CUDA-event timing of several models on the same inputs (the module docstring).
    Returns {name: list of ms}, "method": "graph" or "eager" (and "graph_fallback": why not); the `checked` model's
    outputs are compared with the reference on a few unpredictable reps. `graphs`: each model's forward captured
    once as a CUDA graph and replayed per rep (_graph_runners; else, or where that fails, every model is called
    eagerly, with a device-wide synchronize before the end event). `adaptive`: reps (at least min_reps) until every
    model's median has a 95% confidence interval narrower than `ci` of it, at most 300 reps or `budget_s` of wall
    time; else the fixed rule (budget_s spent, 30..300 reps).
    `exclusive()`, if given, is called once everything before the timed reps is ready (input copies, captures,
    warm-up): the caller takes the GPU alone there, so other workers' checks overlap all of that. `after()`, if
    given, is called once the timed reps are done: the caller gives the GPU back to the others there (the checks
    that follow need no quiet GPU)."""
    flush = torch.empty(64 * 2**20, dtype=torch.int32, device=device)   # 256 MB, larger than any L2 (H200: 60 MB)
    # alternate values between reps. A trial kept on the GPU is used as it is (the models only ever get copies of its
    # inputs, and its fingerprinted outputs are the caller's to check: a 6.4 GB task holds no second copy); a
    # host-kept one goes to the GPU once (a spot check would copy a 256 MB output each time, inside the exclusive
    # turn), and the candidate could overwrite those copies: times["ref_intact"] says whether they still equal the
    # host's
    sets = [([x.to(device) if isinstance(x, torch.Tensor) else x for x in tr["inputs"]],
             tr["out"] if "fp" in tr else copy_out(tr["out"], device)) for tr in trials[:2]]
    runners, why_not = _graph_runners(models, sets, tol, device) if graphs else (None, None)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = {name: [] for name in models}
    # host: the wall time of the checked model's reps (a cross-check of the events)
    times.update(bad_output=[], host=[], method="graph" if runners else "eager")
    if why_not:
        times["graph_fallback"] = why_not

    def once(name, rep, check=False, wait=True):
        pristine, ref_out = sets[rep % len(sets)]
        if runners:   # a graph replay: the rep's input values copied into the captured inputs, no Python between
            graph, static, out = runners[name]   # the start and end events, no host latency inside the window
            if check:   # (what the replay leaves is compared below: nothing left from an earlier rep may pass)
                _poison_outputs(out, ref_out)
            _load_static(static, pristine)
        else:
            args = [x.clone() if isinstance(x, torch.Tensor) else x for x in pristine]   # fresh copy, untimed
            torch.cuda.synchronize()
        flush.zero_()   # ~80 us of GPU work: an eager model's Python launch overhead hides behind it, as in
        host = time.perf_counter()   # triton.testing.do_bench; we time GPU work, not how fast Python launches
        start.record()
        if runners:
            graph.replay()   # one launch; a graph finishes on its stream, side branches included
        else:
            with torch.no_grad():
                out = models[name](*args)
            torch.cuda.synchronize()   # device-wide: work left on side streams is inside the measurement
        end.record()
        if not wait:   # (a warm-up rep whose time nobody reads: no host sync under the shared turn)
            return None
        end.synchronize()
        if check:   # (at once: a copy kept for later would be memory that the candidate's next reps can rewrite)
            times["bad_output"] += [compare(out, ref_out, device, *tol)[0] is not None]
        return start.elapsed_time(end), (time.perf_counter() - host) * 1e3

    names = list(models)
    for rep in range(2):   # warm-up, one rep per input set (allocator, torch.compile): the models ran their trials
        # already (Triton JIT, autotuning, cuBLAS heuristics). Only the fixed rule reads its times (for the rep count)
        warm = {name: once(name, rep, wait=not adaptive) for name in names}
    if exclusive is not None:
        torch.cuda.synchronize()   # (our warm-up reps finish first: a timer may get the GPU as we give our turn up)
        exclusive()
    if adaptive:   # as many reps as the medians need: the reward uses clip(ln s), a few percent is enough
        deadline, reps = time.monotonic() + budget_s, 300
    else:          # the fixed rule: the budget spent, 30..300 reps
        estimate = sum(host_ms for _, host_ms in warm.values()) + 0.5 * len(names)
        reps = int(min(300, max(30, budget_s * 1e3 / estimate)))
    # Unpredictable reps get the checked model's output compared, SPOT_CHECKS of them among the reps that surely
    # run, every input set among them (a replayed or cached output is systematic): each check is GPU work inside
    # the exclusive turn that every other worker on this GPU waits for
    spots = _spot_reps(min(reps, min_reps) if adaptive else reps, len(sets), SPOT_CHECKS, random.Random(os.urandom(8)))
    for rep in range(reps):   # interleaved; rotate who goes first
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            event_ms, host_ms = once(name, rep, check=name == checked and rep in spots)
            times[name].append(event_ms)
            if name == checked:
                times["host"].append(host_ms)
        if adaptive and rep + 1 >= min_reps and (rep + 1) % 5 == 0:
            if all(median_ci_width(times[name]) <= ci for name in names) or time.monotonic() > deadline:
                break
    if after is not None:
        after()
    # compared on the GPU (the host copy goes there): a pageable copy of a large output to the host would take a
    # large part of a second
    times["ref_intact"] = all(same(gpu_copy, host) for tr, (_, out) in zip(trials, sets) if "fp" not in tr
                              for host, gpu_copy in zip(tensors(tr["out"]), tensors(out)))
    return times
