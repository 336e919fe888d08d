"""harness/worker.py: the inside of eval_harness.py's worker processes, where a task's reference and a candidate run.

Nothing here runs in the caller's process. The zygote (harness.processes.Zygote, booted by harness.processes.BOOT)
imports this module once and calls zygote_main; every worker is forked from that zygote, runs _worker_main and
exactly one job, and is killed with its process group: "evaluate" (one candidate in five stages, _job_evaluate: the
reference's trials, the instrumentation and the candidate's import, correctness trials, kernel coverage, timing),
"serve" (a task's reference server: its trials made once, shared with its candidates, their outputs compared
there), "compile" (GPU mode's CPU stage) and "lint" (the task quality rules). The parent side is eval_harness.py (verdicts,
the public API, and the pitfalls table that the checks here implement, in its docstring) and harness/processes.py
(pools, the GPU gate, memory admission, time limits).

The worker side in four files, this one the stages and the jobs; the mechanisms they use, each one read on its own:
  harness/compare.py          outputs against the reference's, inputs against their copies, the fingerprints of the
                              reference outputs kept on the GPU; few host reads
  harness/instrumentation.py  what is installed before the candidate's import and verified after every phase: the op
                              recorder, the launch counter, the allocator poison, the identity snapshot
  harness/timing.py           the timing rule: CUDA graphs, interleaved reps, L2 flush, adaptive rep count

A job's answer is a verdict, a KernelResult (harness/verdict.py) that verdict() builds here: the pipe carries that
object to the parent's run_job, which adds its timings, and the caller gets it (a lint job's answer is its report).

Import direction: the worker side imports eval_harness (the options and tolerances it applies, format_exception),
harness.verdict (KernelResult, verdict, truncate) and harness.processes (memory_need, and the worker's end of
run_job's requests: gpu_turn, pass_turn, yield_turn, ask_memory); none of them imports it, harness.processes only
names this module in its zygote's boot string. So there is no import cycle, the caller's process never loads the
worker's code, and a baseline harness loaded from another directory (bench.py's _harness_module) runs that
directory's workers.

A candidate runs in this process, so every one of these modules is the harness to it: the static check bans
importing any of them and assigning into it (harness.static_checks.HARNESS_MODULES), and the identity snapshot
covers the functions of all of them (harness.instrumentation._harness_snapshot), checked after every candidate
phase (pitfall 6).

Nothing to run here: eval_harness.py's API and CLI start the workers (harness/README.md).
"""
from __future__ import annotations
import collections
import contextlib
import gc
import importlib.util
import multiprocessing
import multiprocessing.reduction
import os
import re
import signal
import sys
import threading
import time
import traceback
import warnings
from multiprocessing.connection import Connection

import torch

from eval_harness import DEFAULTS, LINT_MAX_INPUT_MB, LINT_MIN_GPU_MS, TOLERANCES, format_exception
from harness.compare import (compare, copy_out, fingerprint_sums, heavy_tol, host_ints, is_float, nbytes,
                             output_problem, output_spec, outputs_intact, same, share, tensors, to_device,
                             tolerance, unchanged, unshare, within_kernels_reach)
from harness.instrumentation import Instrumentation, Transport
from harness.processes import ask_memory, gpu_turn, memory_need, pass_turn, served_need, yield_turn
from harness.timing import (median, median_ci_width, read_floor_ms, time_models, time_within_floor,
                            timing_rule, peak_bandwidth)
from harness.verdict import KernelResult, truncate, verdict


# ---------------------------------------------------------------------------------------------------------------------
# Inside the worker: start-up (zygote, worker, warm-up)

def _zygote_imports() -> None:
    """What a zygote does once for all its workers: the imports and first uses that cost seconds. Nothing here may
    touch the CUDA driver or start a thread (tests/test_harness_throughput.py checks both)."""
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


def zygote_main(fd: int) -> None:
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
    # the verdict's way out as it is before any candidate code runs, the write that sends it (_send_sealed), and the
    # seal's own machinery (_seal_parts)
    transport, write, parts = Transport(conn), os.write, _seal_parts()
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
    key = job.pop("key", None)   # (the result carries it: run_job rejects a result forged on the pipe without it)
    # KZ_WORKER_PROFILE=DIR: each job's own time under cProfile, one file per worker (bench.py harness
    # --round-profile merges them): where a verdict's seconds go, by function, waits for the GPU turn included
    profile_dir = os.environ.get("KZ_WORKER_PROFILE")
    if profile_dir:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    try:
        result = {"compile": _job_compile, "evaluate": _job_evaluate, "lint": _job_lint,
                  "serve": _job_serve}[job["kind"]](job, conn)
    except BaseException as e:   # a candidate escaping the per-phase handlers (e.g. SystemExit from a destructor)
        result = verdict(_classify(e), format_exception(e))
    if profile_dir:
        profiler.disable()
        with contextlib.suppress(OSError):
            profiler.dump_stats(os.path.join(profile_dir, f"{job['kind']}-{os.getpid()}.prof"))
    if result is None:   # (a reference server told to end)
        os._exit(0)
    result = _seal(result, transport, conn, parts)
    _send_sealed(("result", result, key), fd, write)
    os._exit(0)   # skip interpreter teardown (candidate finalizers); the parent kills the group anyway


def _seal_parts() -> tuple:
    """What _seal relies on, as it is before any candidate code runs: Transport's class dictionary, its functions'
    code, and harness.instrumentation's globals (Transport's methods use them). A class of the harness is reachable
    from object.__subclasses__(): Transport.changed replaced would see nothing."""
    module = sys.modules[Transport.__module__]
    own = dict(vars(Transport))
    return own, {k: v.__code__ for k, v in own.items() if type(v) is type(_seal_parts)}, module, dict(vars(module))


def _seal(result, transport: Transport, conn: Connection, parts: tuple):
    """The last check, after the last candidate code ran and right before the verdict is sent (pitfall 21): a
    candidate that reached the verdict's transport (Connection's methods, ForkingPickler, copyreg's dispatch table,
    KernelResult's pickling hooks: harness.instrumentation.Transport) could rewrite the genuine, keyed verdict on its
    way out. No candidate code runs from here on: its objects in reference cycles are finalized first (a __del__),
    signals are blocked and their Python handlers reset (a handler runs between any two bytecodes), and no other
    thread is switched to unless this one waits (a thread it started). What changed makes the verdict `reward_hack`
    ("transport"; a lint report not ok), and the transport is put back as it was, so that verdict goes out through
    the genuine one."""
    sys.setswitchinterval(1e6)
    signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    for signum in signal.valid_signals():
        with contextlib.suppress(ValueError, OSError, RuntimeError):
            if callable(signal.getsignal(signum)):
                signal.signal(signum, signal.SIG_DFL)
    gc.collect()
    gc.disable()
    own, codes, module, globs = parts   # the seal's own machinery first, put back before it is used
    changed = [f"Transport.{k}" for k in set(vars(Transport)) | set(own) if vars(Transport).get(k) is not own.get(k)]
    changed += [f"Transport.{k}.__code__" for k, code in codes.items() if own[k].__code__ is not code]
    changed += [f"{module.__name__}.{k}" for k, v in globs.items() if vars(module).get(k) is not v]
    for k in [k for k in vars(Transport) if k not in own]:
        delattr(Transport, k)
    for k, v in own.items():
        if vars(Transport).get(k) is not v:
            setattr(Transport, k, v)
    for k, code in codes.items():
        own[k].__code__ = code
    vars(module).update(globs)
    changed += transport.changed(conn)
    transport.restore(conn)
    if not changed or (isinstance(result, KernelResult) and result.error_kind == "reward_hack"):
        return result   # (a check that fired before stands: this one may only have seen the same patch again)
    message = f"the candidate changed how the verdict is sent to the harness: {', '.join(changed[:8])}"
    if isinstance(result, KernelResult):
        return _fail("reward_hack", message, dict(result.details), "transport", compiled=result.compiled,
                     compile_s=result.compile_s)
    return {**result, "ok": False, "problems": list(result.get("problems", [])) + [message]}


def _send_sealed(message, fd: int, write) -> None:
    """conn.send(message) as multiprocessing frames it (a 4-byte big-endian length, then the pickle), written whole
    with the os.write taken before the job: once pickled, no method is looked up again before the bytes are out."""
    data = bytes(multiprocessing.reduction.ForkingPickler.dumps(message))
    data = (len(data).to_bytes(4, "big", signed=True) if len(data) <= 0x7fffffff else
            (-1).to_bytes(4, "big", signed=True) + len(data).to_bytes(8, "big")) + data
    view = memoryview(data)
    while view:
        view = view[write(fd, view):]


def _warm_up_gpu_worker(backend: str) -> None:
    """First uses that cost seconds in a fresh process, paid while idle: the CUDA context, the CUDA graph machinery,
    for CUDA candidates the profiler behind _kernel_coverage (CUPTI start-up) and, for Triton, the JIT's own
    start-up and its first device query. Workers boot while others hold the GPU, so none of this launches a kernel:
    an empty profile, a Triton kernel compiled (warmup) but never run, and a CUDA graph captured and instantiated
    but never replayed."""
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


def _die_with_parent(parent: int) -> None:
    """If the caller dies (Ctrl-C, kill -9), take the process group down instead of leaving a hung candidate."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(0, signal.SIGKILL)


# ---------------------------------------------------------------------------------------------------------------------
# Inside the worker: verdicts, and a task or a candidate loaded as a module

_CUDA_FATAL = re.compile(r"CUDA error|illegal memory access|device-side assert|unspecified launch failure|"
                         r"CUBLAS_STATUS|misaligned address|cudaErrorLaunch")


def _classify(e: BaseException) -> str:
    """A sticky CUDA error poisons the context for good: that is a crash, not an ordinary runtime error."""
    return "crash" if _CUDA_FATAL.search(str(e)) else "runtime"


def _fail(kind: str, error: str, details: dict, check: str | None = None, **fields) -> KernelResult:
    """A failed verdict; `check` names the check that fired (always set for reward_hack)."""
    if check:
        details["check"] = check
        details["checks_fired"] = details.get("checks_fired", []) + [check]
    return verdict(kind, error, details=details, **fields)


def _since(clock: float) -> float:
    """Seconds since `clock` (time.monotonic()), for the per-stage times in details (ref_inputs_s, timing_s, ...)."""
    return round(time.monotonic() - clock, 3)


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
        self.served = "served" in job   # the trials are a reference server's: mapped here, compared there
        self.trials, self.ref_mutates, self.atol, self.rtol = [], False, None, None
        self.floor_ms = 0.0                                   # stage 1 too: the timing's bandwidth floor
        self.cand = self.instr = self.compile_s = None        # stage 2: the imported candidate
        self.cand_model = None                                # stage 3
        self.timing, self.timed_trials = {}, None             # stage 5: runtime_ms, ref_runtime_ms, speedup

    def failed(self, kind: str, error: str, check: str | None = None) -> KernelResult:
        """A verdict once the candidate has imported."""
        return _fail(kind, error, self.details, check, compiled=True, compile_s=self.compile_s)


def _gpu_memory_mb() -> list[int]:
    """[peak allocated, reserved] MiB of this process's caching allocator so far: what a job needs on its GPU (the
    reserved bytes include blocks cached for reuse; the CUDA context's own ~0.5-1 GB is in neither)."""
    return [round(torch.cuda.max_memory_allocated() / 2**20), round(torch.cuda.memory_reserved() / 2**20)]


def _job_evaluate(job: dict, conn: Connection) -> KernelResult:
    """One candidate's verdict. Each stage returns a failed verdict, or None to go on to the next one."""
    ev = _Evaluation(job, conn)
    for stage in (_load_reference, _build_candidate, _check_correctness, _check_coverage, _time_candidate):
        failed = stage(ev)
        if ev.device.type == "cuda":   # the process's GPU memory by the end of each stage (host-side counters)
            ev.details.setdefault("gpu_mb", {})[stage.__name__.strip("_")] = _gpu_memory_mb()
        if failed is not None:
            return failed
    hit = ev.instr.verify()   # (the last stage need not end with one: CPU mode's last candidate call was a trial's)
    if hit:
        return ev.failed("reward_hack", hit[1], hit[0])
    if ev.opts["compile_baseline"] and ev.timing:
        _compile_baseline(ev)
    return verdict("ok", compiled=True, compile_s=ev.compile_s, details=ev.details, **ev.timing)


# ---------------------------------------------------------------------------------------------------------------------
# Stage 1: the reference's trials (inputs and outputs), made before the candidate exists

def _meta_inputs(mod) -> list | None:
    """get_inputs() on the meta device: tensors with shapes and dtypes but no data (nothing is drawn or stored), or
    None where it cannot run there (it calls .cuda() or names a device)."""
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            inputs = list(mod.get_inputs())
        except Exception:
            return None
    return inputs if all(x.is_meta for x in inputs if isinstance(x, torch.Tensor)) else None


def _trial_bytes_on_meta(ref, opts: dict) -> tuple[int | None, int | None]:
    """Bytes of one trial's (inputs, outputs), from get_inputs() and the reference's forward run on the meta device
    (shapes and dtypes only: no data is made, nothing is computed). Inputs None if get_inputs() cannot run there (it
    calls .cuda() or names a device); outputs None if the forward cannot (an op without a meta kernel, a value read
    on the host): memory_need then takes them as large as the inputs. A reduction's outputs are far smaller (a 256
    MB task's estimate halves), an upsampling's larger (an estimate below the peak costs an out-of-memory rerun)."""
    size = 2 if opts["dtype"] in ("float16", "bfloat16") else None

    def nbytes(xs) -> int:
        return sum(x.numel() * (size if size and x.is_floating_point() else x.element_size()) for x in xs)
    inputs = _meta_inputs(ref)
    if inputs is None:
        return None, None
    with torch.device("meta"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.no_grad():
                outputs = tensors(ref.Model(*ref.get_init_inputs())(*inputs))
            per_output = nbytes(outputs) if outputs and all(x.is_meta for x in outputs) else None
        except Exception:
            per_output = None
    return nbytes(x for x in inputs if isinstance(x, torch.Tensor)), per_output


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
            details["inputs_on_device_failed"] = truncate(format_exception(e), 300)
            return _trial_inputs(ref, opts, details)
        inputs = [x.to(dtype) if dtype and is_float(x) else x for x in inputs]
        if heavy:
            if not any(is_float(x) for x in inputs):
                break
            inputs = [x * torch.exp(torch.randn_like(x)) if is_float(x) else x for x in inputs]
        out.append((inputs, heavy))
        if t == 0:   # official KernelBench inputs reach GBs: keep the host copies bounded (outputs: _make_trials)
            n = _cap_trials(n, nbytes(inputs), opts, details)
    return out


def _cap_trials(n: int, per_trial: int, opts: dict, details: dict) -> int:
    fit = int(opts["max_trial_gb"] * 2**30 // max(per_trial, 1)) - 1   # - 1: the heavy trial
    if fit < n:
        n = max(1, fit)
        details["trials_capped"] = n
    return n


def _make_trials(ref_model, draws: list, device, opts: dict, details: dict, store="cpu",
                 between=None, measure: bool = False) -> tuple[list, bool]:
    """Reference outputs for every (inputs, heavy) draw of _trial_inputs, computed before the candidate exists; inputs
    and outputs kept on `store` (the GPU when the inputs were made there). Skips normal draws once inputs and outputs
    together would exceed max_trial_gb, and the heavy one if the reference is not finite on it. Returns (trials,
    whether the reference mutates its inputs). Outputs kept on the GPU get a fingerprint (trial["fp"]): a
    candidate's kernel can write to any device address in its process (an out-of-bounds store finds the caching
    allocator's other blocks), so outputs_intact checks them before a verdict stands; rewriting stored inputs only
    makes the candidate's own outputs disagree. `between()`, if given, runs before every draw but the first (a
    waiting timer gets the GPU there). `measure` (a reference server, on a GPU): details["ref_work_bytes"], the most
    a forward allocated beyond its output (the allocator's peak counter, reset before each forward)."""
    key = int.from_bytes(os.urandom(8), "little")   # the fingerprints' weights: unknown to the candidate
    trials, pending = [], []   # pending: (trial, its fingerprint sums still on the device)
    # read at the end with the fingerprints, in one host read: inputs the reference left as they were, and whether
    # it was finite on the heavy-tailed draw (the last one)
    untouched, finite = [], []
    allowed = sum(not heavy for _, heavy in draws)   # normal trials; lowered once the first output's size is known
    for i, (inputs, heavy) in enumerate(draws):
        if not heavy and len(trials) >= allowed:
            continue
        if i and between is not None:
            between()
        args = to_device(inputs, device)
        if measure:
            held = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        with torch.no_grad():
            produced = ref_model(*args)
        if measure:   # (an output that is an input, or a view of one, was not allocated: never below 0)
            work = torch.cuda.max_memory_allocated(device) - held - nbytes(tensors(produced))
            details["ref_work_bytes"] = max(details.get("ref_work_bytes", 0), work, 0)
        out = copy_out(produced, store)
        if heavy:
            finite = [torch.isfinite(o).all() for o in tensors(produced) if o.is_floating_point()]
        untouched += [unchanged(a, x, device) for a, x in zip(args, inputs)]   # (where made: no host-side scan)
        del args, produced
        trials.append({"inputs": [x.to(store) if isinstance(x, torch.Tensor) else x for x in inputs],
                       "out": out, "heavy": heavy, "draw": i})
        if within_kernels_reach(out):
            pending.append((trials[-1], fingerprint_sums(out, key)))
        if len(trials) == 1:
            allowed = _cap_trials(allowed, nbytes(inputs) + nbytes(tensors(out)), opts, details)
    flags = untouched + [f.to(device) for f in finite]   # (the reference's outputs may sit elsewhere)
    values = iter(host_ints([s for _, trial_sums in pending for s in trial_sums] + flags))
    for trial, trial_sums in pending:   # on the host before the candidate exists: out of its kernels' reach
        trial["fp"] = (key, [next(values) for _ in trial_sums])
    mutates = not all([next(values) for _ in untouched])   # (lists: all() stops at the first False)
    if not all([next(values) for _ in finite]):
        trials.pop()   # (the heavy draw is the last one)
        details["heavy_trial"] = "skipped: the reference is not finite on heavy-tailed inputs"
    details["heavy_trial"] = details.get("heavy_trial", any(tr["heavy"] for tr in trials))
    return trials, mutates


def _reference(job: dict, conn: Connection, details: dict, turn: str, part: str = "all") -> tuple:
    """Load the task, make its trials and the reference outputs: (module, init_inputs, model, trials, mutates).
    Asks the parent for the memory this takes first (memory_need), then for its GPU turn. Other candidates may
    check correctness on this GPU meanwhile, none may time ("exclusive" turn: a rerun after an OOM). With
    inputs_on_device the inputs are made on the GPU inside the turn (milliseconds) and stay there
    (details["trials_on"]); on the host they are made before the turn (CPU work, seconds for a 256 MB task, and a
    timer waits for every holder). A reference that mentions cuda may put them on the GPU itself: turn first.
    `part`: the memory asked for (harness.processes.memory_need: "trials" for a reference server)."""
    device, opts = torch.device(job["device"]), job["opts"]
    on_device = device.type == "cuda" and opts["inputs_on_device"]
    mentions_cuda = "cuda" in job["ref_src"]
    clock = time.monotonic()
    ref = _load_module(job["ref_src"], "kz_reference")
    del sys.modules["kz_reference"]   # the candidate cannot find it by name
    # (not on meta where the reference names a device: it may put its tensors there itself)
    per_input, per_output = (None, None) if mentions_cuda else _trial_bytes_on_meta(ref, opts)
    host_bytes, device_bytes = memory_need(per_input, per_output, opts, device.type, on_device, part)
    ask_memory(conn, host_bytes, device_bytes, details)
    if device.type == "cuda":
        _reserve_device_memory(device_bytes, details)
    if on_device or mentions_cuda:
        gpu_turn(conn, turn)
    init_inputs = ref.get_init_inputs()
    draws = _trial_inputs(ref, opts, details, device if on_device else None)
    details["ref_inputs_s"] = _since(clock)
    if not (on_device or mentions_cuda):
        gpu_turn(conn, turn)
    clock = time.monotonic()
    ref_model = _build_model(ref.Model, init_inputs, device, opts)
    # a timer waiting for the GPU gets it between reference outputs too (as between a candidate's trials)
    between = (lambda: yield_turn(conn, device.type)) if turn == "shared" else None
    trials, ref_mutates = _make_trials(ref_model, draws, device, opts, details, device if on_device else "cpu",
                                       between, measure=part == "trials" and device.type == "cuda")
    details.update(ref_outputs_s=_since(clock), trials_on=device.type if on_device else "cpu")
    return ref, init_inputs, ref_model, trials, ref_mutates


def _reference_failed(e: Exception, details: dict) -> KernelResult:
    """Stage 1's verdict when the reference itself fails (a candidate's worker, or a reference server's)."""
    details["stage"] = "reference"
    return _fail(_classify(e), "the reference failed: " + format_exception(e), details)


def _load_reference(ev: _Evaluation) -> KernelResult | None:
    """Stage 1: the task's trials and reference outputs (_reference), before any candidate code exists in this
    process."""
    job, conn, details = ev.job, ev.conn, ev.details
    conn.send(("phase", "reference"))
    if ev.served:
        return _attach_reference(ev)
    try:
        ev.ref, ev.init_inputs, ev.ref_model, ev.trials, ev.ref_mutates = _reference(job, conn, details, ev.turn)
    except Exception as e:
        return _reference_failed(e, details)
    details["ref_mutates_inputs"] = ev.ref_mutates
    ev.atol, ev.rtol = tolerance(ev.trials[0]["out"], ev.opts)
    details.update(atol=ev.atol, rtol=ev.rtol)
    if ev.device.type == "cuda" and ev.opts["timing"]:
        ev.floor_ms = _bandwidth_floor_ms(ev.trials, ev.device, ev.opts)
    return None


def _bandwidth_floor_ms(trials: list, device, opts: dict) -> float:
    """The timing's floor (harness.timing.read_floor_ms): timing_floor of reading the first trial's inputs once at
    the GPU's peak bandwidth. Taken before the candidate is imported, so that nothing it patches (the device
    properties, harness.timing's table) can lower it."""
    return read_floor_ms(nbytes(trials[0]["inputs"]), peak_bandwidth(device), opts["timing_floor"])


def _attach_reference(ev: _Evaluation) -> KernelResult | None:
    """Stage 1 with a reference server (_job_serve): the task's trials are the server's, their inputs mapped into
    this process (not copied), the reference outputs left there (each trial is compared there: _compare_on_server).
    The reference module is still loaded here, for the init inputs, and on a GPU for the timing, where it runs
    beside the candidate (pitfall 15). The memory asked for is the candidate's part alone, counted from the
    reference's work where the server measured it (harness.processes.memory_need)."""
    job, conn, details, opts, device = ev.job, ev.conn, ev.details, ev.opts, ev.device
    clock = time.monotonic()
    try:
        ev.ref = _load_module(job["ref_src"], "kz_reference")
        del sys.modules["kz_reference"]   # the candidate cannot find it by name
        served = unshare(job["served"])
        on_device = device.type == "cuda" and served["details"].get("trials_on") == "cuda"
        # (a rerun after an out-of-memory asks for the bound: the count may have been what fell short)
        host_bytes, device_bytes = memory_need(served["per_input"], served["per_output"], opts, device.type,
                                               on_device, part="candidate",
                                               ref_work=None if job.get("alone") else
                                               served["details"].get("ref_work_bytes"))
        ask_memory(conn, host_bytes, device_bytes, details)
        if device.type == "cuda":
            _reserve_device_memory(device_bytes, details)
        gpu_turn(conn, ev.turn)
        ev.init_inputs = ev.ref.get_init_inputs()
        if device.type == "cuda" and opts["timing"]:   # (only the timing runs the reference here)
            ev.ref_model = _build_model(ev.ref.Model, ev.init_inputs, device, opts)
    except Exception as e:
        return _reference_failed(e, details)
    ev.trials = [{"inputs": inputs, "heavy": heavy, "spec": spec}
                 for inputs, heavy, spec in zip(served["inputs"], served["heavy"], served["spec"])]
    ev.ref_mutates, ev.atol, ev.rtol, ev.floor_ms = (served[k] for k in ("mutates", "atol", "rtol", "floor_ms"))
    details.update(served["details"], reference_server=True, ref_attach_s=_since(clock),
                   ref_mutates_inputs=ev.ref_mutates, atol=ev.atol, rtol=ev.rtol)
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Stage 2: the instrumentation (harness/instrumentation.py), then the candidate's import

def _import_candidate(job: dict, send, details: dict) -> tuple:
    """Compile phase: install instrumentation, import the candidate (a CUDA extension builds here). Returns (the
    candidate's module or None, the instrumentation, the verdict: a failed one, or "ok" with its compile_s)."""
    instr = Instrumentation(job["backend"], job["device"], "kz_candidate",   # harness time: before the clock
                             job["ref_src"])                                 # starts
    send(("phase", "compile"))
    start = time.perf_counter()
    try:
        cand = _load_module(job["cand_src"], "kz_candidate")
    except SystemExit as e:
        return None, instr, _fail("compile", f"the candidate called sys.exit({e.code}) at import", details)
    except Exception as e:
        return None, instr, _fail(_classify(e) if _classify(e) == "crash" else "compile", format_exception(e), details)
    compile_s = time.perf_counter() - start
    if instr.builds:
        details["builds"] = [b.get("how") for b in instr.builds]
    if not isinstance(getattr(cand, "ModelNew", None), type):
        return None, instr, _fail("format", "the candidate defines no class ModelNew", details, compiled=True)
    hit = instr.verify()
    if hit:
        return None, instr, _fail("reward_hack", hit[1], details, hit[0], compiled=True, compile_s=compile_s)
    return cand, instr, verdict("ok", compiled=True, compile_s=compile_s, details=details)


def _build_candidate(ev: _Evaluation) -> KernelResult | None:
    """Stage 2: the instrumentation installed, then the candidate imported (a CUDA extension builds here)."""
    ev.cand, ev.instr, imported = _import_candidate(ev.job, ev.conn.send, ev.details)
    if ev.cand is None:
        return imported
    ev.compile_s = imported.compile_s
    ev.conn.send(("phase", "run"))
    ev.instr.conn = ev.conn   # (Triton's JIT compiles announce themselves: jit_timeout)
    if ev.turn == "shared":   # Triton JIT compiles give it back meanwhile (off_gpu), and each trial may (yield_turn)
        ev.instr.turn = ev.conn
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Stage 3: correctness trials (the comparisons: harness/compare.py)

_REWRITTEN = "the reference outputs kept on the GPU changed while the candidate ran"


def _compare_on_server(conn: Connection, t: int, out, spec, device, untouched: list) -> tuple:
    """compare()'s answer for trial t from the reference server: what needs no values (container, types, storage,
    shapes) checked here against the output's spec, then the plain output tensors shared with the server (after
    the candidate's kernels are done), which compares them with the reference outputs it keeps; the parent relays
    the request and records the finding (harness.processes.JobRun). `untouched` is read here, as stats["read_with"]."""
    read_with = host_ints(untouched)
    problem = output_problem(out, spec, device)
    if problem:
        return (*problem, {"max_abs_err": 0.0, "max_rel_err": 0.0, "read_with": read_with})
    if device.type == "cuda":
        torch.cuda.synchronize()   # (every stream: the server reads the outputs as they are now)
    conn.send(("compare", t, share(out if isinstance(out, torch.Tensor) else list(out))))
    kind, check, message, stats = conn.recv()
    return kind, check, message, dict(stats, read_with=read_with)


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


def _check_correctness(ev: _Evaluation) -> KernelResult | None:
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
            pristine = to_device(trial["inputs"], device, copy=False)
            args = _refill(args, pristine)
            with instr.candidate_call():
                out = ev.cand_model(*args)
            hit = instr.verify()
            if hit:
                return ev.failed("reward_hack", hit[1], hit[0])
            # the inputs checked in the comparison's host read (one read per trial, not one per input more)
            untouched = [] if ev.ref_mutates else [unchanged(a, p, device) for a, p in zip(args, pristine)]
            if ev.served:   # (the reference outputs are the server's: compared there, the inputs read here)
                kind, check, message, stats = _compare_on_server(ev.conn, t, out, trial["spec"], device, untouched)
            else:
                kind, check, message, stats = compare(out, trial["out"], device,
                                                       *heavy_tol(trial, trials, ev.atol, ev.rtol), read_with=untouched)
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
                kind, _, message, _ = compare(again, copy_out(out, device), device, ev.atol, ev.rtol)
                if kind:
                    return ev.failed("mismatch", "two runs on the same inputs disagree: " + message,
                                     "nondeterministic")
                del again
            del out, pristine
        details.update(trials=len(trials), trials_s=_since(clock), poison_s=round(instr.poison_s, 3))
        if not outputs_intact(trials):
            return ev.failed("reward_hack", _REWRITTEN, "reference_outputs")
    except Exception as e:
        return ev.failed(_classify(e), format_exception(e))
    except SystemExit as e:
        return ev.failed("runtime", f"the candidate called sys.exit({e.code})")
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Stage 4: the candidate's own kernels did the work

def _kernel_coverage(model, inputs: list, device, instr: Instrumentation) -> dict:
    """Profile one forward: which GPU kernels ran, and the share of kernel time spent in the candidate's own."""
    from torch.profiler import ProfilerActivity, profile
    own_names = set(instr.launches)   # Triton kernel names
    for build in instr.builds:        # CUDA: the __global__ functions in the load_inline sources
        for src in build["cuda_sources"]:
            src = re.sub(r"__launch_bounds__\s*\([^)]*\)", "", src)
            own_names |= set(re.findall(r"__global__[^(;{]*?(\w+)\s*\(", src))
    args = to_device(inputs, device)
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


def _check_coverage(ev: _Evaluation) -> KernelResult | None:
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
            return ev.failed(_classify(e), format_exception(e))
        details.update(coverage, coverage_s=_since(clock))
        if not coverage["own_kernels"]:
            return ev.failed("reward_hack", f"none of the candidate's kernels ran on the GPU (kernels seen: "
                             f"{', '.join(coverage['kernels'][:5]) or 'none'})", "kernel_not_launched")
    if instr.ops:
        ops = ", ".join(f"{k} x{v}" for k, v in instr.ops.most_common(8))
        return ev.failed("reward_hack", f"forward computes with PyTorch ops: {ops}", "pytorch_fallback")
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Stage 5: timing (GPU only; the rule: harness/timing.py)

def _time_candidate(ev: _Evaluation) -> KernelResult | None:
    """Stage 5 (GPU only): reference and candidate timed interleaved (time_models), then the checks that timing
    gives a candidate new chances to fool: the snapshot, the stored reference outputs, the ops of the captured
    forward and the spot-checked outputs."""
    if not (ev.device.type == "cuda" and ev.opts["timing"]):
        return None
    instr, details, opts, device, trials, conn = ev.instr, ev.details, ev.opts, ev.device, ev.trials, ev.conn
    instr.turn = None   # (what follows launches no JIT: the trials ran every kernel)
    clock = time.monotonic()
    if ev.served:   # the spot checks' reference outputs, for the two input sets timed: made here, now
        try:
            trials, _ = _make_trials(ev.ref_model, [(tr["inputs"], tr["heavy"]) for tr in trials[:2]], device,
                                     opts, {}, device)
        except Exception as e:
            return ev.failed(_classify(e), "the reference failed before timing: " + format_exception(e))
    # the aten ops recorded so far: the forward captured for timing must add none. (Its launches are not
    # re-checked: a legitimate candidate may launch its compiled kernel past the counter after the first call.)
    ops = collections.Counter(instr.ops)
    timed = instr.recorded_when_captured(ev.cand_model)
    # input copies, graph captures and warm-up under the shared turn, the timed reps alone, and the checks after
    # them shared again (a job that holds the GPU alone throughout, a rerun after an out-of-memory, keeps it)
    alone = (lambda: gpu_turn(conn, "exclusive"))
    shared = (lambda: gpu_turn(conn, "shared")) if ev.turn == "shared" else None
    floor_ms = ev.floor_ms   # (a median below it is not believed: _bandwidth_floor_ms)
    try:
        times = time_within_floor({"ref": ev.ref_model, "cand": timed}, trials, device, opts["timing_budget_s"],
                                   "cand", floor_ms, tol=(ev.atol, ev.rtol), exclusive=alone, after=shared,
                                   **timing_rule(opts))
    except Exception as e:
        return ev.failed(_classify(e), format_exception(e))
    hit = instr.verify()
    if hit:
        return ev.failed("reward_hack", hit[1], hit[0])
    if not times["ref_intact"] or not outputs_intact(trials):
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
    details["read_floor_ms"] = floor_ms
    if times["below_floor"]:
        return ev.failed("reward_hack", f"median {median(cand_ms) * 1e3:.2f} us (timed eagerly) is below the "
                         f"bandwidth floor of {floor_ms * 1e3:.2f} us (timing_floor={opts['timing_floor']:g} of "
                         f"reading the inputs once at the GPU's peak bandwidth)", "below_bandwidth_floor")
    details.update(timing_s=_since(clock), timing_method=times["method"], reps=len(cand_ms), ref_reps=len(ref_ms),
                   median_ci=round(median_ci_width(cand_ms), 4), ref_median_ci=round(median_ci_width(ref_ms), 4),
                   mean_ms=sum(cand_ms) / len(cand_ms), ref_mean_ms=sum(ref_ms) / len(ref_ms),
                   host_median_ms=median(times["host"]))
    if "graph_fallback" in times:
        details["graph_fallback"] = times["graph_fallback"]
    ev.timing = dict(runtime_ms=median(cand_ms), ref_runtime_ms=median(ref_ms),
                     speedup=median(ref_ms) / max(median(cand_ms), 1e-9))
    ev.timed_trials = trials   # (the compile baseline's inputs: _compile_baseline)
    return None


def _compile_baseline(ev: _Evaluation) -> None:
    """details["compile_baseline_ms"]: torch.compile(reference) timed on the timing's inputs (the option
    compile_baseline). After the last check of the candidate: torch.compile starts threads, and dynamo patches
    torch.nn.Module.__init__ and __setstate__ (torch._dynamo.mutation_guard), which the identity snapshot would read
    as the candidate's patch of what the reference calls. No candidate code runs here."""
    conn, opts = ev.conn, ev.opts
    try:
        compiled = torch.compile(ev.ref_model)
        ms = median(time_models({"compiled": compiled}, ev.timed_trials, ev.device, opts["timing_budget_s"],
                                exclusive=lambda: gpu_turn(conn, "exclusive"),
                                after=(lambda: gpu_turn(conn, "shared")) if ev.turn == "shared" else None)["compiled"])
        ev.details.update(compile_baseline_ms=ms, speedup_vs_compile=ms / max(ev.timing["runtime_ms"], 1e-9))
    except Exception as e:   # the baseline is optional: report, do not fail the candidate
        ev.details["compile_baseline_error"] = truncate(format_exception(e), 300)


# ---------------------------------------------------------------------------------------------------------------------
# The other jobs: serve (a task's reference server), compile (GPU mode's CPU stage) and lint (task quality rules)

def _job_serve(job: dict, conn: Connection) -> KernelResult | None:
    """A task's reference server (eval_harness's reference_server; harness.processes.ReferenceServer is the parent's
    side): the task's trials made once, as stage 1 makes them (_reference), their inputs shared with the task's
    candidates (CUDA IPC handles; shared memory on the host: harness.compare.share), their outputs compared here,
    where the reference outputs stay. Returns a verdict only if the reference fails; else it sends ("served", trial
    count) and answers the parent until it is ended:
      ("share",)                     -> the trials pickled for one candidate's job, their tensors shared
      ("compare", t, shared outputs) -> compare()'s (error_kind, check, message, stats) against trial t
      ("intact",)                    -> (whether every trial's inputs still have their fingerprint, whether they
                                        are as made now: changed ones are drawn again from their seeds)
      ("end",)                       -> returns None (nothing to send: the worker exits)
    No candidate code runs here: a candidate's kernel can still write to the inputs mapped into its process, hence
    the fingerprints (keyed, like the reference outputs' kept on the GPU: harness.compare.fingerprint_sums)."""
    details, device, opts = {}, torch.device(job["device"]), job["opts"]
    conn.send(("phase", "reference"))
    try:
        ref, _, _, trials, mutates = _reference(job, conn, details, "shared", part="trials")
    except Exception as e:
        return _reference_failed(e, details)
    atol, rtol = tolerance(trials[0]["out"], opts)
    floor_ms = _bandwidth_floor_ms(trials, device, opts) if device.type == "cuda" and opts["timing"] else 0.0
    key = int.from_bytes(os.urandom(8), "little")

    def fingerprints() -> list[int]:
        return host_ints([s for tr in trials for s in fingerprint_sums(tensors(tr["inputs"]), key)])
    made = fingerprints()
    tols = [heavy_tol(tr, trials, atol, rtol) for tr in trials]   # (each trial's, read once for every candidate)
    pass_turn(conn, device.type, "none")   # the trials are made: the GPU is the candidates' (a comparison runs in
                                           # their turn)
    served = {"inputs": [tr["inputs"] for tr in trials], "heavy": [tr["heavy"] for tr in trials],
              "spec": [output_spec(tr["out"]) for tr in trials], "mutates": mutates, "atol": atol, "rtol": rtol,
              "floor_ms": floor_ms, "per_input": nbytes(trials[0]["inputs"]),
              "per_output": nbytes(tensors(trials[0]["out"])),
              "details": {k: details[k] for k in ("trials_on", "trials_capped", "heavy_trial", "ref_inputs_s",
                                                  "ref_outputs_s", "inputs_on_device_failed", "ref_work_bytes")
                          if k in details}}
    # the bytes it keeps from now on (harness.processes.served_need): the parent frees the rest of its admission
    stored = sum(nbytes(tr["inputs"]) + nbytes(tensors(tr["out"])) for tr in trials)
    keep = served_need(stored, served["per_input"], served["per_output"])
    host = stored if details["trials_on"] != "cuda" else 0   # (the parent adds both up where there is no GPU)
    # and what one candidate attached to them asks for (as _attach_reference counts it): the parent serves only if
    # the trials kept and one candidate fit its budget together
    candidate = memory_need(served["per_input"], served["per_output"], opts, device.type,
                            details["trials_on"] == "cuda", part="candidate", ref_work=details.get("ref_work_bytes"))
    conn.send(("served", len(trials), host, keep - host, *candidate))
    while True:
        request = conn.recv()
        if request[0] == "share":   # (pickled for each candidate: each pickling counts one more user of the memory)
            conn.send(share(served))
        elif request[0] == "compare":
            trial = trials[request[1]]
            try:
                out = unshare(request[2])
                found = compare(out, trial["out"], device, *tols[request[1]])
            except Exception as e:   # (outputs that cannot be mapped or compared: the finding says so)
                found = ("runtime", None, "the reference server could not compare: " + format_exception(e), {})
            out = None   # (unmapped: the candidate's process may end)
            conn.send(found)
        elif request[0] == "intact":
            intact = fingerprints() == made
            if not intact:   # drawn again with the same seeds, written into the same memory (what candidates map)
                with contextlib.suppress(Exception):   # (where they were drawn: the device, or the host)
                    on_device = details["trials_on"] == "cuda" and "inputs_on_device_failed" not in details
                    draws = _trial_inputs(ref, opts, {}, device if on_device else None)
                    for tr in trials:
                        for x, y in zip(tr["inputs"], draws[tr["draw"]][0]):
                            if isinstance(x, torch.Tensor):
                                x.copy_(y)
                    del draws
            conn.send((intact, intact or fingerprints() == made))
        else:
            return None


def _job_compile(job: dict, conn: Connection) -> KernelResult:
    """GPU mode's first stage on a CPU worker: build/import only, so the GPU stage finds a cache hit."""
    cand, instr, imported = _import_candidate(job, conn.send, {})
    return imported


def _repeatable(a, b) -> bool:
    """Two runs of a task on the same inputs agree: bit for bit, or for floats within a tenth of the candidates'
    tolerance (a CPU GEMM's first and second calls can differ by ~1e-6 relative; such noise cannot flip a verdict,
    while randomness differs by O(1))."""
    if same(a, b):
        return True
    tol = TOLERANCES.get(str(a.dtype).removeprefix("torch."), 1e-4) / 10 if a.is_floating_point() else None
    return tol is not None and a.shape == b.shape and torch.allclose(a, b.to(a.device), rtol=tol, atol=tol,
                                                                     equal_nan=True)


def _job_lint(job: dict, conn: Connection) -> dict:
    """Task quality rules (pitfall 8, degenerate tasks); the module is untrusted, hence a worker."""
    conn.send(("phase", "reference"))
    gpu_turn(conn, "shared")
    device, opts = torch.device(job["device"]), job["opts"]
    report = {"ok": False, "problems": [], "eager_ms": None, "input_mb": None}
    problems, limit_mb = report["problems"], opts.get("max_input_mb", LINT_MAX_INPUT_MB)
    try:
        mod = _load_module(job["src"], "kz_task")
        missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if not hasattr(mod, n)]
        if missing:
            problems.append(f"missing {', '.join(missing)}")
            return report
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs()).to(device)
        # Inputs over the limit make the module invalid whatever else it does. Where get_inputs() runs on the meta
        # device their size comes from shapes alone, and such a module is neither drawn nor run: drawing gigabytes
        # on the host and running them three times is time that the whole round's lint waits for
        meta = _meta_inputs(mod)
        report["input_mb"] = None if meta is None else nbytes(meta) / 2**20
        if report["input_mb"] is None or report["input_mb"] <= limit_mb:
            torch.manual_seed(1)
            inputs = list(mod.get_inputs())
            report["input_mb"] = nbytes(inputs) / 2**20
    except BaseException as e:
        problems.append("does not load: " + format_exception(e))
        return report
    if report["input_mb"] > limit_mb:
        problems.append(f"inputs take {report['input_mb']:.0f} MB (limit {limit_mb} MB)")
        return report
    try:
        pristine = to_device(inputs, device)
        times, outs = [], []

        def run():
            args = [x.clone() if isinstance(x, torch.Tensor) else x for x in pristine]
            start = time.perf_counter()
            with torch.no_grad():
                outs.append(copy_out(model(*args)))
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - start) * 1e3)

        def disagree(i, j):
            return [(a, b) for a, b in zip(tensors(outs[i]), tensors(outs[j])) if not _repeatable(a, b)]

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
        problems.append("does not run: " + format_exception(e))
        return report
    if differ:
        a, b = differ[0]
        how = ""
        if a.shape == b.shape and a.is_floating_point():   # (what the difference looked like, for a report)
            gap = (a.double() - b.double()).abs().nan_to_num(float("inf"))
            how = f" ({int((gap > 0).sum())} of {a.numel()} values, max abs difference {float(gap.max()):.3g})"
        problems.append("not deterministic: the same inputs gave different outputs" + how)
    if device.type == "cuda":
        gpu_turn(conn, "exclusive")
        with torch.no_grad():
            report["eager_ms"] = min(_lint_gpu_ms(model, pristine) for _ in range(3))
        floor_ms = opts.get("min_gpu_ms", LINT_MIN_GPU_MS)
        if report["eager_ms"] < floor_ms:
            problems.append(f"eager time {report['eager_ms'] * 1e3:.0f} us < {floor_ms * 1e3:.0f} us: launch "
                            f"overhead would dominate")
    else:
        report["eager_ms"] = min(times)
        if report["eager_ms"] > opts.get("max_cpu_ms", 5000):
            problems.append(f"eager time on the CPU {report['eager_ms'] / 1e3:.1f} s > {opts.get('max_cpu_ms', 5000) / 1e3:.0f} s")
    atol, rtol = tolerance(outs[0], dict(DEFAULTS, **{k: opts.get(k) for k in ("atol", "rtol")}))
    first_float = next((x for x in inputs if is_float(x)), None)
    for i, r in enumerate(tensors(outs[0])):
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
