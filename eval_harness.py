"""eval_harness.py: verifies and times candidate GPU kernels for KernelZero (CUDA via load_inline, Triton via JIT).

A task is a KernelBench problem file (`class Model`, `get_inputs()`, `get_init_inputs()`); a candidate defines
`class ModelNew` with the same constructor and forward signature. `evaluate(ref_src, cand_src)` returns a
`KernelResult` whose `error_kind` is one of ERROR_KINDS; `Evaluator.map(pairs)` does the same for a batch, building
CUDA candidates on CPU workers in parallel, checking a few candidates at once on each GPU and timing one at a time.

The harness's files, split where a reader would look
  eval_harness.py (this file) is the caller's side: options, extract_code, the static checks' verdicts (their rules,
  parse only, are harness/static_checks.py), the public API (Evaluator, evaluate, lint_tasks) and the CLI.
  harness/verdict.py is what a verdict is: a KernelResult (re-exported here), the one typed object that the worker
  builds, its pipe carries, harness.processes checks (a forged one is a reward hack) and the caller gets.
  harness/processes.py is how the caller's side runs work in processes: worker pools and their zygotes, the GPU gate
  and memory admission, running one job under its time limits (run_job, a small state machine).
  harness/worker.py is everything that runs inside a worker process: start-up (zygote, worker, warm-up), the five
  stages of a candidate's evaluation (reference trials, instrumentation and import, correctness, kernel coverage,
  timing), and the compile and lint jobs. The stages' mechanisms are files of their own: harness/compare.py
  (outputs, inputs, fingerprints), harness/instrumentation.py (op recorder, launch counter, allocator poison,
  identity snapshot) and harness/timing.py (the timing rule). The worker side imports this module (options,
  tolerances, format_exception), harness.verdict and harness.processes; none of them imports it (only the zygotes
  do, through harness.processes.BOOT), so there is no import cycle and the caller's process never loads the worker's
  code. The pitfall checks below are implemented there unless they say "static check" (harness/static_checks.py).

What the process isolation protects, and what it does not
  Every candidate runs in its own fresh Python process, in its own session (process group), used for exactly one
  candidate and then killed with its whole group. Workers are forked from a per-pool zygote that imported torch and
  triton once and never touched CUDA or ran a candidate: a worker starts in milliseconds, from a state no candidate
  has been in. This protects the *evaluation*: a hang becomes
  `timeout`, a segfault / abort / illegal memory access becomes `crash`, a poisoned CUDA context dies with its
  process, a memory bomb hits an address-space limit (CPU mode), and nothing one candidate leaves behind (patched
  functions, threads, cached tensors) reaches the next one or the caller. It is NOT a security sandbox: candidates
  run with the user's rights and can read/write files, open sockets or escape the process group on purpose. The
  anti-reward-hacking checks target the known ways a *model* games kernel benchmarks
  (the public record: KernelBench issues, Sakana's AI CUDA Engineer, METR, robust-kbench), not a determined human
  attacker. Run untrusted code in a container. The known tricks ("pitfall #N" in the code; each has a test):
   1 stale memory (return empty_like, get the reference's old output): run first on NaN-poisoned memory
   2 input mutation: own clones per call, inputs compared after it
   3 side streams: a device-wide synchronize before the end event
   4 threads: static check and thread count
   5 lazy tensors: outputs must be plain torch.Tensor with real storage
   6 monkey-patching torch, timers or the harness (any of its modules, its classes' methods, a function's code
     swapped in place): identity snapshot, separate processes
   7 result caching by data_ptr/id: fresh inputs per trial
   8 degenerate tasks: the task linter
   9 analytic shortcuts: a heavy-tailed extra trial
  10 precision downgrade: TF32 flags checked, per-dtype tolerance
  11 PyTorch fallback or decoy kernel: launch counts (Triton), profiler coverage (CUDA), static check; the forward
     captured for graph timing has its aten ops recorded (a candidate cannot switch to PyTorch while timed)
  12 shared namespace: reference and candidate are separate modules, inputs made first
  13 nondeterminism and races: run twice, compare
  14 integer targets cast to float: only floating tensors are cast
  15 baseline mismatch: the reference timed the same way, interleaved, in the same process
  16 hangs, crashes, poisoned CUDA contexts: one killable process per candidate
  17 (ours) the stored reference outputs read through the worker's frames or gc and copied: static check, and an
     audit hook on the candidate's own calls for frames and live objects (harness.instrumentation)
  18 (ours) a graph replay that does nothing: a kernel launched on the legacy default stream is not in the CUDA
     graph captured for timing, and where the output hardly depends on the inputs (a mean loss over random data)
     the output the capture left passes the replays' checks, so an empty graph is timed (323x): outputs poisoned
     before every checked replay, and a median below timing_floor of reading the inputs once at the GPU's peak
     bandwidth timed again eagerly, then reward_hack ("below_bandwidth_floor"; harness.timing)
  19 (ours) a verdict forged on the worker's pipe to the harness (os.write of a framed ("result", ok) message to
     its descriptor, before the real one): static check of raw descriptor I/O ("file_descriptors"), and run_job
     takes a result only with the key it sent with the job and only as the worker makes one (a KernelResult whose
     fields agree: harness.verdict.well_formed), phases only forward (one sent again would restart its clock: a
     loop of them never timed out), and every other message only in the shape the worker sends it
     ("forged_message", harness.processes.forged)
  20 (ours) the harness's sources rewritten on disk (the next Evaluator's workers import them: a comparison that
     always passes): static check of files opened to write, pathlib's writers, os.remove/rename/replace..., shutil
     ("writes_files"); in a CUDA candidate's C/C++ sources, file, descriptor and process calls (fopen, fstream,
     write, dup2, system...: harness.static_checks.native_check)
  21 (ours) the genuine, keyed verdict rewritten on its way out: the candidate shares its process with the pipe's
     machinery, and object.__subclasses__() reaches every class (multiprocessing's Connection, ForkingPickler, the
     harness's KernelResult), so a patched Connection.send, a reducer for KernelResult in copyreg.dispatch_table or
     a replaced io.BytesIO sends correct=True at 50x with the job's key (taken as ok until this check): static check
     of __subclasses__ and a closure's cells ("introspection") and of assignments into io, copyreg, pickle, struct
     ("monkeypatch"); at run time the identity snapshot covers the transport (harness.instrumentation.Transport:
     Connection's and ForkingPickler's class dictionaries and their functions' code and defaults, the module globals
     and builtins they use, KernelResult's pickling hooks, copyreg's and ForkingPickler's tables), checked after
     every phase and once more after the last candidate code ran (finalizers collected, signals blocked) and right
     before the verdict is sent; what changed is `reward_hack` ("transport"), the transport is put back, and the
     verdict is written whole with the os.write taken before the job (harness.worker._seal, _send_sealed)
  22 (ours) the shared inputs written (reference_server: a task's trial inputs are mapped into every candidate's
     process, and a kernel can write anywhere in its process's GPU memory, so one candidate could spoil another's
     trials): keyed fingerprints of every trial's inputs checked after each candidate, the inputs drawn again from
     their seeds if they changed, and every candidate attached meanwhile evaluated again on trials of its own
     (harness.processes.ReferenceServer.release)
  6 with 15: the reference is timed after the candidate's import, in its process, so a candidate that rebinds a
     torch function the reference calls could slow it and inflate its speedup; the static check follows import
     aliases only (not `_t = torch; _t.relu = slow`), so the identity snapshot also covers what the reference's
     source names: torch and torch.nn.functional functions, Tensor methods and operators, nn classes' own methods,
     and all of torch.nn.functional (harness.instrumentation._reference_reaches). Not covered: a torch function
     reached only inside another torch Python function. Closing that too: time the reference before the candidate
     exists.

How it departs from KernelBench's own eval (src/eval.py)
  1. One fresh process per candidate, separate compile and run timeouts and one per Triton JIT compile (KernelBench
     runs in the caller's process).
  2. All trial inputs and reference outputs are computed before the candidate is imported; the candidate cannot
     reach the reference module (separate module, removed from sys.modules). One extra trial multiplies floating
     inputs by a log-normal factor (heavier tails, shifted mean) to catch analytic shortcuts.
  3. The candidate's calls run on NaN-poisoned memory (deterministic mode's fill_uninitialized_memory, plus a NaN
     flood of the CUDA caching allocator), get their own input copies (mutation is detected), must return plain
     torch.Tensor objects, and must agree with themselves when run twice.
  4. Anti reward hacking (error_kind "reward_hack", details["check"] names the check): a static AST check, a check
     that the candidate's own kernels launch, a PyTorch-fallback check (aten ops seen by a TorchDispatchMode beyond
     a small allowlist of glue ops), a snapshot of the harness's own references (allclose, timers, TF32 flags, ...)
     verified after every candidate phase, and a thread count.
  5. Timing (GPU only): each model's forward is captured once as a CUDA graph and replayed between two CUDA events
     (no host latency inside the timed window; KernelBench calls the model between the events), eagerly with a
     device-wide synchronize when it cannot be captured, and reference and candidate always the same way
     (details["timing_method"]); a 256 MB L2 flush before every rep; reference and candidate interleaved in the
     candidate's process until both medians' 95% confidence intervals are within timing_ci (2%); spot checks of
     timed outputs, on poisoned graph outputs; a bandwidth floor (timing_floor). harness/README.md, "How a kernel is
     timed", has the whole rule.
  6. A task's trials are made once per GPU for all its candidates, in a worker of their own (reference_server; one
     per candidate in the other mode): candidates map the inputs (CUDA IPC, no copy) and their outputs are compared
     there, so the reference outputs never exist in a candidate's process (harness/README.md, "A task's reference
     server"). Memory is admitted first come, first served; a candidate that could fit only once another task's
     server has ended is deferred, and map runs the deferred ones last, task by task (official KernelBench's
     largest tasks take tens of GB each).
  7. Models keep their default (training) mode as in KernelBench (BatchNorm tasks use batch statistics); every call
     runs under torch.no_grad(). Tolerances per output dtype (TOLERANCES: fp32 1e-4, fp16/bf16 1e-2, atol = rtol).

Decisions worth knowing (each has a test; harness/README.md has GPU sharing, memory admission,
inputs on the GPU, deduplication and timing in full)
  - Verdict order: harness integrity (patched references, threads, input mutation) > runtime error > wrong output
    (mismatch) > own kernels not launched > PyTorch fallback. `correct` is exactly error_kind == "ok".
  - The PyTorch-fallback rule is strict: any aten op in forward outside harness.instrumentation._GLUE_OPS
    (allocation, views, copies, casts, cat/stack, padding) is a fallback, even a bias add; `.item()` loops count
    too. Ops run by Triton itself (launcher, interpreter, autotuner) are not recorded.
  - Input mutation is reward_hack (it fools the reference and skips an allocation), unless the reference mutates too.
  - Zygotes are started with subprocess.Popen, not multiprocessing: the environment (TRITON_INTERPRET,
    CUDA_VISIBLE_DEVICES) is set before anything is imported, and the caller's __main__ is not re-imported. A
    forked worker calls setsid() first, so the kill reaches its whole group; its zygote reaps it and reports its
    exit code (a segfault reads SIGSEGV). The zygote must never ask the CUDA driver anything (importing
    torch.utils.cpp_extension does): torch then refuses CUDA in every forked child.
  - CUDA builds: load_inline is routed to cuda_ext.build.fast_load_inline: a build directory keyed by
    sha256(arguments + torch/CUDA versions) under $KZ_CACHE_DIR (default ~/.cache/kernelzero), so cache hits across
    runs and no lock fights between different candidates; a precompiled header; torch's plain build as fallback.

Run it
  python eval_harness.py check REF.py CAND.py --backend triton --device cpu --json
  python eval_harness.py run --tasks kernelbench_tasks/level1 --solutions kernelbench_tasks/solutions/level1 --backend triton
  python eval_harness.py lint kernelbench_tasks/level1
"""
from __future__ import annotations
import argparse
import ast
import collections
import concurrent.futures
import contextlib
import copy
import dataclasses
import json
import os
import queue
import re
import sys
import threading
import traceback

import torch

from harness import static_checks
from harness.processes import (Gate, Memory, Pool, ReferenceServer, ServerFailed, gpu_budget_bytes,
                               gpu_lock_path, host_available_bytes, run_job, worker_env)
from harness.verdict import ERROR_KINDS, KernelResult, truncate, verdict


# ---------------------------------------------------------------------------------------------------------------------
# Results and options

# A verdict is a KernelResult (compiled, correct, error_kind of ERROR_KINDS, error, speedup, runtime_ms, ref_runtime_ms,
# compile_s, details): harness/verdict.py defines it, with verdict() that makes one and truncate(); the worker builds
# it, its pipe carries it, run_job adds the parent's timings to it, and the caller gets that same object.

# atol = rtol per output dtype, like KernelBench's current table; KernelBench v0/v0.1 used 1e-2 everywhere.
TOLERANCES = {"float64": 1e-4, "float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
DEFAULTS = dict(
    trials=5,                # random-input trials, each with its own seed (+1 heavy-tailed trial for float inputs)
    atol=None, rtol=None,    # None: the TOLERANCES entry of the reference output's dtype
    dtype=None,              # e.g. "float16": cast floating inputs and both models; None keeps the task's dtypes
    seed=0,                  # models are built after torch.manual_seed(seed); trial t uses seed + 1 + t
    timing=True,             # time reference and candidate (GPU only; CPU timing fields stay None)
    timing_budget_s=2.0,     # ceiling on the wall time of timing reps (fixed rule: the time spent, 30..300 reps)
    timing_adaptive=True,    # reps until every timed median's 95% confidence interval is within timing_ci, at
                             # most timing_budget_s or 300 reps; False: the fixed rule (the budget spent, 30..300)
    timing_graphs=True,      # time each model as a replayed CUDA graph of its forward (no host latency inside the
                             # timed window); a model that cannot be captured: all of them eagerly
    timing_ci=0.02,          # (adaptive) the interval's width relative to the median
    timing_min_reps=20,      # (adaptive) floor on reps per model (ceiling: 300 reps or timing_budget_s)
    timing_floor=0.5,        # a candidate median below this fraction of the time its task's inputs take to read once
                             # at the GPU's peak memory bandwidth is not believed: timed again eagerly, and still below
                             # it is reward_hack (check "below_bandwidth_floor"). 0: no floor; at most 1
    compile_baseline=False,  # also time torch.compile(reference) (details["compile_baseline_ms"])
    compile_timeout=None,    # import/build limit in s; None: 600 for CUDA (cold nvcc builds), 120 for Triton
    run_timeout=300.0,       # limit in s for the candidate's trials + timing
    jit_timeout=60.0,        # limit in s for each Triton JIT compile (within the phase's limit): one takes 0.3-5 s,
                             # but a kernel that unrolls into megabytes of PTX keeps ptxas busy for minutes, and its
                             # whole round or eval batch waits for it (measured: 5 min, the run limit, per such
                             # sample of the warm-started 0.5B). The verdict is `timeout` (details["jit"])
    ref_timeout=300.0,       # limit in s for loading the reference and computing its outputs
    memory_limit_gb=8.0,     # RLIMIT_AS of CPU-mode workers: a memory bomb fails instead of swapping the machine
    max_trial_gb=4.0,        # stored trial inputs + outputs, wherever they live; tasks above it get fewer trials
    inputs_on_device=True,   # on a GPU: get_inputs() runs under `with torch.device("cuda")` and the trial inputs
                             # stay there (ms instead of seconds of host randn + copies for a 256 MB task); False:
                             # made on the host (and the reference outputs kept there). No-op on the CPU
    reference_server=True,   # map(): a task with two or more candidates to run makes its trials once per GPU, in a
                             # worker of their own that keeps them (harness.processes.ReferenceServer): candidates
                             # map the inputs (CUDA IPC) and are compared there. False: each candidate's worker makes
                             # the trials itself. The verdicts are the same either way
    dedupe=True,             # map(): a candidate identical to an earlier one of the same task (same reference, same
                             # syntax tree) gets a copy of its verdict (details["duplicate_of"]) instead of a run
    gpu_max_connections=1,   # CUDA_DEVICE_MAX_CONNECTIONS of the GPU workers: hardware queues per CUDA context
                             # (the driver's default is 8). Every candidate's fresh process creates a context, and
                             # with one queue the driver creates and tears it down ~2.5x faster (71 against 176 ms
                             # per process, 8 at once, on an H200: bench.py harness --sections processes), which
                             # bounds a round. A worker's streams then share one queue (candidates may not make
                             # streams). None: the caller's environment as it is
    host_memory_gb=None,     # admission budget for host memory; None: 70% of MemAvailable when the pools start
    gpu_memory_gb=None,      # admission budget per GPU; None: 85% of its memory less the workers' CUDA contexts,
                             # less what this process reserved
)
FIXED_TIMING = {"timing_adaptive": False, "timing_graphs": False}   # the eager fixed-budget rule (bench.py compares)


def _check_options(opts: dict) -> None:
    """An unknown option name is a TypeError, a value the harness cannot use a ValueError: said by the caller, not
    found out inside every worker."""
    unknown = set(opts) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    floor = opts.get("timing_floor", DEFAULTS["timing_floor"])
    if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor <= 1:
        raise ValueError(f"timing_floor must be a number from 0 (no floor) to 1, not {floor!r}")


def format_exception(e: BaseException) -> str:
    """An exception as a verdict's error message: its type, message and last three frames (worker and parent side)."""
    frames = traceback.extract_tb(e.__traceback__)[-3:]
    where = "".join(f"  {os.path.basename(f.filename)}:{f.lineno} {f.line}\n" for f in frames)
    return f"{type(e).__name__}: {e}\n{where}".strip()


# ---------------------------------------------------------------------------------------------------------------------
# extract_code: the last fenced python block of a model's answer

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)```", re.S)


def extract_code(completion: str) -> str | None:
    """Last ```python block (a bare ``` block if there is none); None if there is no complete block."""
    if not completion:
        return None
    blocks = _FENCE.findall(completion)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    bare = [body for lang, body in blocks if lang == ""]
    picked = (python or bare or [""])[-1]
    return picked.strip("\n") if picked.strip() else None


# ---------------------------------------------------------------------------------------------------------------------
# Static checks (parent side: parse only, nothing is executed; the rules are in harness/static_checks.py)

def _precheck(cand_src: str | None, backend: str) -> KernelResult | None:
    """format / compile (syntax) / reward_hack verdicts that need no process; None if the candidate may run."""
    if cand_src is None or not cand_src.strip():
        return verdict("format", "no code")
    try:
        tree = ast.parse(cand_src)
    except SyntaxError as e:
        return verdict("compile", f"SyntaxError: {e.msg} (line {e.lineno})")
    except (RecursionError, MemoryError, ValueError) as e:
        return verdict("compile", f"unparseable source: {type(e).__name__}")
    problem = static_checks.backend_problem(tree, cand_src, backend)
    if problem:
        return verdict("format", problem)
    hit = static_checks.static_check(tree, static_checks.import_aliases(tree))
    if hit:
        check, message = hit
        return verdict("reward_hack", f"static check '{check}': {message}",
                       details={"check": check, "checks_fired": [check], "stage": "static"})
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Public API (parent side)

def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _unsupported_reason(backend: str, device: str) -> str | None:
    if backend not in ("cuda", "triton"):
        raise ValueError(f"backend must be 'cuda' or 'triton', not {backend!r}")
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        return "device 'cuda' requested but CUDA is not available on this machine (use device='cpu' with Triton)"
    if backend == "cuda" and device == "cpu":
        return ("the CUDA backend needs a GPU: CUDA kernels cannot run on the CPU (on a machine without a GPU "
                "use backend='triton', which runs under the Triton interpreter)")
    return None


def _same_code_key(src: str | None) -> str | None:
    """What makes two candidates the same program: their syntax trees (comments, blank lines and spacing do not
    count; string constants, CUDA sources among them, and docstrings do). A source that does not parse is its text."""
    if src is None:
        return None
    try:
        return ast.dump(ast.parse(src))
    except (SyntaxError, ValueError):
        return src


class Evaluator:
    """Evaluates many (ref_src, cand_src) pairs. CUDA on a GPU: builds on `cpu_workers` processes in parallel, then a
    fresh process per candidate on a GPU (a cache hit there). Up to `gpu_workers` candidates share a GPU while they
    check correctness, but each times alone (Gate): fair timing, and process start-up, reference inputs, Triton JIT
    and profiling of one candidate overlap with the others'. On the CPU: `cpu_workers` candidates at once."""

    def __init__(self, backend="triton", device=None, cpu_workers=None, gpus=None, progress=True, gpu_workers=8,
                 **opts):
        _check_options(opts)
        self.backend, self.device, self.progress = backend, device or _default_device(), progress
        self.opts = {**DEFAULTS, **opts}
        if self.opts["compile_timeout"] is None:
            self.opts["compile_timeout"] = 600.0 if backend == "cuda" else 120.0
        self.reason = _unsupported_reason(backend, self.device)
        self.cpu_workers = cpu_workers or max(1, len(os.sched_getaffinity(0)))
        if self.device == "cuda" and not self.reason:
            self.gpus = list(gpus) if gpus is not None else list(range(torch.cuda.device_count()))
        else:
            self.gpus = []
        if gpu_workers < 1:
            raise ValueError(f"gpu_workers must be >= 1, not {gpu_workers}")
        self.gpu_workers = gpu_workers
        self.spare = None   # idle workers kept per pool (None: one more than run at once); evaluate() uses 0
        self.pools, self.gates, self.start_lock, self.memory = None, {}, threading.Lock(), None
        self.limits = {"startup": 300.0, "reference": self.opts["ref_timeout"],
                       "compile": self.opts["compile_timeout"], "run": self.opts["run_timeout"],
                       "jit": self.opts["jit_timeout"]}

    def _start(self) -> None:
        with self.start_lock:   # map() and holding_gpus() may be first from different threads
            if self.pools is None:
                self._start_pools()

    def _start_pools(self) -> None:
        threads = max(1, len(os.sched_getaffinity(0)) // self.cpu_workers)
        cpu_env = worker_env(self.device, self.backend, self.opts, "compile" if self.gpus else "run", threads=threads)
        if self.gpus and self.backend == "cuda" and "TORCH_CUDA_ARCH_LIST" not in cpu_env:
            major, minor = torch.cuda.get_device_capability(self.gpus[0])   # build for this GPU only
            cpu_env["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
        cpu_spare = self.cpu_workers if self.spare is None else self.spare
        if self.gpus and self.backend == "triton":   # Triton on a GPU has no CPU stage: boot no idle CPU workers
            cpu_spare = 0
        self.pools = {"cpu": Pool(cpu_env, cpu_spare)}
        host = self.opts["host_memory_gb"]
        gpu_bytes = {}
        gpu_spare = 2 * self.gpu_workers if self.spare is None else self.spare   # idle GPU workers per GPU
        for gpu in self.gpus:
            budget = self.opts["gpu_memory_gb"]
            if budget is None:
                own = torch.cuda.memory_reserved(gpu) if torch.cuda.is_initialized() else 0
                budget = gpu_budget_bytes(torch.cuda.get_device_properties(gpu).total_memory,
                                          self.gpu_workers + gpu_spare, own) / 2**30
            gpu_bytes[gpu] = budget * 2**30
        self.memory = Memory(host * 2**30 if host is not None else 0.7 * host_available_bytes(), gpu_bytes)
        gpu_threads = max(1, len(os.sched_getaffinity(0)) // (self.gpu_workers * len(self.gpus) or 1))
        for gpu in self.gpus:
            lock = gpu_lock_path(gpu)
            env = worker_env("cuda", self.backend, self.opts, "run", gpu=gpu, threads=gpu_threads)
            if self.backend == "triton":   # the zygote warms Triton's compiler up for this GPU (no driver there)
                major, minor = torch.cuda.get_device_capability(gpu)
                env["KZ_TRITON_ARCH"] = str(10 * major + minor)
            if "TORCH_CUDA_ARCH_LIST" in cpu_env:
                env.setdefault("TORCH_CUDA_ARCH_LIST", cpu_env["TORCH_CUDA_ARCH_LIST"])
            # Two idle workers per GPU slot: a GPU worker's boot costs seconds of CPU (CUDA context, profiler, Triton),
            # and one spare per slot left candidates waiting for one. Each holds ~1 GB of host memory and a context.
            self.pools[gpu] = Pool(env, gpu_spare)
            self.gates[gpu] = Gate(lock)
        for pool in self.pools.values():   # boot now, in the background (the trainer generates meanwhile; the first
            threading.Thread(target=pool.fill, daemon=True).start()   # fork waits for its zygote's imports)

    def _run(self, pool: str | int, job: dict, server: ReferenceServer | None = None) -> KernelResult:
        return run_job(self.pools[pool].take(), job, self.limits, self.gates.get(pool), self.memory,
                       pool if isinstance(pool, int) else None, server)

    def _server(self, pool: str | int, ref_src: str, servers: dict) -> ReferenceServer | None:
        """The task's reference server on this pool (one per GPU: CUDA IPC maps memory of the same GPU), started by
        the first candidate that needs it; None where the task has none (fewer than two candidates to run, the
        option off). One that cannot serve says why in its `failure`."""
        if ref_src not in servers["tasks"]:
            return None
        with servers["lock"]:
            lock = servers["starting"].setdefault((ref_src, pool), threading.Lock())
        with lock:   # (the task's other candidates on this pool wait for the trials, then share them)
            if (ref_src, pool) not in servers["made"]:
                job = {"kind": "serve", "ref_src": ref_src, "backend": self.backend, "device": self.device,
                       "opts": self.opts, "defer": servers.get("defer", False)}
                servers["made"][ref_src, pool] = ReferenceServer(
                    self.pools[pool].take(), job, self.limits, self.gates.get(pool), self.memory,
                    pool if isinstance(pool, int) else None)
        return servers["made"][ref_src, pool]

    def _served(self, pool: str | int, job: dict, servers: dict) -> KernelResult:
        """A candidate's job on `pool`, on its task's shared trials where there is a reference server. A verdict the
        server cannot vouch for (the shared inputs changed while the candidate ran, or the server failed) is made
        again, on trials of the candidate's own (details["rerun_private"] says why); one whose server could not
        serve it at all is made on its own trials from the start (details["no_server"] says why)."""
        server = self._server(pool, job["ref_src"], servers)
        if server is None:
            return self._run(pool, job)
        shared = None
        if not server.failure:
            with contextlib.suppress(ServerFailed):   # (attach sets server.failure)
                ticket, shared = server.attach()
        if shared is None:
            failure = server.failure
            if isinstance(failure, KernelResult) and failure.details.get("deferred"):
                return failure   # (the task's candidates go with their server: map runs them later)
            result = self._run(pool, job)
            result.details["no_server"] = truncate(failure.error if isinstance(failure, KernelResult) else
                                                   str(failure), 300)
            return result
        try:
            result = self._run(pool, dict(job, served=shared), server)
        finally:
            tainted = server.release(ticket)
        if not (tainted or result.details.get("server_failed")):
            return result
        private = self._run(pool, job)
        private.details["rerun_private"] = "the shared inputs changed" if tainted else result.error
        return private

    def _evaluate_one(self, ref_src: str, cand_src: str, cpu_slots, free_gpus, two_stage: bool,
                      early: KernelResult | None = None, servers: dict | None = None) -> KernelResult:
        if early:
            return early
        servers = servers or {"tasks": set()}
        job = {"kind": "evaluate", "ref_src": ref_src, "cand_src": cand_src, "backend": self.backend,
               "device": self.device, "opts": self.opts, "defer": servers.get("defer", False)}
        if not self.gpus:
            with cpu_slots:
                return self._served("cpu", job, servers)
        # A single candidate has nothing to overlap; Triton compiles at the first launch, i.e. on the GPU worker
        if not two_stage or self.backend == "triton":
            return self._on_gpu(job, free_gpus, servers)
        with cpu_slots:   # stage 1: build/import on a CPU worker (fills the extension cache)
            built = self._run("cpu", dict(job, kind="compile"))
        if built.error_kind != "ok":
            return built
        result = self._on_gpu(job, free_gpus, servers)   # stage 2: a fresh process on a GPU, a cache hit
        result.details.update(run_stage_compile_s=result.compile_s)
        result.compile_s = built.compile_s
        return result

    def _on_gpu(self, job: dict, free_gpus: queue.Queue, servers: dict) -> KernelResult:
        gpu = free_gpus.get()
        try:
            result = self._served(gpu, job, servers)
            # Candidates sharing a GPU share its memory: one that runs out may be the victim of another's memory
            # bomb, so it gets a second run with the GPU to itself before its verdict stands.
            if self.gpu_workers > 1 and result.error_kind in ("runtime", "crash") and "out of memory" in result.error:
                result = self._served(gpu, dict(job, alone=True), servers)
                result.details["rerun_alone"] = True
        finally:
            free_gpus.put(gpu)
        result.details["gpu"] = gpu
        return result

    def with_options(self, **opts) -> "Evaluator":
        """This Evaluator's workers, gates and memory budget, sending jobs with other options: the trainer times its
        RL candidates with a shorter timing_budget_s than its held-out eval. Options that shape the workers or the
        time limits (memory_limit_gb, timeouts) stay the original's. Closing the view closes nothing."""
        _check_options(opts)
        if not self.reason:
            self._start()   # (the view must share these pools, not start its own)
        view = copy.copy(self)
        view.opts = {**self.opts, **opts}
        view.close = lambda: None   # (also what __exit__ and __del__ call)
        return view

    @contextlib.contextmanager
    def holding_gpus(self):
        """`with ev.holding_gpus(): <the caller's own GPU work>`: the caller takes each of this Evaluator's GPUs alone,
        as a timer does. Candidates go on building, booting and making host inputs meanwhile, but none runs on the
        GPU until the block ends: none is timed against the caller's kernels, and no candidate's memory bomb can take
        the caller (the trainer, generating its next batch) down. No-op on the CPU."""
        if self.gpus:   # (gates exist once the pools are started)
            self._start()
        # one order everywhere (by lock file, i.e. GPU UUID): two processes holding several GPUs cannot deadlock
        gates = sorted(self.gates.values(), key=lambda gate: gate.lock_path or "")
        held = [(gate, gate.acquire("exclusive")) for gate in gates]
        try:
            yield
        finally:
            for gate, fd in held:
                gate.release("exclusive", fd)

    def map(self, pairs: list[tuple[str, str]]) -> list[KernelResult]:
        """Verdicts for (ref_src, cand_src) pairs, in order."""
        pairs = list(pairs)
        if self.reason:
            return [verdict("unsupported", self.reason) for _ in pairs]
        self._start()
        from tqdm import tqdm
        results = [None] * len(pairs)
        cpu_slots, free_gpus = threading.Semaphore(self.cpu_workers), queue.Queue()
        for gpu in self.gpus * self.gpu_workers:   # one token per GPU slot
            free_gpus.put(gpu)
        bar = tqdm(total=len(pairs), disable=not self.progress, desc=f"eval {self.backend}/{self.device}")

        # A candidate identical to an earlier one of its task (greedy samples, or a group once RL has sharpened the
        # policy) is evaluated once: the same source gets the same verdict, and in a GRPO group timing noise can then
        # not rank two copies of one kernel apart (they get equal rewards, hence equal advantages)
        keys = [(ref, _same_code_key(cand)) for ref, cand in pairs]
        first = {}
        for i, key in enumerate(keys):
            first.setdefault(key, i)
        todo = sorted(first.values()) if self.opts["dedupe"] else list(range(len(pairs)))
        early = [_precheck(cand, self.backend) for _, cand in pairs]

        def run(indices: list[int], defer: bool) -> list[int]:
            """Verdicts for `indices`, side by side; with `defer`, those Memory refused (their memory fits only
            once a server has ended) are left out and returned. Reference servers (reference_server): for each task
            with two or more candidates to run, made by the first that needs one, ended after its task's last."""
            left = collections.Counter(pairs[i][0] for i in indices if early[i] is None)
            servers = {"tasks": {task for task, n in left.items() if n > 1} if self.opts["reference_server"] else set(),
                       "made": {}, "starting": {}, "lock": threading.Lock(), "defer": defer}
            deferred = []

            def one(i):
                try:
                    results[i] = self._evaluate_one(*pairs[i], cpu_slots, free_gpus, two_stage=len(pairs) > 1,
                                                    early=early[i], servers=servers)
                except Exception as e:   # a harness bug must not lose the other results
                    results[i] = verdict("runtime", "harness error: " + format_exception(e))
                if early[i] is None:
                    with servers["lock"]:
                        left[pairs[i][0]] -= 1
                        done = [servers["made"].pop(key) for key in list(servers["made"])
                                if key[0] == pairs[i][0] and not left[pairs[i][0]]]
                    for server in done:
                        server.close()
                if results[i].details.get("deferred"):
                    deferred.append(i)
                else:
                    bar.update(1)

            # twice the compile slots: finished builds wait for a GPU while the next ones compile
            threads = 2 * self.cpu_workers + self.gpu_workers * len(self.gpus)
            try:
                with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as ex:
                    list(ex.map(one, indices))
            finally:
                for server in list(servers["made"].values()):
                    server.close()
            return sorted(deferred)

        # Every candidate side by side, except those whose memory could fit only beside fewer reference servers
        # than there are: those run after the rest, one task at a time (its server and its candidates alone)
        deferred = run(todo, defer=True)
        for task in dict.fromkeys(pairs[i][0] for i in deferred):
            run([i for i in deferred if pairs[i][0] == task], defer=False)
        for i in deferred:
            results[i].details["ran_deferred"] = True
        for i, key in enumerate(keys):
            if results[i] is None:   # a duplicate: its first copy's verdict, marked as such; the seconds the
                j = first[key]       # harness spent (phase_s, *_s) stay with the copy that spent them
                details = {k: v for k, v in results[j].details.items()
                           if k not in ("phase_s", "gpu_turns") and not k.endswith("_s")}
                results[i] = dataclasses.replace(results[j], details={**details, "duplicate_of": j})
                bar.update(1)
        bar.close()
        return results

    def lint(self, srcs: list[str]) -> list[dict]:
        """lint_tasks on this Evaluator's started workers and GPU gates: the trainer lints its Proposer's modules
        every round, and a fresh pool would boot its processes (seconds each) every time. Lint runs on the device
        the candidates run on (the CPU pool without a GPU)."""
        if self.reason:   # (e.g. the CUDA backend without a GPU: lint itself needs no backend)
            return lint_tasks(srcs, device="cpu", workers=self.cpu_workers)
        self._start()
        pools = self.gpus or ["cpu"]   # sources spread over the GPUs in turn; the gates keep the eager timing alone

        def one(i: int) -> dict:
            pool, job = pools[i % len(pools)], {"kind": "lint", "src": srcs[i], "device": self.device, "opts": self.opts}
            return _lint_report(lambda: run_job(self.pools[pool].take(), job, self.limits, self.gates.get(pool)))

        from tqdm import tqdm
        with concurrent.futures.ThreadPoolExecutor(self.gpu_workers * len(self.gpus) or self.cpu_workers) as ex, \
                tqdm(total=len(srcs), desc=f"lint {len(srcs)} module(s)", leave=False,
                     disable=not self.progress or len(srcs) < 2) as bar:
            def counted(i):
                report = one(i)
                bar.update(1)
                return report
            return list(ex.map(counted, range(len(srcs))))

    def close(self) -> None:
        for pool in (self.pools or {}).values():
            pool.close()
        self.pools = None

    def __enter__(self):
        if not self.reason:
            self._start()
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


def evaluate(ref_src: str, cand_src: str | None, backend: str = "cuda", device: str | None = None,
             **opts) -> KernelResult:
    """Verdict for one candidate (a fresh worker process; see the module docstring for what is checked)."""
    evaluator = Evaluator(backend=backend, device=device, cpu_workers=1, progress=False, **opts)
    evaluator.spare = 0
    try:
        return evaluator.map([(ref_src, cand_src)])[0]
    finally:
        evaluator.close()


# The task linter's two size bounds (lint_tasks): a module's inputs at most this many MB (else it is not run), and on
# a GPU its eager forward at least this many ms (under it, launch overhead would dominate any kernel's time). Options
# max_input_mb and min_gpu_ms of a lint job override them; the trainer resizes a module that breaks only these.
LINT_MAX_INPUT_MB, LINT_MIN_GPU_MS = 512, 0.05
LINT_RULES = ("missing", "does not load", "inputs take", "does not run", "not deterministic", "eager time", "output",
              "degenerate", "timeout", "crash", "runtime")   # the first words of every problem a lint report names


def lint_rule(problem: str) -> str:
    """Which rule a lint report's problem (one of its "problems" strings) is about: LINT_RULES, else "other"."""
    return next((rule for rule in LINT_RULES if problem.startswith(rule)), "other")


def _lint_report(run) -> dict:
    """The report of one lint job, `run()` giving the worker's reply (its report, or a verdict where it has none); a
    timeout, crash or harness error becomes a failed report that says so (a harness bug must not lose the other
    reports, nor stop a training run)."""
    try:
        reply = run()
    except Exception as e:
        reply = verdict("runtime", "harness error: " + format_exception(e))
    if isinstance(reply, KernelResult):
        return {"ok": False, "problems": [f"{reply.error_kind}: {truncate(reply.error, 600)}"],
                "eager_ms": None, "input_mb": None, "details": reply.details}
    return reply


def lint_tasks(srcs: list[str], device: str = "cpu", workers: int | None = None, **opts) -> list[dict]:
    """Task quality rules for each source: loads, inputs <= 512 MB (else it is not run: the only problem named),
    runs, deterministic, not degenerate (zeros, constant, identity, input mean must fail the tolerance), eager
    >= 50 us on a GPU / <= 5 s on the CPU. Each task runs in its own worker process, `workers` at a time (default:
    the cores on the CPU, 4 on a GPU, where the eager timing takes the GPU alone through a Gate). Returns [{"ok",
    "problems", "eager_ms", "input_mb", ...}]."""
    if device == "cuda" and not torch.cuda.is_available():
        return [{"ok": False, "problems": ["CUDA is not available"], "eager_ms": None, "input_mb": None}
                for _ in srcs]
    options = dict(DEFAULTS, **opts)
    limits = {"startup": 300.0, "reference": float(opts.get("timeout", 120.0))}
    env = worker_env(device, "none", options, "run", gpu=0 if device == "cuda" else None)
    workers = max(1, workers or (4 if device == "cuda" else len(os.sched_getaffinity(0))))
    pool, gate = Pool(env, min(workers, len(srcs) - 1)), Gate(gpu_lock_path(0)) if device == "cuda" else None

    def one(src: str) -> dict:
        return _lint_report(lambda: run_job(pool.take(), {"kind": "lint", "src": src, "device": device,
                                                          "opts": options}, limits, gate))

    try:
        with concurrent.futures.ThreadPoolExecutor(workers) as ex:
            return list(ex.map(one, srcs))
    finally:
        pool.close()


def lint_task(src: str, device: str = "cpu", **opts) -> dict:
    """lint_tasks for one source."""
    return lint_tasks([src], device, **opts)[0]


# ---------------------------------------------------------------------------------------------------------------------
# CLI

def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _human_result(result: KernelResult, device: str = "cuda", timing: bool = True) -> str:
    """One or two lines a person reads: the verdict, speedup and runtimes (or why there are none), the compile and
    check time; on failure the reason, and the check that fired."""
    if result.correct:
        line = "ok: correct"
        if result.speedup is not None:
            line += (f", speedup {result.speedup:.2f}x ({result.runtime_ms:.3f} ms vs "
                     f"{result.ref_runtime_ms:.3f} ms eager)")
        elif device == "cpu":
            line += ", not timed (the CPU runs Triton under its interpreter: speedup and runtime need a GPU)"
        elif not timing:
            line += ", not timed (--no-timing)"
    else:
        line = f"FAIL ({result.error_kind})"
    took = [f"compiled in {result.compile_s:.1f} s" if result.compile_s else "",
            f"{sum((result.details.get('phase_s') or {}).values()):.1f} s in all" if result.details.get("phase_s") else ""]
    line += "".join(f"; {t}" for t in took if t)
    if result.details.get("check"):
        line += f" [check: {result.details['check']}]"
    if result.error and not result.correct:
        line += "\n  " + result.error.strip().splitlines()[-1][:300]
    return line


def _print_result(result: KernelResult, as_json: bool, device: str = "cuda", timing: bool = True, **names) -> None:
    if as_json:
        print(json.dumps({**names, **dataclasses.asdict(result)}), flush=True)
        return
    label = " ".join(f"{v}" for v in names.values())
    print((f"{label}: " if label else "") + _human_result(result, device, timing), flush=True)


def _task_solution_pairs(tasks_dir: str, solutions_dir: str, backend: str) -> list[tuple[str, str]]:
    """Task NNN_Name.py with every solution file that starts with NNN_ and names the backend (NNN_Name_triton.py)."""
    pairs = []
    solutions = sorted(f for f in os.listdir(solutions_dir) if f.endswith(".py"))
    for task in sorted(os.listdir(tasks_dir)):
        m = re.match(r"(\d+)_.*\.py$", task)
        if not m:
            continue
        for sol in solutions:
            if sol.startswith(m.group(1) + "_") and re.search(rf"(^|_){backend}(_|\.py$)", sol):
                pairs.append((os.path.join(tasks_dir, task), os.path.join(solutions_dir, sol)))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eval_harness.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p, lint=False):
        p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if available")
        p.add_argument("--json", action="store_true", help="one JSON object per line" + (
            "" if lint else f" (a KernelResult; error_kind is one of {', '.join(ERROR_KINDS)})"))
        if not lint:
            p.add_argument("--backend", choices=["cuda", "triton"], default=None,
                           help="default: cuda on a GPU machine, triton otherwise")
            p.add_argument("--timeout", type=float, default=None, help="compile and run limits in s")
            p.add_argument("--atol", type=float, default=None)
            p.add_argument("--rtol", type=float, default=None)
            p.add_argument("--trials", type=int, default=DEFAULTS["trials"])
            p.add_argument("--no-timing", action="store_true")

    check = sub.add_parser("check", help="evaluate one candidate against one task")
    check.add_argument("ref")
    check.add_argument("cand")
    common(check)
    run = sub.add_parser("run", help="evaluate every solution in a directory against its task")
    run.add_argument("--tasks", required=True)
    run.add_argument("--solutions", required=True)
    run.add_argument("--workers", type=int, default=None, help="CPU worker processes")
    common(run)
    lint = sub.add_parser("lint", help="check task files against the task quality rules")
    lint.add_argument("paths", nargs="+")
    common(lint, lint=True)
    args = parser.parse_args(argv)
    device = args.device or _default_device()

    if args.command == "lint":
        files = []
        for path in args.paths:
            if os.path.isdir(path):
                files += sorted(os.path.join(path, f) for f in os.listdir(path)
                                if f.endswith(".py") and not f.startswith("__"))
            elif os.path.isfile(path):
                files.append(path)
            else:
                parser.error(f"no such file or directory: {path}")
        reports = lint_tasks([_read(path) for path in files], device=device)
        for path, report in zip(files, reports):
            if args.json:
                print(json.dumps({"path": path, **report}), flush=True)
            else:
                print(f"{path}: {'ok' if report['ok'] else 'FAIL'}" + "".join(f"\n  {p}" for p in report["problems"]))
        return 0 if all(r["ok"] for r in reports) else 1

    backend = args.backend or ("cuda" if device == "cuda" else "triton")
    opts = {"trials": args.trials, "atol": args.atol, "rtol": args.rtol, "timing": not args.no_timing}
    if args.timeout:
        opts.update(compile_timeout=args.timeout, run_timeout=args.timeout, ref_timeout=max(args.timeout, 60.0))
    if args.command == "check":
        for path in (args.ref, args.cand):
            if not os.path.isfile(path):
                parser.error(f"no such file: {path}")
        result = evaluate(_read(args.ref), _read(args.cand), backend=backend, device=device, **opts)
        _print_result(result, args.json, device, opts["timing"])
        return 0 if result.correct else 1

    for path in (args.tasks, args.solutions):
        if not os.path.isdir(path):
            parser.error(f"no such directory: {path}")
    pairs = _task_solution_pairs(args.tasks, args.solutions, backend)
    if not pairs:
        parser.error(f"no {backend} solutions in {args.solutions} match a task in {args.tasks}")
    with Evaluator(backend=backend, device=device, cpu_workers=args.workers, progress=not args.json, **opts) as ev:
        results = ev.map([(_read(t), _read(s)) for t, s in pairs])
    for (task, sol), result in zip(pairs, results):
        _print_result(result, args.json, device, opts["timing"], task=os.path.basename(task),
                      solution=os.path.basename(sol))
    return 0 if all(r.correct for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
