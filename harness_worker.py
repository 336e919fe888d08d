"""harness_worker.py: the inside of eval_harness.py's worker processes, where a task's reference and a candidate run.

Nothing here runs in the caller's process. The zygote (harness_processes.Zygote, booted by harness_processes.BOOT)
imports this module once and calls _zygote_main; every worker is forked from that zygote, runs _worker_main and
exactly one job, and is killed with its process group: "evaluate" (one candidate: the reference's trials, the
instrumentation and the candidate's import, correctness trials, kernel coverage, timing; _job_evaluate), "reference"
(a task's trials for its candidates to share), "compile" (GPU mode's CPU stage) and "lint" (the task quality rules).
The parent side is eval_harness.py (verdicts, the public API, and the pitfalls table that the checks here implement,
in its docstring) and harness_processes.py (pools, the GPU gate, memory admission, time limits).

Import direction: this module imports eval_harness (the options and tolerances it applies, _truncate,
_format_exception) and harness_processes (memory_need, lock_file); neither imports this module, harness_processes
only names it in its zygote's boot string. So there is no import cycle, the caller's process never loads the worker's
code, and a baseline harness loaded from another directory (bench.py's _harness_module) runs that directory's
workers.

A candidate runs in this module's process, so all three modules are the harness to it: the static check bans
importing any of them and assigning into it (BANNED_IMPORTS, PROTECTED_ROOTS in static_checks.py), and
_harness_snapshot covers the functions of all three (_HARNESS_MODULES), checked after every candidate phase
(pitfall 6).
"""
from __future__ import annotations
import ast
import collections
import contextlib
import importlib.util
import inspect
import multiprocessing
import multiprocessing.reduction
import os
import random
import re
import signal
import sys
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection

import torch

import eval_harness
from eval_harness import DEFAULTS, TOLERANCES, _format_exception, _truncate
import harness_processes
from harness_processes import lock_file, memory_need

# The modules whose code runs in a worker once a candidate is imported: _harness_snapshot keeps their functions
_HARNESS_MODULES = (eval_harness, harness_processes, sys.modules[__name__])


# ---------------------------------------------------------------------------------------------------------------------
# Inside the worker: start-up (zygote, worker, warm-up) and the GPU turn

def _zygote_imports() -> None:
    """What a zygote does once for all its workers: the imports and first uses that cost seconds. Nothing here may
    touch the CUDA driver or start a thread (tests/harness_throughput.py checks both)."""
    import torch.utils._python_dispatch  # noqa: F401  (the op recorder's base class)
    with torch.device("meta"):   # the first meta tensor imports torch's meta kernels (seconds), which a worker
        (torch.randn(2) * 2).sum()   # would otherwise pay in _trial_bytes_on_meta while it holds its GPU slot
    # (Not torch.utils.cpp_extension: importing it asks the CUDA driver for its devices, and torch then refuses CUDA
    # in every forked child, "Cannot re-initialize CUDA in forked subprocess".)
    if os.environ["KZ_BACKEND"] == "cuda" and os.environ["KZ_DEVICE"] == "cuda":
        import torch.profiler  # noqa: F401  (its Python side; CUPTI itself starts in each worker that profiles)
    if os.environ["KZ_BACKEND"] == "triton":
        import triton  # noqa: F401  (and its compiler's Python side: the JIT's first use in a worker is shorter)
        import triton.compiler.compiler  # noqa: F401
        import triton.language  # noqa: F401
        import triton.runtime.autotuner  # noqa: F401
        if os.environ.get("KZ_TRITON_ARCH"):
            _warm_up_triton_compiler(int(os.environ["KZ_TRITON_ARCH"]))


def _warm_up_triton_compiler(arch: int) -> bool:
    """Compile one tiny kernel for GPU architecture `arch` (e.g. 90) without touching the driver: the compiler's
    one-time start-up (MLIR and LLVM set-up, ptxas found and run) then happens once in the zygote instead of in every
    worker (about a second of CPU each). It starts no thread, so the zygote stays safe to fork. A failure here only
    costs the time it would have saved (returns False)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    @triton.jit
    def _kz_zygote(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    try:
        src = ASTSource(fn=_kz_zygote, signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                        constexprs={"BLOCK": 16})
        return "cubin" in triton.compile(src, target=GPUTarget("cuda", arch, 32)).asm
    except Exception:
        return False


def _zygote_main(fd: int) -> None:
    """Import what every worker needs, then fork a worker per request. It never touches CUDA (a forked child could
    not use it), starts no thread (fork copies only the calling one) and never runs candidate code. Requests:
    ("fork", workdir) followed by the worker's job-pipe and output ends -> its pid; ("reap", pid, timeout) -> its
    exit code, or None while it still runs. EOF on the request socket (the pool closed it, or the caller died) ends
    the zygote; its idle workers follow it (_die_with_parent)."""
    conn = Connection(fd)
    _zygote_imports()
    exited, unreaped = {}, set()   # pid -> exit code; pids asked for that were still running

    def reap(pid: int) -> bool:
        with contextlib.suppress(ChildProcessError):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                return False
            exited[pid] = os.waitstatus_to_exitcode(status)
        return True

    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        unreaped = {pid for pid in unreaped if not reap(pid)}
        if request[0] == "fork":
            job_fd, out_fd = (multiprocessing.reduction.recv_handle(conn) for _ in range(2))
            pid = os.fork()
            if pid == 0:   # the worker: its own session first, so that the pool's kill reaches its whole group
                try:
                    os.setsid()
                    conn.close()   # (the candidate cannot reach the zygote)
                    os.chdir(request[1])
                    os.dup2(out_fd, 1)
                    os.dup2(out_fd, 2)
                    os.close(out_fd)
                    _worker_main(job_fd)
                except BaseException:   # (the parent reads it from the worker's output: "worker died ...")
                    traceback.print_exc()
                finally:
                    os._exit(1)
            os.close(job_fd)
            os.close(out_fd)
            conn.send(pid)
        elif request[0] == "reap":
            pid, deadline = request[1], time.monotonic() + request[2]
            while not reap(pid) and time.monotonic() < deadline:
                time.sleep(0.02)
            if pid not in exited:
                unreaped.add(pid)
            conn.send(exited.pop(pid, None))


def _worker_main(fd: int) -> None:
    conn = Connection(fd)
    device, role = os.environ["KZ_DEVICE"], os.environ["KZ_ROLE"]
    import resource
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**30, 2**30))   # a candidate printing forever cannot fill the disk
    limit_gb = float(os.environ.get("KZ_MEMORY_LIMIT_GB") or 0)
    if device == "cpu" and limit_gb > 0:   # (CUDA reserves huge virtual ranges, so only in CPU mode)
        resource.setrlimit(resource.RLIMIT_AS, (int(limit_gb * 2**30),) * 2)
    if os.environ["KZ_BACKEND"] == "triton":
        import triton  # noqa: F401  (imported while idle, so it is not counted as the candidate's compile time)
    if device == "cuda" and role == "run":   # one-time costs paid while idle, not while holding the GPU turn
        _warm_up_gpu_worker(os.environ["KZ_BACKEND"])
    # the snapshot's load_inline (and setuptools below it) imported while idle too; not in the zygote, where
    # importing it asks the CUDA driver for its devices
    import torch.utils.cpp_extension  # noqa: F401
    threading.Thread(target=_die_with_parent, args=(os.getppid(),), daemon=True).start()
    conn.send(("ready", os.getpid()))
    job = conn.recv()
    # KZ_WORKER_PROFILE=DIR: each job's own time under cProfile, one file per worker (bench.py harness
    # --round-profile merges them): where a verdict's seconds go, by function, waits for the GPU turn included
    profile_dir = os.environ.get("KZ_WORKER_PROFILE")
    if profile_dir:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    try:
        result = {"compile": _job_compile, "evaluate": _job_evaluate, "reference": _job_reference,
                  "lint": _job_lint}[job["kind"]](job, conn)
    except BaseException as e:   # a candidate escaping the per-phase handlers (e.g. SystemExit from a destructor)
        result = {"error_kind": _classify(e), "error": _format_exception(e)}
    if profile_dir:
        profiler.disable()
        with contextlib.suppress(OSError):
            profiler.dump_stats(os.path.join(profile_dir, f"{job['kind']}-{os.getpid()}.prof"))
    conn.send(("result", result))
    conn.close()
    os._exit(0)   # skip interpreter teardown (candidate finalizers); the parent kills the group anyway


def _warm_up_gpu_worker(backend: str) -> None:
    """First uses that cost seconds in a fresh process, paid while idle: the CUDA context, the CUDA graph machinery,
    for CUDA candidates the profiler behind _kernel_coverage (CUPTI start-up) and, for Triton, the JIT's own
    start-up and its first device query. Workers boot while others hold the GPU, so none of this launches a kernel:
    an empty profile, a Triton kernel compiled (warmup) but never run, and a CUDA graph captured and instantiated
    but never replayed. With the option warm_harness_kernels, the harness's own kernels then run once under the
    GPU's shared turn (_warm_up_harness_kernels)."""
    x = torch.zeros(1, device="cuda")   # context creation (and one tiny fill)
    # the graph machinery's first use (capture, instantiation), off the timed candidate's path
    with contextlib.suppress(Exception):
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            graph.capture_begin()
            try:
                x.add_(1)   # (recorded, not run: no replay)
            finally:
                graph.capture_end()
    if backend == "cuda":   # (Triton candidates are seen through their launches: no profiler, _kernel_coverage)
        from torch.profiler import ProfilerActivity, profile
        with warnings.catch_warnings(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            warnings.simplefilter("ignore")
    if backend == "triton":
        import triton
        import triton.language as tl

        @triton.jit
        def _kz_warm_up(x_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

        with contextlib.suppress(Exception):   # a warm-up only: a failure here costs time later, nothing else
            _kz_warm_up.warmup(torch.float32, 16, BLOCK=16, grid=(1,))
            # a kernel's first launch asks the driver for the device's shared memory (cached per process): a
            # device query, no kernel runs
            from triton.compiler.compiler import max_shared_mem
            max_shared_mem(torch.cuda.current_device())
    if os.environ.get("KZ_GPU_LOCK"):   # (set with the option warm_harness_kernels)
        with contextlib.suppress(Exception):   # (a warm-up too: if it fails, the kernels load mid-trial as without it)
            _warm_up_harness_kernels("cuda", os.environ["KZ_GPU_LOCK"])


def _warm_up_harness_kernels(device: str, lock: str | None = None) -> None:
    """Launch once, on tiny tensors, the kernels the harness itself runs on a candidate's path (trial inputs, the
    allocator poison, the input check, comparisons, fingerprints) for the common output dtypes. With CUDA's lazy
    loading (the default since CUDA 12.2) a kernel's code is loaded at its first launch in a process, and that load
    may synchronize the context: it waits for the process's queued work, which takes the GPU's time slices while
    other workers share it. Every candidate runs in a fresh process, so without this it pays those waits mid-trial
    (the first comparison after the candidate's forward, the first fingerprint...) instead of here, while idle.
    The random generators' states are restored: trials seed their own, but nothing here may show in a verdict.
    `lock`: the GPU's lock file; these are kernels, so they run under its shared turn, never while a timer times."""
    fd = lock_file(lock, "shared") if lock else None
    cuda = torch.device(device).type == "cuda"
    try:
        with torch.random.fork_rng(devices=[torch.device(device)] if cuda else []):
            torch.manual_seed(0)
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                x = torch.randn(64, device=device).to(dtype)            # trial inputs (get_inputs under the device)
                heavy = x * torch.exp(torch.randn_like(x))               # the heavy-tailed trial
                bool(torch.isfinite(heavy).all())
                y = x.clone()
                y[0] = float("nan")
                _same(y, y.clone())                                       # NaN-aware equality (the input check)
                _compare(x.clone(), x, torch.device(device), 1e-2, 1e-2)  # an output that passes
                _compare(y, x, torch.device(device), 1e-2, 1e-2)          # and one that fails (a new NaN)
                _heavy_tol({"heavy": True, "out": x}, [{"out": heavy}], 1e-2, 1e-2)
                _host_ints(_fingerprint_sums([x, x[:3].view(torch.uint8)[:5]], key=12345))   # both word sizes
            ints = torch.arange(64, device=device)
            _compare(ints, ints.clone(), torch.device(device), 0.0, 0.0)   # integer outputs: exact equality
            _compare(ints + 1, ints, torch.device(device), 0.0, 0.0)
            torch.empty(64, dtype=torch.uint8, device=device).view(torch.float32).fill_(float("nan"))   # the poison
            torch.empty(64, dtype=torch.int32, device=device).zero_()     # timing's L2 flush
            if cuda:
                torch.cuda.synchronize()   # (all of it ran before the turn is given back)
    finally:
        if fd is not None:
            os.close(fd)


def _die_with_parent(parent: int) -> None:
    """If the caller dies (Ctrl-C, kill -9), take the process group down instead of leaving a hung candidate."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(0, signal.SIGKILL)


def _gpu_turn(conn: Connection, mode: str) -> None:
    """Ask the parent for this worker's GPU, "shared" (correctness checks) or "exclusive" (timing), and wait until it
    is granted (see harness_processes.Gate). Asked in CPU mode too, where it is granted at once."""
    conn.send(("gpu", mode))
    conn.recv()


def _pass_turn(conn: Connection, device: str, mode: str = "shared") -> None:
    """Give this worker's shared GPU turn back (its kernels finished first) and ask for `mode` again ("none": not at
    all): a timer waiting for the GPU gets it in between (writer-preferring harness_processes.Gate)."""
    if device == "cuda":
        torch.cuda.synchronize()   # our kernels finish before another worker may time
    _gpu_turn(conn, mode)


def _yield_turn(conn: Connection, device: str) -> None:
    """Between two trials (or reference outputs): give the shared GPU turn back if a timer waits for the GPU, so that
    it waits for one trial of each holder, not for their whole checks. The parent knows whether one waits (Gate.
    timer_waiting); most of the time none does, and then the turn is kept, without the host sync a pass needs."""
    conn.send(("timer?",))
    if conn.recv():
        _pass_turn(conn, device)


_CUDA_FATAL = re.compile(r"CUDA error|illegal memory access|device-side assert|unspecified launch failure|"
                         r"CUBLAS_STATUS|misaligned address|cudaErrorLaunch")


def _classify(e: BaseException) -> str:
    """A sticky CUDA error poisons the context for good: that is a crash, not an ordinary runtime error."""
    return "crash" if _CUDA_FATAL.search(str(e)) else "runtime"


def _fail(kind: str, error: str, details: dict, check: str | None = None, **fields) -> dict:
    """A worker verdict; `check` names the check that fired (always set for reward_hack)."""
    if check:
        details["check"] = check
        details["checks_fired"] = details.get("checks_fired", []) + [check]
    return {"error_kind": kind, "error": error, "details": details, **fields}


def _since(clock: float) -> float:
    """Seconds since `clock` (time.monotonic()), for the per-stage times in details (ref_inputs_s, timing_s, ...)."""
    return round(time.monotonic() - clock, 3)


# ---------------------------------------------------------------------------------------------------------------------
# Inside the worker: small tensor helpers

def _is_float(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _tensors(out) -> list:
    return [out] if isinstance(out, torch.Tensor) else [t for t in out if isinstance(t, torch.Tensor)]


def _to_device(xs: list, device, copy: bool = True) -> list:
    return [x.to(device, copy=copy) if isinstance(x, torch.Tensor) else x for x in xs]


def _nbytes(xs) -> int:
    return sum(t.numel() * t.element_size() for t in xs if isinstance(t, torch.Tensor))


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    """A host copy of t. From the GPU into page-locked memory when it is at most 1 GB: an order of magnitude faster
    than pageable memory, and a task's trials copy their outputs per candidate."""
    t = t.detach()
    if t.is_cuda and t.nbytes <= 2**30:
        return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t)
    return t.to("cpu", copy=True)


def _copy_out(out, where="cpu"):
    """A detached copy of a model's output (a tensor or a tuple/list of tensors) on `where`: the host (page-locked,
    _host_copy) or a device."""
    copy = _host_copy if str(where) == "cpu" else (lambda t: t.detach().to(where, copy=True))
    if isinstance(out, torch.Tensor):
        return copy(out)
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return type(out)(copy(t) for t in out)
    raise TypeError(f"reference returned {type(out).__name__}; expected a tensor or a tuple/list of tensors")


def _unchanged(a, b, device) -> torch.Tensor:
    """Whether b equals a, element for element with NaN equal to NaN (inputs before and after a call), as a 0-dim
    bool tensor on `device`, not read yet, so that a caller reads many with one host read (_host_ints). Values that
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


def _same(a, b) -> bool:
    """_unchanged, read at once."""
    return bool(_unchanged(a, b, a.device if isinstance(a, torch.Tensor) else "cpu"))


def _load_module(src: str, name: str):
    """Import source from a real file (Triton reads kernel source with inspect) as its own module."""
    path = os.path.abspath(f"{name}.py")   # cwd is the worker's private temp dir
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _build_model(cls, init_inputs: list, device, opts: dict):
    """The reference's Model or the candidate's ModelNew, built after the same seed: same initial parameters, as in
    KernelBench."""
    torch.manual_seed(opts["seed"])
    model = cls(*init_inputs).to(device)
    return model.to(getattr(torch, opts["dtype"])) if opts["dtype"] else model


# ---------------------------------------------------------------------------------------------------------------------
# Inside the worker: evaluating one candidate, five stages in order

class _Evaluation:
    """What one candidate's evaluation carries from stage to stage (_job_evaluate)."""

    def __init__(self, job: dict, conn: Connection):
        self.job, self.conn = job, conn
        self.device, self.opts = torch.device(job["device"]), job["opts"]
        self.details = {"checks_fired": []}
        self.turn = "exclusive" if job.get("alone") else "shared"   # exclusive: a rerun after an out-of-memory
        self.ref = self.init_inputs = self.ref_model = None   # stage 1: the task and its trials
        self.trials, self.ref_mutates, self.atol, self.rtol = [], False, None, None
        self.cand = self.instr = self.compile_s = None        # stage 2: the imported candidate
        self.cand_model = None                                # stage 3
        self.timing = {}                                      # stage 5: runtime_ms, ref_runtime_ms, speedup

    def failed(self, kind: str, error: str, check: str | None = None) -> dict:
        """A verdict once the candidate has imported."""
        return _fail(kind, error, self.details, check, compiled=True, compile_s=self.compile_s)


def _gpu_memory_mb() -> list[int]:
    """[peak allocated, reserved] MiB of this process's caching allocator so far: what a job needs on its GPU (the
    reserved bytes include blocks cached for reuse; the CUDA context's own ~0.5-1 GB is in neither)."""
    return [round(torch.cuda.max_memory_allocated() / 2**20), round(torch.cuda.memory_reserved() / 2**20)]


def _job_evaluate(job: dict, conn: Connection) -> dict:
    """One candidate's verdict. Each stage returns a failed verdict, or None to go on to the next one."""
    ev = _Evaluation(job, conn)
    for stage in (_load_reference, _build_candidate, _check_correctness, _check_coverage, _time_candidate):
        verdict = stage(ev)
        if ev.device.type == "cuda":   # the process's GPU memory by the end of each stage (host-side counters)
            ev.details.setdefault("gpu_mb", {})[stage.__name__.strip("_")] = _gpu_memory_mb()
        if verdict is not None:
            return verdict
    return {"error_kind": "ok", "error": "", "compiled": True, "compile_s": ev.compile_s, "details": ev.details,
            **ev.timing}


# ---------------------------------------------------------------------------------------------------------------------
# Stage 1: the reference's trials (inputs and outputs), made before the candidate exists

def _trial_bytes_on_meta(ref, opts: dict) -> tuple[int | None, int | None]:
    """Bytes of one trial's (inputs, outputs), from get_inputs() and the reference's forward run on the meta device
    (shapes and dtypes only: no data is made, nothing is computed). Inputs None if get_inputs() cannot run there (it
    calls .cuda() or names a device); outputs None if the forward cannot (an op without a meta kernel, a value read
    on the host): memory_need then takes them as large as the inputs. A reduction's outputs are far smaller (a 256
    MB task's estimate halves), an upsampling's larger (an estimate below the peak costs an out-of-memory rerun)."""
    size = 2 if opts["dtype"] in ("float16", "bfloat16") else None

    def nbytes(xs) -> int:
        return sum(x.numel() * (size if size and x.is_floating_point() else x.element_size()) for x in xs)
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            inputs = list(ref.get_inputs())
            if not all(x.is_meta for x in inputs if isinstance(x, torch.Tensor)):
                return None, None
        except Exception:
            return None, None
        try:
            with torch.no_grad():
                outputs = _tensors(ref.Model(*ref.get_init_inputs())(*inputs))
            per_output = nbytes(outputs) if outputs and all(x.is_meta for x in outputs) else None
        except Exception:
            per_output = None
    return nbytes(x for x in inputs if isinstance(x, torch.Tensor)), per_output


def _ask_memory(conn: Connection, host: int, device: int, details: dict) -> None:
    """Wait until the parent admits this job's memory (harness_processes.Memory); granted at once without a budget."""
    details["mem_need_mb"] = [round(host / 2**20), round(device / 2**20)]
    conn.send(("mem", host, device))
    conn.recv()


# A round's tasks fit (256 MB inputs); beyond it a task's kernels take long enough that an allocation's cost is
# noise, and the poison fills what is reserved before every call
_RESERVE_CAP = 2**30


def _reserve_device_memory(nbytes: int, details: dict) -> None:
    """Put the job's admitted device bytes (at most _RESERVE_CAP) in the caching allocator as one free block: one
    cudaMalloc, where a fresh process otherwise makes one for each new tensor size. The block is free memory of this
    process like any other: the allocator poison NaN-fills it before every candidate call. No kernel runs: no GPU
    turn needed."""
    try:
        block = torch.empty(min(nbytes, _RESERVE_CAP), dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:   # (only a saving: the job allocates as it goes instead)
        return
    details["reserved_mb"] = round(block.numel() / 2**20)
    del block


def _trial_inputs(ref, opts: dict, details: dict, device=None) -> list[tuple[list, bool]]:
    """(inputs, heavy) for every trial, made before the reference runs: `trials` draws of get_inputs() and a last,
    heavy-tailed one (floating inputs times a log-normal factor, pitfall #9). `device`: factory calls without an
    explicit device (torch.randn, rand, randint, ...) make their tensors there; None: on the host, which is CPU work,
    hence made before the worker takes its GPU turn (_reference). manual_seed seeds every device's generator."""
    dtype = getattr(torch, opts["dtype"]) if opts["dtype"] else None
    n, out, t = opts["trials"], [], -1
    while t < n:   # (not a range: _cap_trials may lower n after the first draw, and the heavy draw is the last)
        t += 1
        heavy = t == n
        torch.manual_seed(opts["seed"] + 1 + t)
        try:
            with torch.device(device) if device is not None else contextlib.nullcontext():
                inputs = list(ref.get_inputs())
        except Exception as e:   # e.g. a CPU torch.Generator passed to a factory: make them all on the host
            if device is None or t:
                raise
            details["inputs_on_device_failed"] = _truncate(_format_exception(e), 300)
            return _trial_inputs(ref, opts, details)
        inputs = [x.to(dtype) if dtype and _is_float(x) else x for x in inputs]
        if heavy:
            if not any(_is_float(x) for x in inputs):
                break
            inputs = [x * torch.exp(torch.randn_like(x)) if _is_float(x) else x for x in inputs]
        out.append((inputs, heavy))
        if t == 0:   # official KernelBench inputs reach GBs: keep the host copies bounded (outputs: _make_trials)
            n = _cap_trials(n, _nbytes(inputs), opts, details)
    return out


def _cap_trials(n: int, per_trial: int, opts: dict, details: dict) -> int:
    fit = int(opts["max_trial_gb"] * 2**30 // max(per_trial, 1)) - 1   # - 1: the heavy trial
    if fit < n:
        n = max(1, fit)
        details["trials_capped"] = n
    return n


# words per step: bounds the int64 temporaries (~50 MB) of a multi-GB output, and keeps a step's weights, a * index
# + b for index < 2^21 with a, b < 2^31, under 2^53: exact even where arange sizes its output in double precision
_FINGERPRINT_CHUNK = 2**21
_FINGERPRINT_PRIME = 2**31 - 1


def _fingerprint_sums(out, key: int) -> list[torch.Tensor]:
    """A keyed checksum of each tensor's bytes, computed where it lives: sum over words w_i of w_i * ((a*i + b) mod p)
    in wrapping int64 arithmetic (order-independent, so deterministic on the GPU), a and b drawn from `key`. Changing
    any word changes it unless the change was made to cancel out under weights the candidate does not know. The
    reference outputs stay on the GPU with their fingerprint kept on the host (_outputs_intact): a device copy of a
    large output is far cheaper than a page-locked host copy per trial."""
    a, b = key % (_FINGERPRINT_PRIME - 1) + 1, (key >> 32) % _FINGERPRINT_PRIME
    sums = []
    for t in _tensors(out):
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
        sums.append(total)   # (left on the device: the caller reads many at once, _host_ints)
    return sums


def _host_ints(scalars: list[torch.Tensor]) -> list[int]:
    """0-dim tensors of one device (int64 sums, booleans) to Python ints with one host read: on a GPU that other
    worker processes share, every read waits for their time slices (~1 ms each with 8 of them busy), and a candidate
    would otherwise make dozens."""
    return torch.stack([s.to(torch.int64) for s in scalars]).tolist() if scalars else []


def _host_floats(scalars: list[torch.Tensor]) -> list[float]:
    """0-dim tensors of one device to Python floats with one host read (as _host_ints, for numbers that are not
    whole: errors, means)."""
    return torch.stack([s.double() for s in scalars]).tolist() if scalars else []


def _outputs_intact(trials: list) -> bool:
    """Whether every reference output kept on the GPU still has the fingerprint it had when it was made (a kernel
    can write anywhere in its process's GPU memory, and an output rewritten to match the candidate's would pass the
    comparison). Host-kept outputs have none: no kernel reaches them."""
    kept = [tr for tr in trials if "fp" in tr]
    sums = _host_ints([s for tr in kept for s in _fingerprint_sums(tr["out"], tr["fp"][0])])
    return sums == [v for tr in kept for v in tr["fp"][1]]


def _within_kernels_reach(out) -> bool:
    """Whether a reference output is kept where a candidate's kernels could rewrite it: GPU memory."""
    return any(t.is_cuda for t in _tensors(out))


def _make_trials(ref_model, draws: list, device, opts: dict, details: dict, store="cpu",
                 between=None) -> tuple[list, bool]:
    """Reference outputs for every (inputs, heavy) draw of _trial_inputs, computed before the candidate exists; inputs
    and outputs kept on `store` (the GPU when the inputs were made there). Skips normal draws once inputs and outputs
    together would exceed max_trial_gb, and the heavy one if the reference is not finite on it. Returns (trials,
    whether the reference mutates its inputs). Outputs kept on the GPU get a fingerprint (trial["fp"]): a
    candidate's kernel can write to any device address in its process (an out-of-bounds store finds the caching
    allocator's other blocks), so _outputs_intact checks them before a verdict stands; rewriting stored inputs only
    makes the candidate's own outputs disagree. `between()`, if given, runs before every draw but the first (a
    waiting timer gets the GPU there)."""
    key = int.from_bytes(os.urandom(8), "little")   # the fingerprints' weights: unknown to the candidate
    trials, pending = [], []   # pending: (trial, its fingerprint sums still on the device)
    # read at the end with the fingerprints, in one host read: inputs the reference left as they were, and whether
    # it was finite on the heavy-tailed draw (the last one)
    unchanged, finite = [], []
    allowed = sum(not heavy for _, heavy in draws)   # normal trials; lowered once the first output's size is known
    for i, (inputs, heavy) in enumerate(draws):
        if not heavy and len(trials) >= allowed:
            continue
        if i and between is not None:
            between()
        args = _to_device(inputs, device)
        with torch.no_grad():
            produced = ref_model(*args)
        out = _copy_out(produced, store)
        if heavy:
            finite = [torch.isfinite(o).all() for o in _tensors(produced) if o.is_floating_point()]
        unchanged += [_unchanged(a, x, device) for a, x in zip(args, inputs)]   # (where made: no host-side scan)
        del args, produced
        trials.append({"inputs": [x.to(store) if isinstance(x, torch.Tensor) else x for x in inputs],
                       "out": out, "heavy": heavy})
        if _within_kernels_reach(out):
            pending.append((trials[-1], _fingerprint_sums(out, key)))
        if len(trials) == 1:
            allowed = _cap_trials(allowed, _nbytes(inputs) + _nbytes(_tensors(out)), opts, details)
    flags = unchanged + [f.to(device) for f in finite]   # (the reference's outputs may sit elsewhere)
    values = iter(_host_ints([s for _, trial_sums in pending for s in trial_sums] + flags))
    for trial, trial_sums in pending:   # on the host before the candidate exists: out of its kernels' reach
        trial["fp"] = (key, [next(values) for _ in trial_sums])
    mutates = not all([next(values) for _ in unchanged])   # (lists: all() stops at the first False)
    if not all([next(values) for _ in finite]):
        trials.pop()   # (the heavy draw is the last one)
        details["heavy_trial"] = "skipped: the reference is not finite on heavy-tailed inputs"
    details["heavy_trial"] = details.get("heavy_trial", any(tr["heavy"] for tr in trials))
    return trials, mutates


def _reference(job: dict, conn: Connection, details: dict, turn: str) -> tuple:
    """Load the task, make its trials and the reference outputs: (module, init_inputs, model, trials, mutates).
    Asks the parent for the memory this takes first (memory_need), then for its GPU turn. Other candidates may
    check correctness on this GPU meanwhile, none may time ("exclusive" turn: a rerun after an OOM). With
    inputs_on_device the inputs are made on the GPU inside the turn (milliseconds) and stay there
    (details["trials_on"]); on the host they are made before the turn (CPU work, seconds for a 256 MB task, and a
    timer waits for every holder). A reference that mentions cuda may put them on the GPU itself: turn first."""
    device, opts = torch.device(job["device"]), job["opts"]
    on_device = device.type == "cuda" and opts["inputs_on_device"]
    mentions_cuda = "cuda" in job["ref_src"]
    clock = time.monotonic()
    ref = _load_module(job["ref_src"], "kz_reference")
    del sys.modules["kz_reference"]   # the candidate cannot find it by name
    # (not on meta where the reference names a device: it may put its tensors there itself)
    per_input, per_output = (None, None) if mentions_cuda else _trial_bytes_on_meta(ref, opts)
    host_bytes, device_bytes = memory_need(per_input, per_output, opts, device.type, on_device)
    _ask_memory(conn, host_bytes, device_bytes, details)
    if device.type == "cuda":
        _reserve_device_memory(device_bytes, details)
    if on_device or mentions_cuda:
        _gpu_turn(conn, turn)
    init_inputs = ref.get_init_inputs()
    draws = _trial_inputs(ref, opts, details, device if on_device else None)
    details["ref_inputs_s"] = _since(clock)
    if not (on_device or mentions_cuda):
        _gpu_turn(conn, turn)
    clock = time.monotonic()
    ref_model = _build_model(ref.Model, init_inputs, device, opts)
    # a timer waiting for the GPU gets it between reference outputs too (as between a candidate's trials)
    between = (lambda: _yield_turn(conn, device.type)) if turn == "shared" else None
    trials, ref_mutates = _make_trials(ref_model, draws, device, opts, details, device if on_device else "cpu",
                                       between)
    details.update(ref_outputs_s=_since(clock), trials_on=device.type if on_device else "cpu")
    return ref, init_inputs, ref_model, trials, ref_mutates


def _tolerance(ref_out, opts: dict) -> tuple[float, float]:
    names = [str(t.dtype).removeprefix("torch.") for t in _tensors(ref_out) if t.is_floating_point()]
    default = max([TOLERANCES.get(name, 1e-4) for name in names] or [1e-4])
    return (default if opts["atol"] is None else opts["atol"]), (default if opts["rtol"] is None else opts["rtol"])


def _load_reference(ev: _Evaluation) -> dict | None:
    """Stage 1: the task's trials and reference outputs, before any candidate code exists in this process: made here
    (_reference), or received from the parent (a task's candidates in one map call share one reference job's
    trials, _job_reference)."""
    job, conn, details = ev.job, ev.conn, ev.details
    conn.send(("phase", "reference"))
    try:
        if "pack" in job:
            ev.ref, ev.init_inputs, ev.trials, ev.ref_mutates = _receive_reference(job, conn, details)
            _gpu_turn(conn, ev.turn)
            ev.ref_model = None
            if ev.device.type == "cuda" and ev.opts["timing"]:   # timed here, interleaved with the candidate
                ev.ref_model = _build_model(ev.ref.Model, ev.init_inputs, ev.device, ev.opts)
        else:
            ev.ref, ev.init_inputs, ev.ref_model, ev.trials, ev.ref_mutates = _reference(job, conn, details, ev.turn)
    except Exception as e:
        details["stage"] = "reference"
        return _fail(_classify(e), "the reference failed: " + _format_exception(e), details)
    details["ref_mutates_inputs"] = ev.ref_mutates
    ev.atol, ev.rtol = _tolerance(ev.trials[0]["out"], ev.opts)
    details.update(atol=ev.atol, rtol=ev.rtol)
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Stage 2: the instrumentation, then the candidate's import

_GLUE_OPS = {  # aten ops a kernel wrapper may run itself; anything else in forward counts as a PyTorch fallback
    # allocation and fills
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros",
    "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "scalar_tensor", "arange", "fill", "fill_",
    "zero_", "resize_", "set_",
    # views, layout and copies (data movement, no arithmetic)
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "permute", "transpose", "t", "expand",
    "expand_as", "squeeze", "unsqueeze", "flatten", "unflatten", "select", "slice", "narrow", "split",
    "split_with_sizes", "chunk", "unbind", "alias", "detach", "view_as", "movedim", "contiguous", "clone", "copy_",
    "_to_copy", "to", "lift_fresh", "cat", "stack", "constant_pad_nd",
    "is_same_size",
}   # (not .item(): a Python loop over .item() values is a host-side fallback)


class _Instrumentation:
    """Everything the harness installs in a worker before the candidate is imported, and verifies afterwards."""

    def __init__(self, backend: str, device: str, module_name: str, ref_src: str = ""):
        from torch.utils._python_dispatch import TorchDispatchMode
        self.device, self.module_name = device, module_name
        self.launches = collections.Counter()   # own kernel name -> launches during forward
        self.ops = collections.Counter()        # non-glue aten ops during forward (outside own launches)
        self.builds = []                        # load_inline calls: {"name", "cuda_sources"}
        self.recording, self.paused = False, 0
        self.turn = None                        # the job's connection while it holds a shared GPU turn
        self.problems = []                      # deterministic/fill flags flipped inside a candidate call
        self.poison_s = 0.0                     # seconds spent NaN-filling the allocator before candidate calls
        instr = self

        def record(mode, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if instr.recording and not instr.paused and name not in _GLUE_OPS:
                instr.ops[name] += 1
            return func(*args, **(kwargs or {}))
        # torch wraps __torch_dispatch__ in a dynamo-disable shim that imports torch._dynamo on first use (about as
        # long as importing torch itself); marking the function as already wrapped skips that (torch/_compile.py).
        setattr(record, "__dynamo_disable", record)
        self.recorder = type("OpRecorder", (TorchDispatchMode,), {"__torch_dispatch__": record})()
        if backend == "cuda":
            self._patch_load_inline()
        if backend == "triton":
            self._patch_triton_run()
        self.reaches = _reference_reaches(ref_src)
        self.snapshot = _harness_snapshot(self.reaches)
        self.threads = threading.active_count()

    def _patch_load_inline(self) -> None:
        """Route load_inline to the fast, cached builder of cuda_ext/build.py (it falls back to torch's own build)."""
        import torch.utils.cpp_extension as cpp
        from cuda_ext.build import fast_load_inline as build
        signature = inspect.signature(cpp.load_inline)

        def load_inline(*args, **kwargs):
            a = signature.bind(*args, **kwargs).arguments
            sources = a.get("cuda_sources") or []
            self.builds.append({"name": a.get("name"), "cuda_sources": [sources] if isinstance(sources, str) else list(sources)})
            module = build(**a)   # by name: positional arguments follow the installed torch's order
            self.builds[-1]["how"] = getattr(module, "__kz_build__", "torch")   # fast / plain / cached-... / torch
            return module
        cpp.load_inline = load_inline

    def _patch_triton_run(self) -> None:
        """Count launches of the candidate's own @triton.jit kernels (class-level, so kernels defined anywhere in
        the candidate, autotuned or not, are seen; works under the interpreter too) and pause op recording inside
        a launch (the interpreter itself runs torch ops on the arguments)."""
        from triton.runtime.jit import JITFunction
        classes = [JITFunction]
        if os.environ.get("TRITON_INTERPRET") == "1":
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        for cls in classes:
            def run(kernel, *args, _original=cls.run, **kwargs):
                fn = getattr(kernel, "fn", None)
                if self.recording and not kwargs.get("warmup") and getattr(fn, "__module__", None) == self.module_name:
                    self.launches[fn.__name__] += 1
                with self.unrecorded():
                    return _original(kernel, *args, **kwargs)
            cls.run = run
        if hasattr(JITFunction, "_do_compile"):   # (triton >= 3.3)
            def do_compile(kernel, *args, _original=JITFunction._do_compile, **kwargs):
                with self.off_gpu():
                    return _original(kernel, *args, **kwargs)
            JITFunction._do_compile = do_compile
        from triton.runtime.autotuner import Autotuner   # its benchmarking statistics use torch: not a fallback
        interpreted = len(classes) > 1

        def tune(tuner, *args, _original=Autotuner.run, **kwargs):
            if interpreted:   # the interpreter cannot benchmark (no driver): correctness only, so take the first config
                tuner.configs = tuner.configs[:1]
            with self.unrecorded():
                return _original(tuner, *args, **kwargs)
        Autotuner.run = tune

    @contextlib.contextmanager
    def unrecorded(self):
        """Torch ops run by Triton itself (launcher, interpreter, autotuner) are not the candidate's: not recorded."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    @contextlib.contextmanager
    def off_gpu(self):
        """Give the shared GPU turn back while a Triton kernel compiles (0.3-1 s of CPU each): a timer waiting for
        the GPU then waits for other candidates' GPU work only, not for their compiles (the writer-preferring
        harness_processes.Gate)."""
        if self.turn is None:   # (no shared turn held: e.g. the GPU held alone, keep it)
            yield
            return
        conn, self.turn = self.turn, None
        _pass_turn(conn, self.device, "none")
        try:
            yield
        finally:
            _gpu_turn(conn, "shared")
            self.turn = conn

    def yield_turn(self) -> None:
        """Between two correctness trials: a timer waiting for this GPU gets it now, not after this candidate's
        whole check (_yield_turn)."""
        if self.turn is not None:
            _yield_turn(self.turn, self.device)

    @contextlib.contextmanager
    def candidate_call(self):
        """One candidate forward: no_grad, NaN-poisoned memory, launches and aten ops recorded."""
        if self.device == "cuda":
            clock = time.monotonic()
            _poison_cuda_allocator()
            self.poison_s += time.monotonic() - clock
        det = torch.utils.deterministic
        saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
                 det.fill_uninitialized_memory)
        # -> torch.empty returns NaN-filled memory. (The C setter: torch.use_deterministic_algorithms also imports
        # torch._inductor, which imports dynamo: seconds per worker, for a flag inductor does not need here.)
        torch._C._set_deterministic_algorithms(True, warn_only=True)
        det.fill_uninitialized_memory = True
        try:
            with warnings.catch_warnings(), torch.no_grad():
                warnings.simplefilter("ignore")
                self.recording = True
                try:
                    with self.recorder:
                        yield
                    if self.device == "cuda":
                        torch.cuda.synchronize()
                finally:
                    self.recording = False
            if not (torch.are_deterministic_algorithms_enabled() and det.fill_uninitialized_memory):
                self.problems.append("deterministic mode / fill_uninitialized_memory switched off during forward")
        finally:
            torch._C._set_deterministic_algorithms(saved[0], warn_only=saved[1])
            det.fill_uninitialized_memory = saved[2]

    def recorded_when_captured(self, model):
        """`model` as the timing calls it: while its forward is being captured as a CUDA graph (the only time its
        Python runs during graph timing) its aten ops are recorded as in the trials, so a candidate that computes
        with PyTorch only while captured is seen; eager reps and replays run unrecorded (the recorder's Python would
        sit inside the timed window)."""
        def forward(*args):
            if not torch.cuda.is_current_stream_capturing():
                return model(*args)
            self.recording = True
            try:
                with self.recorder:
                    return model(*args)
            finally:
                self.recording = False
        return forward

    def verify(self) -> tuple[str, str] | None:
        """(check, message) if the candidate patched the harness's references, flags or started threads."""
        # Only what existed at the snapshot: a module imported since is not a patch (torch's profiler imports
        # triton, so a CUDA worker, which does not import it at start, would otherwise see "new" triton functions)
        now = _harness_snapshot(self.reaches)
        changed = [k for k, v in self.snapshot.items() if not _same_ref(v, now.get(k))]
        if changed:
            check = "tf32" if any("tf32" in k or "precision" in k for k in changed) else "monkeypatch"
            return check, f"the candidate changed {', '.join(changed[:8])}"
        if self.problems:
            return "monkeypatch", self.problems[0]
        if threading.active_count() > self.threads:
            return "threads", f"{threading.active_count() - self.threads} new thread(s) still alive"
        return None


def _same_ref(a, b) -> bool:
    return a is b or (type(a) in (bool, str, int, float) and a == b)


# Python operators a reference may use on tensors, as the Tensor methods they call
_OPERATOR_METHODS = {ast.Add: "__add__", ast.Sub: "__sub__", ast.Mult: "__mul__", ast.Div: "__truediv__",
                     ast.MatMult: "__matmul__", ast.Pow: "__pow__", ast.FloorDiv: "__floordiv__", ast.Mod: "__mod__"}


def _static_lookup(owner, name: str):
    """owner.name found without running anything: for a class, the first class in its MRO that defines it (where an
    instance's method call finds it); for a module, its own dictionary, then its type's; None if absent. What
    inspect.getattr_static returns for these owners, at a fraction of its cost: the snapshot runs after every trial."""
    if owner is None:   # (a torch.nn class the candidate deleted)
        return None
    if isinstance(owner, type):
        return next((vars(k)[name] for k in owner.__mro__ if name in vars(k)), None)
    found = vars(owner).get(name)
    return found if found is not None else _static_lookup(type(owner), name)


def _reference_reaches(ref_src: str) -> list[str]:
    """What the reference's forward may call that a candidate could rebind to slow it down (the reference is timed
    after the candidate's import, in its process: pitfalls 6 and 15): for every name and attribute in the reference's
    source, the torch function, torch.nn.functional function, Tensor method or torch.nn class of that name (a class
    with its own methods), plus every torch.nn.functional function (the nn classes call them) and the Tensor methods
    behind the reference's operators. Looked up without side effects (_static_lookup: no lazy imports); torch's own
    late rebinding of manual_seed (importing dynamo wraps it) is left out. Keys ("torch.relu"), in a stable order."""
    import torch.nn.functional as F
    try:
        tree = ast.parse(ref_src)
    except (SyntaxError, ValueError):
        return []
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {_OPERATOR_METHODS[type(n.op)] for n in ast.walk(tree)
              if isinstance(n, (ast.BinOp, ast.AugAssign)) and type(n.op) in _OPERATOR_METHODS}
    names -= {"manual_seed"}
    if not names:
        return []
    reaches = [f"F.{k}" for k, v in sorted(vars(F).items()) if callable(v) and not isinstance(v, type)]
    for name in sorted(names):
        for label, owner in (("torch", torch), ("torch.Tensor", torch.Tensor)):
            obj = _static_lookup(owner, name)
            if obj is not None and not isinstance(obj, type) and (callable(obj) or hasattr(obj, "__get__")):
                reaches.append(f"{label}.{name}")
        cls = _static_lookup(torch.nn, name)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            reaches += [f"torch.nn.{name}.{k}" for k, v in sorted(vars(cls).items()) if callable(v)]
    return reaches


def _harness_snapshot(reaches: list[str] = ()) -> dict:
    """The functions and flags the harness relies on; compared by identity (functions) or value (flags). `reaches`
    (from _reference_reaches) names what the reference may call: each is looked up again, by the same route."""
    import builtins
    import torch.utils.cpp_extension
    snap = {
        "torch.allclose": torch.allclose, "torch.equal": torch.equal, "torch.isnan": torch.isnan,
        "torch.isfinite": torch.isfinite, "torch.testing.assert_close": torch.testing.assert_close,
        "torch.no_grad": torch.no_grad, "torch.exp": torch.exp,   # (not manual_seed: importing dynamo wraps it)
        "torch.nn.Module.__call__": torch.nn.Module.__call__, "torch.nn.Module._call_impl": torch.nn.Module._call_impl,
        "time.perf_counter": time.perf_counter, "time.time": time.time, "time.monotonic": time.monotonic,
        "builtins.isinstance": builtins.isinstance, "builtins.type": builtins.type, "builtins.len": builtins.len,
        "builtins.max": builtins.max, "builtins.float": builtins.float,
        "fill_uninitialized_memory": torch.utils.deterministic.fill_uninitialized_memory,
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn.benchmark": torch.backends.cudnn.benchmark,
        "torch.utils.cpp_extension.load_inline": torch.utils.cpp_extension.load_inline,
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        snap["tf32.matmul.allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        snap["tf32.cudnn.allow_tf32"] = torch.backends.cudnn.allow_tf32
        snap["matmul.allow_fp16_reduced_precision"] = torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    for name in ("clone", "to", "float", "double", "abs", "max", "sub", "__sub__", "isnan", "equal", "cpu", "detach",
                 "copy_", "data_ptr", "untyped_storage", "numel", "__eq__", "__torch_function__", "is_floating_point",
                 "nan_to_num", "all", "any", "item", "shape", "dtype", "device"):
        snap[f"torch.Tensor.{name}"] = _static_lookup(torch.Tensor, name)   # raw (classmethods too)
    if torch.cuda.is_available():
        snap.update({"torch.cuda.synchronize": torch.cuda.synchronize, "torch.cuda.Event": torch.cuda.Event,
                     "torch.cuda.Event.record": torch.cuda.Event.record,
                     "torch.cuda.Event.elapsed_time": torch.cuda.Event.elapsed_time,
                     "torch.cuda.Event.synchronize": torch.cuda.Event.synchronize})
    if "triton" in sys.modules:
        from triton.runtime.jit import JITFunction, KernelInterface
        from triton.runtime.autotuner import Autotuner
        snap["JITFunction.run"], snap["KernelInterface.__getitem__"] = JITFunction.run, KernelInterface.__getitem__
        snap["Autotuner.run"] = Autotuner.run
        if "triton.runtime.interpreter" in sys.modules:
            snap["InterpretedFunction.run"] = sys.modules["triton.runtime.interpreter"].InterpretedFunction.run
    # the harness's own functions, in every module of it that runs here (the static check bans importing them, but
    # a candidate that reached one anyway could patch it): each module's bindings, those it imported from the other
    import torch.nn.functional as F
    for key in reaches:   # looked up by its key's route, at the snapshot and again at every check
        owner, name = key.rsplit(".", 1)
        where = {"F": F, "torch": torch, "torch.Tensor": torch.Tensor}.get(owner) or \
            _static_lookup(torch.nn, owner.split(".")[-1])
        snap["reaches " + key] = _static_lookup(where, name)
    own = {module.__name__ for module in _HARNESS_MODULES}
    for module in _HARNESS_MODULES:
        for name, obj in vars(module).items():
            if callable(obj) and getattr(obj, "__module__", None) in own:
                snap[f"{module.__name__}.{name}"] = obj
    return snap


_SMALL_REQUEST_MAX = 1 << 20   # torch's caching allocator serves requests of <= 1 MiB from its small pool


def _free_block_requests(snapshot: list[dict], stream: int) -> tuple[list[int], bool]:
    """Sizes to request on `stream` so that each free block of the caching allocator (torch.cuda.memory_snapshot())
    that such a request can get is taken: its own size (the allocator's best fit), except for a small segment's free
    block over 1 MiB (small segments are 2 MiB), which a request of its size would miss: that request goes to the
    large pool. Such a block is asked for in 1 MiB, and the second value says so: what it leaves free is taken in
    another pass. Blocks of other streams and of CUDA graphs' private pools are left out: a request on this stream
    never gets them, so asking for their sizes would only make new segments (and another pass, every time)."""
    requests, split = [], False
    for segment in snapshot:
        if segment["stream"] != stream or tuple(segment["segment_pool_id"]) != (0, 0):
            continue
        for block in segment["blocks"]:
            if block["state"] != "inactive":
                continue
            if segment["segment_type"] == "small" and block["size"] > _SMALL_REQUEST_MAX:
                requests.append(_SMALL_REQUEST_MAX)
                split = True
            else:
                requests.append(block["size"])
    return requests, split


def _poison_cuda_allocator() -> None:
    """Fill every free block of the caching allocator with NaN, so that memory a candidate gets without a fill (raw
    storage, a C++ allocation) holds no stale result, such as the reference's freed output (pitfall #1). Each free
    block this stream's requests can get is taken by asking for its size (the allocator's best fit), filled, and
    given back: no driver call. (A CUDA graph's private pool holds only what its capture allocated; another
    stream's blocks, only what was allocated there: the reference's outputs are made on this stream.) A small
    segment's free block over 1 MiB is taken in pieces, one more pass each (at most four; two suffice, since
    small segments are 2 MiB). Memory the cache has not got comes fresh from cudaMalloc, and this process never
    returned any to the driver before the candidate's calls (no empty_cache), so no old result of ours can be in it.
    No host sync first: the fills are ordered on the stream after whatever used those blocks last, and a free
    deferred by record_stream (not complete yet, so not in the cache) can only be the candidate's own tensor: the
    harness never records one."""
    torch.empty(1, device="cuda")   # an allocation first: completed record_stream frees become free blocks
    held, stream = [], torch.cuda.current_stream().cuda_stream
    for _ in range(4):   # all blocks are held until the end, so each pass sees only what the last one left free
        requests, split = _free_block_requests(torch.cuda.memory_snapshot(), stream)
        for size in sorted(requests, reverse=True):
            t = torch.empty(size, dtype=torch.uint8, device="cuda")
            t[: size // 4 * 4].view(torch.float32).fill_(float("nan"))
            held.append(t)
        if not split:   # nothing was taken in pieces: no block is left over
            break
    del held   # back to the cache, NaN-filled


def _import_candidate(job: dict, send, details: dict) -> tuple:
    """Compile phase: install instrumentation, import the candidate (a CUDA extension builds here)."""
    instr = _Instrumentation(job["backend"], job["device"], "kz_candidate",   # harness time: before the clock
                             job["ref_src"])                                 # starts
    send(("phase", "compile"))
    start = time.perf_counter()
    try:
        cand = _load_module(job["cand_src"], "kz_candidate")
    except SystemExit as e:
        return None, instr, _fail("compile", f"the candidate called sys.exit({e.code}) at import", details)
    except Exception as e:
        return None, instr, _fail(_classify(e) if _classify(e) == "crash" else "compile", _format_exception(e), details)
    compile_s = time.perf_counter() - start
    if instr.builds:
        details["builds"] = [b.get("how") for b in instr.builds]
    if not isinstance(getattr(cand, "ModelNew", None), type):
        return None, instr, _fail("format", "the candidate defines no class ModelNew", details, compiled=True)
    hit = instr.verify()
    if hit:
        return None, instr, _fail("reward_hack", hit[1], details, hit[0], compiled=True, compile_s=compile_s)
    return cand, instr, {"compile_s": compile_s}


def _build_candidate(ev: _Evaluation) -> dict | None:
    """Stage 2: the instrumentation installed, then the candidate imported (a CUDA extension builds here)."""
    ev.cand, ev.instr, info = _import_candidate(ev.job, ev.conn.send, ev.details)
    if ev.cand is None:
        return info
    ev.compile_s = info["compile_s"]
    ev.conn.send(("phase", "run"))
    if ev.turn == "shared":   # Triton JIT compiles give it back meanwhile (off_gpu), and each trial may (yield_turn)
        ev.instr.turn = ev.conn
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Stage 3: correctness trials

def _compare(out, ref_out, device, atol: float, rtol: float,
             read_with: list | tuple = ()) -> tuple[str | None, str | None, str, dict]:
    """(error_kind or None, check or None, message, stats) for a candidate output against the reference output.
    The numbers of every output come back in one host read (on a GPU that other worker processes share, each read
    waits for their time slices, and this runs for every trial), and with them `read_with`: the caller's own 0-dim
    device tensors, whose values come back as stats["read_with"]."""
    stats = {"max_abs_err": 0.0, "max_rel_err": 0.0}
    early, numbers = _output_numbers(out, ref_out, device, atol, rtol)
    if early:   # (an answer the host could give alone: the caller's values read on their own)
        stats["read_with"] = _host_ints(list(read_with))
        return (*early, stats)
    values = iter(_host_floats([x for _, _, xs in numbers for x in xs] + list(read_with)))   # (the one host read)
    found = _judge_numbers(numbers, values, stats, atol, rtol)
    stats["read_with"] = [int(v) for v in values]   # (what the judge left: the caller's values)
    return (*found, stats)


def _output_numbers(out, ref_out, device, atol: float, rtol: float) -> tuple[tuple | None, list]:
    """_compare's device half: (a verdict the host gives without reading anything, or None; [(output index, output,
    its numbers still on the device)]). A floating output's numbers: NaNs the reference has not, max abs error, max
    relative error, values outside the tolerance; another dtype's: how many values differ."""
    if isinstance(ref_out, torch.Tensor):
        pairs = [(out, ref_out)]
    elif isinstance(out, (tuple, list)) and len(out) == len(ref_out):
        pairs = list(zip(out, ref_out))
    else:
        return ("mismatch", None,
                f"expected {type(ref_out).__name__} of {len(ref_out)} tensors, got {type(out).__name__}"), []
    numbers = []
    for i, (o, r) in enumerate(pairs):
        if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor:
            return ("reward_hack", "output_type", f"output {i} is a {type(o).__name__}, not a plain torch.Tensor"), []
        if type(o) is not torch.Tensor:
            return ("mismatch", None, f"output {i} is a {type(o).__name__}, not a torch.Tensor"), []
        if o.is_meta or o.layout != torch.strided or (o.numel() and o.untyped_storage().data_ptr() == 0):
            return ("reward_hack", "output_storage", f"output {i} has no real storage"), []
        if o.device.type != device.type:
            return ("mismatch", None, f"output {i} is on {o.device}, expected {device.type}"), []
        if o.shape != r.shape or o.dtype != r.dtype:
            return ("mismatch", None,
                    f"output {i}: got {tuple(o.shape)} {o.dtype}, expected {tuple(r.shape)} {r.dtype}"), []
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


def _step_numbers(o: torch.Tensor, r: torch.Tensor, atol: float, rtol: float) -> list[torch.Tensor]:
    """_output_numbers for flat slices of one output and its reference (same device): for a floating output [NaNs
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


def _judge_numbers(numbers: list, values, stats: dict, atol: float, rtol: float) -> tuple:
    """_compare's host half: (error_kind or None, check or None, message) from _output_numbers' numbers, whose values
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


def _heavy_tol(trial: dict, trials: list, atol: float, rtol: float) -> tuple[float, float]:
    """The heavy-tailed trial's outputs are larger; scale atol by how much (keeps the same relative demand)."""
    if not trial["heavy"]:
        return atol, rtol
    heavy = [t.float().abs().mean() for t in _tensors(trial["out"]) if t.numel()]
    first = [t.float().abs().mean() for t in _tensors(trials[0]["out"]) if t.numel()]
    means = _host_floats(heavy + first)   # (one host read for both)
    heavy_mean, first_mean = sum(means[:len(heavy)]) or 1.0, sum(means[len(heavy):]) or 1.0
    return atol * max(1.0, heavy_mean / first_mean), rtol


_REWRITTEN = "the reference outputs kept on the GPU changed while the candidate ran"


def _refill(args: list | None, pristine: list) -> list:
    """The candidate's arguments for a trial: the same tensor objects (same id() and data_ptr) refilled with the new
    trial's values when shapes allow, so an output cache keyed by id/data_ptr replays the previous trial and fails
    (pitfall #7); fresh clones the first time or when shapes change."""
    if args is None or any(isinstance(a, torch.Tensor) and a.shape != p.shape for a, p in zip(args, pristine)):
        return [p.clone() if isinstance(p, torch.Tensor) else p for p in pristine]
    for a, p in zip(args, pristine):
        if isinstance(a, torch.Tensor):
            a.copy_(p)
    return args


def _check_correctness(ev: _Evaluation) -> dict | None:
    """Stage 3: every trial, the candidate on poisoned memory with its own input copies; its output compared with
    the reference's, its inputs with their pristine copies, the harness's references with their snapshot; two trials
    run twice (races, pitfall #13); the stored reference outputs checked for tampering at the end."""
    instr, device, details, trials = ev.instr, ev.device, ev.details, ev.trials
    args, clock = None, time.monotonic()
    try:
        ev.cand_model = _build_model(ev.cand.ModelNew, ev.init_inputs, device, ev.opts)
        for t, trial in enumerate(trials):
            if t:
                instr.yield_turn()
            # the stored inputs themselves where they are on the GPU already (the candidate gets copies, args; a
            # kernel that rewrites a stored input anyway only makes its own outputs disagree), a 6.4 GB copy fewer
            pristine = _to_device(trial["inputs"], device, copy=False)
            args = _refill(args, pristine)
            with instr.candidate_call():
                out = ev.cand_model(*args)
            hit = instr.verify()
            if hit:
                return ev.failed("reward_hack", hit[1], hit[0])
            # the inputs checked in the comparison's host read (one read per trial, not one per input more)
            unchanged = [] if ev.ref_mutates else [_unchanged(a, p, device) for a, p in zip(args, pristine)]
            kind, check, message, stats = _compare(out, trial["out"], device,
                                                   *_heavy_tol(trial, trials, ev.atol, ev.rtol), read_with=unchanged)
            if not all(stats["read_with"]):
                return ev.failed("reward_hack", "the candidate modified its inputs", "input_mutation")
            details["max_abs_err"] = max(details.get("max_abs_err", 0.0), stats.get("max_abs_err", 0.0))
            details["max_rel_err"] = max(details.get("max_rel_err", 0.0), stats.get("max_rel_err", 0.0))
            if kind:
                details["failed_trial"] = "heavy" if trial["heavy"] else t
                return ev.failed(kind, message, check)
            if t == 0 or t == len(trials) - 2:   # run twice on fresh copies: must agree with itself (races)
                with instr.candidate_call():
                    again = ev.cand_model(*[p.clone() if isinstance(p, torch.Tensor) else p for p in pristine])
                kind, _, message, _ = _compare(again, _copy_out(out, device), device, ev.atol, ev.rtol)
                if kind:
                    return ev.failed("mismatch", "two runs on the same inputs disagree: " + message,
                                     "nondeterministic")
                del again
            del out, pristine
        details.update(trials=len(trials), trials_s=_since(clock), poison_s=round(instr.poison_s, 3))
        if not _outputs_intact(trials):
            return ev.failed("reward_hack", _REWRITTEN, "reference_outputs")
    except Exception as e:
        return ev.failed(_classify(e), _format_exception(e))
    except SystemExit as e:
        return ev.failed("runtime", f"the candidate called sys.exit({e.code})")
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Stage 4: the candidate's own kernels did the work

def _kernel_coverage(model, inputs: list, device, instr: _Instrumentation) -> dict:
    """Profile one forward: which GPU kernels ran, and the share of kernel time spent in the candidate's own."""
    from torch.profiler import ProfilerActivity, profile
    own_names = set(instr.launches)   # Triton kernel names
    for build in instr.builds:        # CUDA: the __global__ functions in the load_inline sources
        for src in build["cuda_sources"]:
            src = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", src)
            own_names |= set(re.findall(r"__global__[^(;{]*?(\w+)\s*\(", src))
    args = _to_device(inputs, device)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        model(*args)
        torch.cuda.synchronize()
    kernels = collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name] += e.time_range.elapsed_us()
    # prefix match: Triton may suffix kernel names; CUDA names may be demangled ("void k<float>(float const*)") or
    # mangled ("_Z1kPf", hence a digit may precede the name)
    own = {k: v for k, v in kernels.items() if any(re.search(rf"(?<![A-Za-z_]){re.escape(n)}", k) for n in own_names)}
    total = sum(kernels.values())
    return {"kernels": list(kernels), "own_kernels": list(own),
            "kernel_coverage": (sum(own.values()) / total) if total else 0.0}


def _check_coverage(ev: _Evaluation) -> dict | None:
    """Stage 4: did the candidate's own kernels do the work? Triton: its launches were counted (a counted launch
    reached the driver, the profiler would add nothing but seconds of CUPTI start-up); CUDA on a GPU: one profiled
    forward. Any non-glue aten op recorded during forward is a PyTorch fallback (pitfall #11)."""
    instr, details = ev.instr, ev.details
    details["launches"] = dict(instr.launches)
    details["torch_ops"] = dict(instr.ops)
    if ev.job["backend"] == "triton" and not instr.launches:
        return ev.failed("reward_hack", "no @triton.jit kernel of the candidate ran during forward",
                         "kernel_not_launched")
    if ev.job["backend"] == "triton":
        details["own_kernels"] = sorted(instr.launches)
    elif ev.device.type == "cuda":
        clock = time.monotonic()
        try:
            coverage = _kernel_coverage(ev.cand_model, ev.trials[0]["inputs"], ev.device, instr)
        except Exception as e:
            return ev.failed(_classify(e), _format_exception(e))
        details.update(coverage, coverage_s=_since(clock))
        if not coverage["own_kernels"]:
            return ev.failed("reward_hack", f"none of the candidate's kernels ran on the GPU (kernels seen: "
                             f"{', '.join(coverage['kernels'][:5]) or 'none'})", "kernel_not_launched")
    if instr.ops:
        ops = ", ".join(f"{k} x{v}" for k, v in instr.ops.most_common(8))
        return ev.failed("reward_hack", f"forward computes with PyTorch ops: {ops}", "pytorch_fallback")
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Stage 5: timing (GPU only)

def _capture(model, pristine: list, stream) -> tuple:
    """(graph, static_args, static_out): one forward of `model` captured as a CUDA graph, on copies of `pristine`.
    A replay reruns the captured kernels on whatever static_args hold then, with no Python in between. Raises where
    a forward cannot be captured: a host sync (.item(), a device-to-host copy), an unjoined side stream, an
    allocation outside the graph's pool. (A kernel launched on the legacy default stream runs during the capture
    but is not in the graph: _graph_runners' replays on both input sets find it out.)"""
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
    tol = tol if any(tol) else _tolerance(sets[0][1], {"atol": None, "rtol": None})
    need = len(models) * (_nbytes(sets[0][0]) + _nbytes(_tensors(sets[0][1])))   # captured inputs and outputs
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
                _load_static(static, inputs)
                graph.replay()   # (the numbers are computed on the stream before the next replay rewrites `out`)
                early, numbers = _output_numbers(out, ref_out, device, *tol)
                if early:
                    return None, f"{name}: a replay of its captured forward disagrees with the reference ({early[2]})"
                replays.append((name, numbers))
        values = iter(_host_floats([x for _, numbers in replays for _, _, xs in numbers for x in xs]))
        for name, numbers in replays:
            kind, _, message = _judge_numbers(numbers, values, {"max_abs_err": 0.0, "max_rel_err": 0.0}, *tol)
            if kind:
                return None, f"{name}: a replay of its captured forward disagrees with the reference ({message})"
    except Exception as e:   # not capturable: the eager method, which needs none of this
        with contextlib.suppress(Exception):
            torch.cuda.synchronize()
        return None, _truncate(f"{type(e).__name__}: {e}", 300)
    return runners, None


def _load_static(static: list, inputs: list) -> None:
    """Copy one input set's values into a captured graph's input tensors (stream-ordered, before the flush)."""
    for s, x in zip(static, inputs):
        if isinstance(s, torch.Tensor):
            s.copy_(x)


SPOT_CHECKS = 3   # timing reps whose output is compared with the reference, per timed candidate


def _spot_reps(n: int, sets: int, k: int, rng: random.Random) -> set[int]:
    """k distinct rep indices of range(n), drawn by rng, with at least one rep of every input set (rep % sets)."""
    picks = {rng.randrange(s, n, sets) for s in range(min(sets, n))}
    rest = [r for r in range(n) if r not in picks]
    return picks | set(rng.sample(rest, max(0, min(k - len(picks), len(rest)))))


def _median_ci_width(xs: list) -> float:
    """Width of the distribution-free 95% confidence interval of the median (order statistics), relative to it."""
    xs, n = sorted(xs), len(xs)
    k = max(0, int((n - 1.96 * n ** 0.5) / 2))
    return (xs[n - 1 - k] - xs[k]) / max(xs[n // 2], 1e-9)


def _median(xs: list) -> float:
    return sorted(xs)[len(xs) // 2]


def _timing_rule(opts: dict) -> dict:
    return {"adaptive": opts["timing_adaptive"], "ci": opts["timing_ci"], "min_reps": opts["timing_min_reps"],
            "headroom_us": opts["timing_headroom_us"], "graphs": opts["timing_graphs"]}


def _time_models(models: dict, trials: list, device, budget_s: float, checked: str | None = None,
                 tol: tuple = (0.0, 0.0), adaptive: bool = False, ci: float = 0.02, min_reps: int = 20,
                 headroom_us: float = 0, graphs: bool = False, exclusive=None, after=None) -> dict:
    """Interleaved CUDA-event timing of several models on the same inputs (module docstring, item 5).
    Returns {name: list of ms}, "method": "graph" or "eager" (and "graph_fallback": why not); the `checked` model's
    outputs are compared with the reference on a few unpredictable reps. `graphs`: each model's forward captured
    once as a CUDA graph and replayed per rep (_graph_runners; else, or where that fails, every model is called
    eagerly, with a device-wide synchronize before the end event). `adaptive`: reps (at least min_reps) until every
    model's median has a 95% confidence interval narrower than `ci` of it, at most 300 reps or `budget_s` of wall
    time; else the fixed rule (budget_s spent, 30..300 reps). `headroom_us`: GPU sleep after each rep's flush
    (DEFAULTS["timing_headroom_us"]).
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
             tr["out"] if "fp" in tr else _copy_out(tr["out"], device)) for tr in trials[:2]]
    runners, why_not = _graph_runners(models, sets, tol, device) if graphs else (None, None)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sleep_cycles = 0
    if headroom_us > 0:   # calibrate torch.cuda._sleep (a spin kernel counting clock cycles) once
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(10**6)
        end.record()
        end.synchronize()
        sleep_cycles = int(10**6 * headroom_us / 1e3 / max(start.elapsed_time(end), 1e-3))
    times = {name: [] for name in models}
    # host: the wall time of the checked model's reps (a cross-check of the events)
    times.update(bad_output=[], host=[], method="graph" if runners else "eager")
    if why_not:
        times["graph_fallback"] = why_not

    def once(name, rep, check=False, wait=True):
        pristine, ref_out = sets[rep % len(sets)]
        if runners:   # a graph replay: the rep's input values copied into the captured inputs, no Python between
            graph, static, out = runners[name]   # the start and end events, no host latency inside the window
            _load_static(static, pristine)
        else:
            args = [x.clone() if isinstance(x, torch.Tensor) else x for x in pristine]   # fresh copy, untimed
            torch.cuda.synchronize()
        flush.zero_()   # ~80 us of GPU work: an eager model's Python launch overhead hides behind it, as in
        if sleep_cycles:   # triton.testing.do_bench; we time GPU work, not how fast Python launches
            torch.cuda._sleep(sleep_cycles)
        host = time.perf_counter()
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
            times["bad_output"] += [_compare(out, ref_out, device, *tol)[0] is not None]
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
            if all(_median_ci_width(times[name]) <= ci for name in names) or time.monotonic() > deadline:
                break
    if after is not None:
        after()
    # compared on the GPU (the host copy goes there): a pageable copy of a large output to the host would take a
    # large part of a second
    times["ref_intact"] = all(_same(gpu_copy, host) for tr, (_, out) in zip(trials, sets) if "fp" not in tr
                              for host, gpu_copy in zip(_tensors(tr["out"]), _tensors(out)))
    return times


def _time_candidate(ev: _Evaluation) -> dict | None:
    """Stage 5 (GPU only): reference and candidate timed interleaved (_time_models), then the checks that timing
    gives a candidate new chances to fool: the snapshot, the stored reference outputs, the ops of the captured
    forward and the spot-checked outputs."""
    if not (ev.device.type == "cuda" and ev.opts["timing"]):
        return None
    instr, details, opts, device, trials, conn = ev.instr, ev.details, ev.opts, ev.device, ev.trials, ev.conn
    instr.turn = None   # (what follows launches no JIT: the trials ran every kernel)
    clock = time.monotonic()
    # the aten ops recorded so far: the forward captured for timing must add none. (Its launches are not
    # re-checked: a legitimate candidate may launch its compiled kernel past the counter after the first call.)
    ops = collections.Counter(instr.ops)
    timed = instr.recorded_when_captured(ev.cand_model)
    # input copies, graph captures and warm-up under the shared turn, the timed reps alone, and the checks after
    # them shared again (a job that holds the GPU alone throughout, a rerun after an out-of-memory, keeps it)
    alone = (lambda: _gpu_turn(conn, "exclusive"))
    shared = (lambda: _gpu_turn(conn, "shared")) if ev.turn == "shared" else None
    try:
        times = _time_models({"ref": ev.ref_model, "cand": timed}, trials, device, opts["timing_budget_s"],
                             checked="cand", tol=(ev.atol, ev.rtol), exclusive=alone, after=shared,
                             **_timing_rule(opts))
    except Exception as e:
        return ev.failed(_classify(e), _format_exception(e))
    hit = instr.verify()
    if hit:
        return ev.failed("reward_hack", hit[1], hit[0])
    if not times["ref_intact"] or not _outputs_intact(trials):
        return ev.failed("reward_hack", _REWRITTEN, "reference_outputs")
    captured_ops = instr.ops - ops   # (Counter subtraction)
    if captured_ops:
        found = ", ".join(f"{k} x{v}" for k, v in captured_ops.most_common(8))
        return ev.failed("reward_hack", f"the forward captured for timing computes with PyTorch ops: {found}",
                         "pytorch_fallback")
    if any(times["bad_output"]):
        return ev.failed("mismatch", "an output during the timing reps was wrong (cached/replayed result?)",
                         "timing_output")
    ref_ms, cand_ms = times["ref"], times["cand"]
    details.update(timing_s=_since(clock), timing_method=times["method"], reps=len(cand_ms), ref_reps=len(ref_ms),
                   median_ci=round(_median_ci_width(cand_ms), 4), ref_median_ci=round(_median_ci_width(ref_ms), 4),
                   mean_ms=sum(cand_ms) / len(cand_ms), ref_mean_ms=sum(ref_ms) / len(ref_ms),
                   host_median_ms=_median(times["host"]))
    if "graph_fallback" in times:
        details["graph_fallback"] = times["graph_fallback"]
    ev.timing = dict(runtime_ms=_median(cand_ms), ref_runtime_ms=_median(ref_ms),
                     speedup=_median(ref_ms) / max(_median(cand_ms), 1e-9))
    if opts["compile_baseline"] and ev.ref_model is not None:   # after verify(): torch.compile starts threads
        try:
            compiled = torch.compile(ev.ref_model)
            ms = _median(_time_models({"compiled": compiled}, trials, device, opts["timing_budget_s"],
                                      exclusive=alone, after=shared)["compiled"])
            details.update(compile_baseline_ms=ms, speedup_vs_compile=ms / max(_median(cand_ms), 1e-9))
        except Exception as e:   # the baseline is optional: report, do not fail the candidate
            details["compile_baseline_error"] = _truncate(_format_exception(e), 300)
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Shared reference work, worker side: one job makes a task's trials, each candidate reads its own copy of them

@dataclass(frozen=True)
class _Slot:
    """Where a tensor sits in a shared reference's trials (the tensors themselves travel as raw bytes)."""
    index: int


def _strip_tensors(x, tensors: list):
    if isinstance(x, torch.Tensor):
        tensors.append(x)
        return _Slot(len(tensors) - 1)
    if isinstance(x, (list, tuple)):
        return type(x)(_strip_tensors(y, tensors) for y in x)
    return x


def _fill_tensors(x, tensors: list):
    if isinstance(x, _Slot):
        return tensors[x.index]
    if isinstance(x, (list, tuple)):
        return type(x)(_fill_tensors(y, tensors) for y in x)
    return x


def _storage_bytes(t: torch.Tensor) -> memoryview:
    """A tensor's whole storage as bytes (views keep their strides and offset: _tensor_from)."""
    raw = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())
    return memoryview(raw.numpy()) if raw.numel() else memoryview(b"")


def _tensor_from(buf: bytearray, spec: tuple) -> torch.Tensor:
    dtype, size, stride, offset = spec
    raw = torch.frombuffer(buf, dtype=torch.uint8) if len(buf) else torch.empty(0, dtype=torch.uint8)
    return raw.view(getattr(torch, dtype)).as_strided(size, stride, offset)


def _pread(fd: int, offset: int, size: int) -> bytearray:
    buf = bytearray(size)
    view = memoryview(buf)
    while len(view):
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise EOFError("the shared trials' file ended early")
        view, offset = view[n:], offset + n
    return buf


def _job_reference(job: dict, conn: Connection) -> dict:
    """A task's reference work, done once for all of its candidates in a map call: its trials (inputs and reference
    outputs; each candidate still times the reference itself, interleaved with its own reps). The trials go to the
    parent as raw tensor bytes (("pack", meta) then one message per tensor); the parent keeps them in
    a sealed memory file, from which each candidate reads its own copy before it is imported (_receive_reference)."""
    details = {}
    conn.send(("phase", "reference"))
    try:
        _, _, _, trials, ref_mutates = _reference(job, conn, details, "shared")
    except Exception as e:
        details["stage"] = "reference"
        return _fail(_classify(e), "the reference failed: " + _format_exception(e), details)
    tensors = []
    skeleton = _strip_tensors([[tr["inputs"], tr["out"], tr["heavy"]] for tr in trials], tensors)
    tensors = [t.cpu() for t in tensors]   # (inputs made on the GPU travel through the host like the rest)
    buffers = [_storage_bytes(t) for t in tensors]
    meta = {"trials": skeleton, "ref_mutates": ref_mutates,
            "tensors": [(str(t.dtype).removeprefix("torch."), tuple(t.shape), t.stride(), t.storage_offset())
                        for t in tensors],
            "nbytes": sum(len(b) for b in buffers),
            "trial_bytes": [_nbytes(trials[0]["inputs"]), _nbytes(_tensors(trials[0]["out"]))],
            "details": {k: details[k] for k in ("heavy_trial", "trials_capped", "ref_inputs_s", "ref_outputs_s")
                        if k in details}}
    conn.send(("pack", meta))
    for buf in buffers:
        conn.send_bytes(buf)
    return {"error_kind": "ok", "details": details}


def _receive_reference(job: dict, conn: Connection, details: dict) -> tuple:
    """A candidate job's reference from a shared reference job: the task module is loaded as in _reference (same
    files, same init inputs), the trials are read from the parent's sealed memory file (its descriptor arrives after
    the job) into this process's own memory, before the candidate exists. Returns (module, init_inputs, trials,
    mutates)."""
    pack = job["pack"]
    clock = time.monotonic()
    fd = multiprocessing.reduction.recv_handle(conn)
    try:   # one copy straight from the sealed file into this process's own memory, then no handle is left to it
        buffers = [_pread(fd, offset, size) for offset, size in pack["extents"]]
    finally:
        os.close(fd)
    tensors = [_tensor_from(buf, spec) for buf, spec in zip(buffers, pack["tensors"])]
    trials = [{"inputs": inputs, "out": out, "heavy": heavy}
              for inputs, out, heavy in _fill_tensors(pack["trials"], tensors)]
    ref = _load_module(job["ref_src"], "kz_reference")
    del sys.modules["kz_reference"]   # the candidate cannot find it by name
    init_inputs = ref.get_init_inputs()
    details.update(pack["details"], shared_reference=True, ref_receive_s=_since(clock), trials_on="cpu")
    return ref, init_inputs, trials, pack["ref_mutates"]


# ---------------------------------------------------------------------------------------------------------------------
# The other jobs: compile (GPU mode's CPU stage) and lint (task quality rules)

def _job_compile(job: dict, conn: Connection) -> dict:
    """GPU mode's first stage on a CPU worker: build/import only, so the GPU stage finds a cache hit."""
    details = {}
    cand, instr, info = _import_candidate(job, conn.send, details)
    if cand is None:
        return info
    return {"error_kind": "ok", "compiled": True, "compile_s": info["compile_s"], "details": details}


def _repeatable(a, b) -> bool:
    """Two runs of a task on the same inputs agree: bit for bit, or for floats within a tenth of the candidates'
    tolerance (a CPU GEMM's first and second calls can differ by ~1e-6 relative; such noise cannot flip a verdict,
    while randomness differs by O(1))."""
    if _same(a, b):
        return True
    tol = TOLERANCES.get(str(a.dtype).removeprefix("torch."), 1e-4) / 10 if a.is_floating_point() else None
    return tol is not None and a.shape == b.shape and torch.allclose(a, b.to(a.device), rtol=tol, atol=tol,
                                                                     equal_nan=True)


def _job_lint(job: dict, conn: Connection) -> dict:
    """Task quality rules (pitfall 8, degenerate tasks); the module is untrusted, hence a worker."""
    conn.send(("phase", "reference"))
    _gpu_turn(conn, "shared")
    device, opts = torch.device(job["device"]), job["opts"]
    report = {"ok": False, "problems": [], "eager_ms": None, "input_mb": None}
    problems = report["problems"]
    try:
        mod = _load_module(job["src"], "kz_task")
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(mod, n)]
        if missing:
            problems.append(f"missing {', '.join(missing)}")
            return report
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs()).to(device)
        torch.manual_seed(1)
        inputs = list(mod.get_inputs())
    except BaseException as e:
        problems.append("does not load: " + _format_exception(e))
        return report
    report["input_mb"] = _nbytes(inputs) / 2**20
    if report["input_mb"] > opts.get("max_input_mb", 512):
        problems.append(f"inputs take {report['input_mb']:.0f} MB (limit {opts.get('max_input_mb', 512)} MB)")
    try:
        pristine = _to_device(inputs, device)
        times, outs = [], []

        def run():
            args = [x.clone() if isinstance(x, torch.Tensor) else x for x in pristine]
            start = time.perf_counter()
            with torch.no_grad():
                outs.append(_copy_out(model(*args)))
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)

        def disagree(i, j):
            return [(a, b) for a, b in zip(_tensors(outs[i]), _tensors(outs[j])) if not _repeatable(a, b)]

        run()
        run()   # same inputs twice -> the same output
        differ = disagree(0, 1)
        # If not, a third run decides: randomness disagrees with both, while a rare one-off difference on a loaded
        # CPU agrees with one of them
        if differ:
            run()
            if not disagree(2, 0) or not disagree(2, 1):
                differ = []
    except BaseException as e:
        problems.append("does not run: " + _format_exception(e))
        return report
    if differ:
        a, b = differ[0]
        how = ""
        if a.shape == b.shape and a.is_floating_point():   # (what the difference looked like, for a report)
            gap = (a.double() - b.double()).abs().nan_to_num(float("inf"))
            how = f" ({int((gap > 0).sum())} of {a.numel()} values, max abs difference {float(gap.max()):.3g})"
        problems.append("not deterministic: the same inputs gave different outputs" + how)
    if device.type == "cuda":
        _gpu_turn(conn, "exclusive")
        with torch.no_grad():
            report["eager_ms"] = min(_lint_gpu_ms(model, pristine) for _ in range(3))
        if report["eager_ms"] < opts.get("min_gpu_ms", 0.05):
            problems.append(f"eager time {report['eager_ms'] * 1e3:.0f} us < 50 us: launch overhead would dominate")
    else:
        report["eager_ms"] = min(times)
        if report["eager_ms"] > opts.get("max_cpu_ms", 5000):
            problems.append(f"eager time on the CPU {report['eager_ms'] / 1e3:.1f} s > {opts.get('max_cpu_ms', 5000) / 1e3:.0f} s")
    atol, rtol = _tolerance(outs[0], dict(DEFAULTS, **{k: opts.get(k) for k in ("atol", "rtol")}))
    first_float = next((x for x in inputs if _is_float(x)), None)
    for i, r in enumerate(_tensors(outs[0])):
        if r.is_floating_point() and not bool(torch.isfinite(r).all()):
            problems.append(f"output {i} contains NaN/inf")
            continue
        fakes = {"zeros": torch.zeros_like(r)}
        if r.is_floating_point() and r.numel() > 1:   # (a single value is its own mean: a loss is not degenerate)
            fakes["constant (its mean)"] = torch.full_like(r, float(r.float().mean()))
            if first_float is not None:
                fakes["mean of the input"] = torch.full_like(r, float(first_float.float().mean()))
        if first_float is not None and first_float.shape == r.shape:
            fakes["identity (the first input)"] = first_float.to(r.dtype)
        for name, fake in fakes.items():
            close = torch.allclose(fake, r, atol=atol, rtol=rtol) if r.is_floating_point() else torch.equal(fake, r)
            if close:
                problems.append(f"degenerate: a {name} output passes the tolerance (atol={atol:g})")
    report["ok"] = not problems
    return report


def _lint_gpu_ms(model, pristine) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    args = [x.clone() if isinstance(x, torch.Tensor) else x for x in pristine]
    model(*args)
    torch.cuda.synchronize()
    start.record()
    model(*args)
    end.record()
    end.synchronize()
    return start.elapsed_time(end)
