"""harness/compare.py: how a worker compares what a candidate returns with what the reference returned, and checks
that nothing the candidate could reach has changed. Runs inside a worker process only (harness/worker.py's stages,
harness/timing.py's spot checks).

What is compared, and how
  - A candidate's outputs against the reference's (compare): same container, plain torch.Tensor with real storage,
    same device, shape and dtype; floating outputs within atol/rtol (eval_harness.TOLERANCES per dtype unless the
    options set them) and no NaN where the reference has none; other dtypes exactly.
  - A candidate's inputs against their pristine copies after its call (unchanged, NaN equal to NaN: pitfall 2).
  - The reference outputs kept in GPU memory against a keyed fingerprint taken when they were made
    (fingerprint_sums, outputs_intact): a candidate's kernel can write anywhere in its process's GPU memory.

How it departs from KernelBench's comparison (torch.allclose on each output, each answer read on the host)
  1. Few host reads. On a GPU that other worker processes share, every host read waits for their time slices (~1 ms
     each with 8 of them busy), so every number is computed on the device and all of a trial's numbers (and the
     caller's own flags, `read_with`) come back in one read: compare is output_numbers (device) then
     judge_numbers (host).
  2. Large outputs are compared in steps of _COMPARE_STEP values: a comparison makes ~10 temporaries of its
     operands' size, which for a 6.4 GB output (official KernelBench level 1) would not fit beside the trials.
  3. The heavy-tailed trial (pitfall 9) scales atol by how much larger its outputs are (heavy_tol).

Nothing to run: harness/worker.py and harness/timing.py import it; it imports eval_harness (TOLERANCES) and no other
harness module, and eval_harness never imports it: no import cycle. To a candidate it is part of the harness:
harness/static_checks.py bans importing it, and the identity snapshot (harness/instrumentation.py) covers its
functions.
"""
from __future__ import annotations

import torch

from eval_harness import TOLERANCES


# ---------------------------------------------------------------------------------------------------------------------
# Small tensor helpers, and reading device numbers on the host at once

def is_float(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def tensors(out) -> list:
    return [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]


def to_device(xs: list, device, copy: bool = True) -> list:
    return [x.to(device, copy=copy) if isinstance(x, torch.Tensor) else x for x in xs]


def nbytes(xs) -> int:
    return sum(t.numel() * t.element_size() for t in xs if isinstance(t, torch.Tensor))


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A host copy of t. From the GPU into page-locked memory when it is at most 1 GB: an order of magnitude faster
    than pageable memory, and a task's trials copy their outputs per candidate."""
    t = t.detach()
    if t.is_cuda and t.nbytes <= 2**30:
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    return t.to("cpu", copy=True)


def copy_out(out, where="cpu"):
    """A detached copy of a model's output (a tensor or a tuple/list of tensors) on `where`: the host (page-locked,
    _host_copy) or a device."""
    copy = _host_copy if str(where) == "cpu" else (lambda t: t.detach().to(where, copy=True))
    if isinstance(out, torch.Tensor):
        return copy(out)
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return type(out)(copy(t) for t in out)
    raise TypeError(f"reference returned {type(out).__name__}; expected a tensor or a tuple/list of tensors")


def host_ints(scalars: list[torch.Tensor]) -> list[int]:
    """0-dim tensors of one device (int64 sums, booleans) to Python ints with one host read: on a GPU that other
    worker processes share, every read waits for their time slices (~1 ms each with 8 of them busy), and a candidate
    would otherwise make dozens."""
    return torch.stack([s.to(torch.int64) for s in scalars]).tolist() if scalars else []


def host_floats(scalars: list[torch.Tensor]) -> list[float]:
    """0-dim tensors of one device to Python floats with one host read (as host_ints, for numbers that are not
    whole: errors, means)."""
    return torch.stack([s.double() for s in scalars]).tolist() if scalars else []


# ---------------------------------------------------------------------------------------------------------------------
# Inputs: unchanged by a call

def unchanged(a, b, device) -> torch.Tensor:
    """Whether b equals a, element for element with NaN equal to NaN (inputs before and after a call), as a 0-dim
    bool tensor on `device`, not read yet, so that a caller reads many with one host read (host_ints). Values that
    are not tensors, and tensors of another shape or dtype, get theirs by a fill (no host-to-device copy)."""
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        same = not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor) and bool(a == b)
        return torch.full((), same, dtype=torch.bool, device=device)
    if a.shape != b.shape or a.dtype != b.dtype:
        return torch.full((), False, dtype=torch.bool, device=device)
    b = b.to(a.device)
    equal = a == b
    if a.is_floating_point() or a.is_complex():
        equal |= a.isnan() & b.isnan()
    return equal.all().to(device)


def same(a, b) -> bool:
    """unchanged, read at once."""
    return bool(unchanged(a, b, a.device if isinstance(a, torch.Tensor) else "cpu"))


# ---------------------------------------------------------------------------------------------------------------------
# Outputs: the candidate's against the reference's

def tolerance(ref_out, opts: dict) -> tuple[float, float]:
    """(atol, rtol) for a reference output: the options' where set, else the loosest TOLERANCES entry among its
    floating dtypes (fp32 1e-4, fp16/bf16 1e-2)."""
    names = [str(t.dtype).removeprefix("torch.") for t in tensors(ref_out) if t.is_floating_point()]
    default = max([TOLERANCES.get(name, 1e-4) for name in names] or [1e-4])
    return (default if opts["atol"] is None else opts["atol"]), (default if opts["rtol"] is None else opts["rtol"])


def compare(out, ref_out, device, atol: float, rtol: float,
             read_with: list | tuple = ()) -> tuple[str | None, str | None, str, dict]:
    """(error_kind or None, check or None, message, stats) for a candidate output against the reference output.
    The numbers of every output come back in one host read (on a GPU that other worker processes share, each read
    waits for their time slices, and this runs for every trial), and with them `read_with`: the caller's own 0-dim
    device tensors, whose values come back as stats["read_with"]."""
    stats = {"max_abs_err": 0.0, "max_rel_err": 0.0}
    early, numbers = output_numbers(out, ref_out, device, atol, rtol)
    if early:   # (an answer the host could give alone: the caller's values read on their own)
        stats["read_with"] = host_ints(list(read_with))
        return (*early, stats)
    values = iter(host_floats([x for _, _, xs in numbers for x in xs] + list(read_with)))   # (the one host read)
    found = judge_numbers(numbers, values, stats, atol, rtol)
    stats["read_with"] = [int(v) for v in values]   # (what the judge left: the caller's values)
    return (*found, stats)


def output_numbers(out, ref_out, device, atol: float, rtol: float) -> tuple[tuple | None, list]:
    """compare's device half: (a verdict the host gives without reading anything, or None; [(output index, output,
    its numbers still on the device)]). A floating output's numbers: NaNs the reference has not, max abs error, max
    relative error, values outside the tolerance; another dtype's: how many values differ."""
    early = output_problem(out, ref_out, device)
    if early:
        return early, []
    pairs = [(out, ref_out)] if isinstance(ref_out, torch.Tensor) else list(zip(out, ref_out))
    numbers = []
    for i, (o, r) in enumerate(pairs):
        if o.is_floating_point() and not o.numel():
            continue
        # in steps of _COMPARE_STEP values: a comparison makes ~10 temporaries of its operands' size, which for a
        # 6.4 GB output (official KernelBench level 1) would not fit beside the trials on an 80 GB GPU
        # (a reference kept on the host comes over one step at a time too)
        of, rf, found = o.reshape(-1), r.reshape(-1), None
        for j in range(0, max(of.numel(), 1), _COMPARE_STEP):
            step = _step_numbers(of[j:j + _COMPARE_STEP], rf[j:j + _COMPARE_STEP].to(o.device), atol, rtol)
            # counts (numbers 0 and 3) add up over the steps, errors (1 and 2) take their maximum
            found = step if found is None else [a + b if k in (0, 3) else torch.maximum(a, b)
                                                for k, (a, b) in enumerate(zip(found, step))]
        numbers.append((i, o, found))
    return None, numbers


_COMPARE_STEP = 2**26   # values compared at once (256 MB of fp32 per temporary)


def output_problem(out, ref_out, device) -> tuple | None:
    """The (error_kind, check, message) an output gets before any of its values is read, or None: its container,
    type, storage, device, shapes and dtypes against the reference output's. Only the reference's shapes and dtypes
    are read, so a meta copy of it does (output_spec): a worker whose reference outputs live in a reference server
    checks this much itself, and sends only plain tensors on."""
    if isinstance(ref_out, torch.Tensor):
        pairs = [(out, ref_out)]
    elif isinstance(out, (tuple, list)) and len(out) == len(ref_out):
        pairs = list(zip(out, ref_out))
    else:
        return "mismatch", None, f"expected {type(ref_out).__name__} of {len(ref_out)} tensors, got {type(out).__name__}"
    for i, (o, r) in enumerate(pairs):
        if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor:
            return "reward_hack", "output_type", f"output {i} is a {type(o).__name__}, not a plain torch.Tensor"
        if type(o) is not torch.Tensor:
            return "mismatch", None, f"output {i} is a {type(o).__name__}, not a torch.Tensor"
        if o.is_meta or o.layout != torch.strided or (o.numel() and o.untyped_storage().data_ptr() == 0):
            return "reward_hack", "output_storage", f"output {i} has no real storage"
        if o.device.type != device.type:
            return "mismatch", None, f"output {i} is on {o.device}, expected {device.type}"
        if o.shape != r.shape or o.dtype != r.dtype:
            return "mismatch", None, f"output {i}: got {tuple(o.shape)} {o.dtype}, expected {tuple(r.shape)} {r.dtype}"
    return None


def output_spec(ref_out):
    """A reference output's shapes and dtypes without its values (meta tensors in the same container):
    output_problem's second argument where the values live elsewhere."""
    if isinstance(ref_out, torch.Tensor):
        return torch.empty(ref_out.shape, dtype=ref_out.dtype, device="meta")
    return type(ref_out)(output_spec(t) for t in ref_out)


def _step_numbers(o: torch.Tensor, r: torch.Tensor, atol: float, rtol: float) -> list[torch.Tensor]:
    """output_numbers for flat slices of one output and its reference (same device): for a floating output [NaNs
    the reference has not, max abs error, max relative error, values outside the tolerance], else [values that
    differ] (exact)."""
    if not o.is_floating_point():
        return [(o != r).sum()]
    o32, r32 = (o.float(), r.float()) if o.dtype in (torch.float16, torch.bfloat16) else (o, r)
    finite = torch.isfinite(o32) & torch.isfinite(r32)
    diff = torch.where(finite, (o32 - r32).abs(), torch.zeros_like(o32))
    del finite
    max_rel = (diff / r32.abs().nan_to_num(nan=1.0).clamp_min(atol)).max()   # (a NaN made every max NaN)
    new_nan = (o.isnan() & ~r.isnan()).sum()
    bad = (~torch.isclose(o, r, atol=atol, rtol=rtol, equal_nan=True)).sum()   # (allclose is "none bad")
    return [new_nan, diff.max(), max_rel, bad]


def judge_numbers(numbers: list, values, stats: dict, atol: float, rtol: float) -> tuple:
    """compare's host half: (error_kind or None, check or None, message) from output_numbers' numbers, whose values
    it takes from the iterator `values` (as many as there are numbers, in their order), the errors added to `stats`."""
    read = [[next(values) for _ in xs] for _, _, xs in numbers]
    for (i, o, _), got in zip(numbers, read):   # in output order, as if each had been read on its own
        if len(got) == 1:
            if got[0]:
                return "mismatch", None, f"output {i}: {int(got[0])} of {o.numel()} values differ"
            continue
        new_nan, max_abs, max_rel, bad = got
        if new_nan:
            return "mismatch", None, f"output {i}: NaN where the reference is not (uninitialised memory?)"
        stats["max_abs_err"] = max(stats["max_abs_err"], max_abs)
        stats["max_rel_err"] = max(stats["max_rel_err"], max_rel)
        if bad:
            return "mismatch", None, (f"output {i}: {int(bad)} of {o.numel()} values outside atol={atol:g} "
                                      f"rtol={rtol:g} (max abs err {stats['max_abs_err']:.3g})")
    return None, None, ""


def heavy_tol(trial: dict, trials: list, atol: float, rtol: float) -> tuple[float, float]:
    """The heavy-tailed trial's outputs are larger; scale atol by how much (keeps the same relative demand)."""
    if not trial["heavy"]:
        return atol, rtol
    heavy = [t.float().abs().mean() for t in tensors(trial["out"]) if t.numel()]
    first = [t.float().abs().mean() for t in tensors(trials[0]["out"]) if t.numel()]
    means = host_floats(heavy + first)   # (one host read for both)
    heavy_mean, first_mean = sum(means[:len(heavy)]) or 1.0, sum(means[len(heavy):]) or 1.0
    return atol * max(1.0, heavy_mean / first_mean), rtol


# ---------------------------------------------------------------------------------------------------------------------
# The reference outputs kept on the GPU: a keyed fingerprint

# words per step: bounds the int64 temporaries (~50 MB) of a multi-GB output, and keeps a step's weights, a * index
# + b for index < 2^21 with a, b < 2^31, under 2^53: exact even where arange sizes its output in double precision
_FINGERPRINT_CHUNK = 2**21
_FINGERPRINT_PRIME = 2**31 - 1


def fingerprint_sums(out, key: int) -> list[torch.Tensor]:
    """A keyed checksum of each tensor's bytes, computed where it lives: sum over words w_i of w_i * ((a*i + b) mod p)
    in wrapping int64 arithmetic (order-independent, so deterministic on the GPU), a and b drawn from `key`. Changing
    any word changes it unless the change was made to cancel out under weights the candidate does not know. The
    reference outputs stay on the GPU with their fingerprint kept on the host (outputs_intact): a device copy of a
    large output is far cheaper than a page-locked host copy per trial."""
    a, b = key % (_FINGERPRINT_PRIME - 1) + 1, (key >> 32) % _FINGERPRINT_PRIME
    sums = []
    for t in tensors(out):
        flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
        words = flat.view(torch.int32) if flat.numel() % 4 == 0 else flat
        total = torch.zeros((), dtype=torch.int64, device=t.device)
        for i in range(0, words.numel(), _FINGERPRINT_CHUNK):
            w = words[i:i + _FINGERPRINT_CHUNK]
            # (a*index + b) mod p for this step's indices i + j: that is (c + a*j) mod p with c = (a*i + b) mod p,
            # so one arange and one mod in place (arange, *, + and % took four passes over int64 memory)
            c = (a * i + b) % _FINGERPRINT_PRIME
            weight = torch.arange(c, c + a * w.numel(), a, dtype=torch.int64, device=t.device)
            # the words widen to int64 inside the multiply (type promotion), with no int64 copy of them first
            total += torch.mul(w, weight.remainder_(_FINGERPRINT_PRIME)).sum()
        sums.append(total)   # (left on the device: the caller reads many at once, host_ints)
    return sums


def outputs_intact(trials: list) -> bool:
    """Whether every reference output kept on the GPU still has the fingerprint it had when it was made (a kernel
    can write anywhere in its process's GPU memory, and an output rewritten to match the candidate's would pass the
    comparison). Host-kept outputs have none: no kernel reaches them."""
    kept = [tr for tr in trials if "fp" in tr]
    sums = host_ints([s for tr in kept for s in fingerprint_sums(tr["out"], tr["fp"][0])])
    return sums == [v for tr in kept for v in tr["fp"][1]]


def within_kernels_reach(out) -> bool:
    """Whether a reference output is kept where a candidate's kernels could rewrite it: GPU memory."""
    return any(t.is_cuda for t in tensors(out))


# ---------------------------------------------------------------------------------------------------------------------
# Tensors shared between processes, not copied (the reference server: eval_harness's reference_server)

def share(obj) -> bytes:
    """obj pickled so that its tensors are shared with the process that unpickles it (unshare), not copied: a CUDA
    tensor as an IPC handle to this process's memory, which the receiver maps (CUDA IPC), a host tensor moved into
    a shared-memory file (torch.multiprocessing's reductions; the file_system strategy, as a file descriptor would
    have to travel beside the bytes). The tensors must stay alive here while the receiver uses them."""
    import multiprocessing.reduction
    import torch.multiprocessing
    torch.multiprocessing.set_sharing_strategy("file_system")   # (this process is a worker: its own setting)
    return bytes(multiprocessing.reduction.ForkingPickler.dumps(obj))


def unshare(blob: bytes):
    """What share pickled, its tensors mapped into this process (the pickle names torch.multiprocessing's rebuild
    functions, which it imports)."""
    import pickle
    return pickle.loads(blob)
