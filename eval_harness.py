"""eval_harness.py: verifies and times candidate GPU kernels for KernelZero (CUDA via load_inline, Triton via JIT).

A task is a KernelBench problem file (`class Model`, `get_inputs()`, `get_init_inputs()`); a candidate defines
`class ModelNew` with the same constructor and forward signature. `evaluate(ref_src, cand_src)` returns a
`KernelResult` whose `error_kind` is one of ERROR_KINDS; `Evaluator.map(pairs)` does the same for a batch, building
CUDA candidates on CPU workers in parallel, checking a few candidates at once on each GPU and timing one at a time.

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
   6 monkey-patching torch, timers or the harness: identity snapshot, separate processes
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

How it departs from KernelBench's own eval (src/eval.py)
  1. One fresh process per candidate, separate compile and run timeouts (KernelBench runs in the caller's process).
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
  5. Timing (GPU only): each model's forward is captured once as a CUDA graph and replayed between two CUDA events,
     so no Python and no host latency sits inside the timed window (KernelBench calls the model between the events:
     on a loaded machine the host's launch latency becomes part of a 0.1 ms kernel's time). A model whose forward
     cannot be captured (a host sync, an unjoined side stream, a launch on the legacy stream), or whose replays do
     not reproduce the reference outputs, is called eagerly instead, with a device-wide synchronize before the end
     event (side streams inside); reference and candidate are always timed the same way (details["timing_method"]).
     A 256 MB L2 flush before every rep, the input values alternating between two trials' (copied in, untimed),
     under no_grad, the GPU held alone for the timed reps only (copies, captures and warm-up run while other
     workers check); medians reported (means in details for KernelBench comparisons); reference and candidate
     interleaved in the candidate's process, reps until both medians' distribution-free 95% confidence intervals
     are within timing_ci (2%) of them, at least timing_min_reps, at most 300 or timing_budget_s. SPOT_CHECKS
     unpredictable reps, every input set among them, have their output compared with GPU copies of the reference
     outputs, which are checked against the host's after timing (reward_hack "reference_outputs": the candidate may
     reach them). Options: timing_graphs=False and timing_adaptive=False give the eager, fixed-budget rule
     (timing_budget_s spent, 30..300 reps); timing_headroom_us (a GPU sleep after each rep's flush, for the eager
     method) stays off.
  6. Models keep their default (training) mode as in KernelBench (BatchNorm tasks use batch statistics); every call
     runs under torch.no_grad(). Tolerances per output dtype (TOLERANCES: fp32 1e-4, fp16/bf16 1e-2, atol = rtol).

Decisions worth knowing (each has a test in test_kernelzero.py)
  - Verdict order: harness integrity (patched references, threads, input mutation) > runtime error > wrong output
    (mismatch) > own kernels not launched > PyTorch fallback. `correct` is exactly error_kind == "ok".
  - The PyTorch-fallback rule is strict: any aten op in forward outside _GLUE_OPS (allocation, views, copies,
    casts, cat/stack, padding) is a fallback, even a bias add; `.item()` loops count too. Ops run by Triton itself
    (launcher, interpreter, autotuner) are not recorded.
  - Input mutation is reward_hack (it fools the reference and skips an allocation), unless the reference mutates too.
  - Identical candidates of one task in one map() call (the same syntax tree: comments and spacing do not count) are
    evaluated once (option dedupe): copies share the verdict and the speedup (details["duplicate_of"]), so timing
    noise never ranks two copies of a kernel apart in a group.
  - GPU sharing: up to `gpu_workers` candidates run their correctness checks on one GPU at once, but timing takes
    the GPU exclusively (_Gate, waiting timers first), so process start-up, reference inputs, Triton JIT and
    profiling overlap while every timed rep runs alone. A checking worker gives its turn back during each Triton
    JIT compile and between trials (and between reference outputs), so a timer waits for one trial of each holder,
    not for their whole checks. A GPU worker pays its CUDA context, Triton's driver start-up and (CUDA candidates)
    the profiler's (seconds) at boot, while idle; the zygote already paid the imports, the first meta tensor and
    Triton's compiler start-up. Each GPU keeps two idle workers per slot, booted when the Evaluator starts, and
    each worker gets cores / slots CPU threads for torch (OMP_NUM_THREADS). An
    out-of-memory verdict on a shared GPU is rerun alone. A caller's own GPU work (the trainer generating) can hold
    the GPU alone meanwhile (Evaluator.holding_gpus). The gate holds across processes (a flock'd file per GPU
    under $KZ_CACHE_DIR): two runs, an eval and a lint sharing one GPU never time while another uses the GPU.
  - Trial inputs on the GPU (inputs_on_device, the default on CUDA): get_inputs() runs under
    `with torch.device("cuda")`, inside the worker's shared GPU turn, so factory calls without a device (randn,
    rand, randint, ...) make the inputs there in milliseconds, from the same per-trial seeds (other values than the
    host's generator draws; reference and candidate see the same ones); tensors a task puts on the CPU are moved.
    The inputs and the reference outputs stay on the GPU (max_trial_gb and the GPU memory admission count them
    there; details["trials_on"]). A kernel can write anywhere in its process's GPU memory: rewriting the stored
    inputs only makes its own outputs disagree, and each output's keyed fingerprint, kept on the host, is checked
    after the trials and after timing (reward_hack "reference_outputs"); page-locked host copies of a 256 MB
    task's outputs cost about a second per candidate. With inputs_on_device=False (and on the CPU) the
    inputs are made on the host before the worker asks for the GPU (a timer waits for every holder; a reference
    that mentions cuda asks first). Shared reference jobs send their trials through the host either way.
  - Zygotes are started with subprocess.Popen, not multiprocessing: the environment (TRITON_INTERPRET,
    CUDA_VISIBLE_DEVICES) is set before anything is imported, and the caller's __main__ is not re-imported. A
    forked worker calls setsid() first, so the kill reaches its whole group; its zygote reaps it and reports its
    exit code (a segfault reads SIGSEGV). The zygote must never ask the CUDA driver anything (importing
    torch.utils.cpp_extension does): torch then refuses CUDA in every forked child.
  - Shared reference work (share_reference; off by default: slower on the round batch, BENCHMARKS.md, "Harness
    throughput for RL rounds"): the candidates of one task in one map call (a GRPO group, an eval's samples) get
    their trials (inputs and reference outputs) from one "reference" job; each still times the reference itself.
    The parent keeps the trials in an anonymous memory file sealed against writes (memfd) and passes each
    candidate's worker its descriptor; the worker reads its own copy and closes it before the candidate is
    imported: nothing a candidate does reaches the next one's trials. The worker still loads the task module (same
    files, same init inputs). A failed reference job: each candidate makes its own.
  - Memory admission (_Memory): before a job makes or receives its trials it is admitted by its bytes, host and
    GPU (estimated from get_inputs() on the meta device, or measured by the shared reference job); a job waits
    while they do not fit (details["mem_wait_s"]), and one larger than the whole budget runs alone.
  - A worker's stdout/stderr go through a pipe; the parent keeps the last 64 KB for error messages, so a candidate
    that prints a lot is judged by what it computes, not by a log file's size limit.
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
import fcntl
import importlib.util
import inspect
import json
import multiprocessing
import multiprocessing.reduction
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass, field
from multiprocessing.connection import Connection

import torch


# ---------------------------------------------------------------------------------------------------------------------
# Results and options

ERROR_KINDS = ("ok", "format", "compile", "runtime", "mismatch", "timeout", "crash", "reward_hack", "unsupported")


@dataclass
class KernelResult:
    compiled: bool            # the candidate imported (and, for CUDA, its extension built)
    correct: bool             # exactly error_kind == "ok"
    error_kind: str           # one of ERROR_KINDS
    error: str = ""           # short, truncated message
    speedup: float | None = None         # reference median / candidate median (GPU timing only)
    runtime_ms: float | None = None      # candidate median
    ref_runtime_ms: float | None = None  # reference (eager) median
    compile_s: float | None = None       # import + build time of the candidate
    details: dict = field(default_factory=dict)  # trials, errors, checks fired, launches, coverage, timing means...


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
    timing_headroom_us=0,    # GPU sleep enqueued after each rep's L2 flush, before the start event: a launch that
                             # takes the host longer than the flush (a loaded machine, a Python launcher) then leaves
                             # no idle GPU inside the timed window. 0: off (its effect is unmeasured)
    compile_baseline=False,  # also time torch.compile(reference) (details["compile_baseline_ms"])
    compile_timeout=None,    # import/build limit in s; None: 600 for CUDA (cold nvcc builds), 120 for Triton
    run_timeout=300.0,       # limit in s for the candidate's trials + timing
    ref_timeout=300.0,       # limit in s for loading the reference and computing its outputs
    memory_limit_gb=8.0,     # RLIMIT_AS of CPU-mode workers: a memory bomb fails instead of swapping the machine
    max_trial_gb=4.0,        # stored trial inputs + outputs, wherever they live; tasks above it get fewer trials
    inputs_on_device=True,   # on a GPU: get_inputs() runs under `with torch.device("cuda")` and the trial inputs
                             # stay there (ms instead of seconds of host randn + copies for a 256 MB task); False:
                             # made on the host (and the reference outputs kept there). No-op on the CPU
    share_reference=False,   # a task's candidates in one map call share its trials (one reference job per task);
                             # None: on a GPU only. Off by default: same verdicts and speedups, but slower on the
                             # round batch (BENCHMARKS.md, "Harness throughput for RL rounds")
    dedupe=True,             # map(): a candidate identical to an earlier one of the same task (same reference, same
                             # syntax tree) gets a copy of its verdict (details["duplicate_of"]) instead of a run
    host_memory_gb=None,     # admission budget for host memory; None: 70% of MemAvailable when the pools start
    gpu_memory_gb=None,      # admission budget per GPU; None: 85% of its memory less what this process reserved
)
FIXED_TIMING = {"timing_adaptive": False, "timing_graphs": False}   # the eager fixed-budget rule (bench.py compares)


def _truncate(text: str, n: int = 1500) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n // 3] + "\n...\n" + text[-(2 * n) // 3:]


def _result(kind: str, error: str = "", **fields) -> KernelResult:
    assert kind in ERROR_KINDS, kind
    fields.setdefault("compiled", False)
    return KernelResult(correct=(kind == "ok"), error_kind=kind, error=_truncate(error), **fields)


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
# Static checks (parent side: parse only, nothing is executed)

_BANNED_IMPORTS = {  # module root -> check name
    "threading": "threads", "_thread": "threads", "concurrent": "threads", "asyncio": "threads",
    "multiprocessing": "processes", "subprocess": "processes", "ctypes": "ctypes", "cffi": "ctypes",
    "inspect": "introspection", "importlib": "dynamic_code", "eval_harness": "monkeypatch", "builtins": "monkeypatch",
    "gc": "introspection",   # gc reaches every live object, the harness's stored reference outputs among them
    "torch.multiprocessing": "processes", "torch.overrides": "torch_function",
    "torch.utils._python_dispatch": "torch_function", "torch._dynamo": "torch_compile", "torch._inductor": "torch_compile",
}
_BANNED_NAMES = {  # dotted name (after resolving imports) -> check name
    "os.fork": "processes", "os.forkpty": "processes", "os.system": "processes", "os.popen": "processes",
    "os.posix_spawn": "processes", "os.posix_spawnp": "processes",
    "gc.get_objects": "introspection", "gc.get_referrers": "introspection", "gc.get_referents": "introspection",
    "sys._getframe": "introspection", "sys._current_frames": "introspection", "sys.settrace": "introspection",
    "sys.setprofile": "introspection", "sys.modules": "sys_modules",
    "torch.cuda.Stream": "side_stream", "torch.cuda.stream": "side_stream", "torch.cuda.ExternalStream": "side_stream",
    "torch.cuda.set_stream": "side_stream", "torch.set_float32_matmul_precision": "tf32",
    "torch.Tensor._make_subclass": "tensor_subclass", "torch.Tensor._make_wrapper_subclass": "tensor_subclass",
    "torch.library.Library": "monkeypatch", "torch.library.impl": "monkeypatch",
    "torch.compile": "torch_compile",   # inductor would write the kernels, not the candidate
}
_BANNED_ATTRS = {  # attribute names, whatever object they hang off
    "__torch_function__": "torch_function", "__torch_dispatch__": "torch_function", "as_subclass": "tensor_subclass",
    "numpy": "host_compute", "tolist": "host_compute",   # tensor data pulled to the host and computed there
    "__globals__": "introspection", "__builtins__": "introspection", "f_back": "introspection",
    "f_globals": "introspection", "f_locals": "introspection", "tb_frame": "introspection", "gi_frame": "introspection",
}
_TF32_ATTRS = {"allow_tf32", "fp32_precision", "allow_fp16_reduced_precision_reduction",
               "allow_bf16_reduced_precision_reduction"}
# modules a candidate may not assign into (not os: candidates often set os.environ["TORCH_CUDA_ARCH_LIST"], harmless)
_PROTECTED_ROOTS = {"torch", "time", "builtins", "sys", "eval_harness", "triton", "numpy", "math", "gc"}
_DYNAMIC_CALLS = {"exec", "eval", "compile", "__import__"}
_STREAM_IN_SOURCE = re.compile(r"getStreamFromPool|cudaStreamCreate")  # in CUDA source strings


def _import_aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> dotted path it was imported as (`import torch.nn.functional as F` -> F: torch.nn.functional,
    `import torch.nn` -> torch: torch). Shared with kernelbench_tasks/catalog.py."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _name_chain(node: ast.AST, subscripts: bool = False) -> list[str] | None:
    """['F', 'gelu'] for F.gelu: the names of an attribute chain that starts at a plain name, else None (e.g.
    (x + y).sum). subscripts=True also walks through subscripts (sys.modules["os"].system -> sys, modules,
    system). Shared with kernelbench_tasks/catalog.py."""
    parts = []
    while isinstance(node, ast.Attribute) or (subscripts and isinstance(node, ast.Subscript)):
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
        node = node.value
    return [node.id] + parts[::-1] if isinstance(node, ast.Name) else None


def _dotted(node: ast.AST, aliases: dict) -> str | None:
    """'torch.cuda.Stream' for an attribute chain (or subscript base) rooted at an imported name, else None."""
    chain = _name_chain(node, subscripts=True)
    if chain is None or chain[0] not in aliases:
        return None
    return ".".join([aliases[chain[0]]] + chain[1:])


def _static_check(tree: ast.AST, aliases: dict) -> tuple[str, str] | None:
    """(check, message) for the first banned construct, else None. Rules in _BANNED_* above; see module docstring."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom):
                names += [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                for banned, check in _BANNED_IMPORTS.items():
                    if name == banned or name.startswith(banned + "."):
                        return check, f"imports {name}"
        if isinstance(node, (ast.Name, ast.Attribute)):
            name = _dotted(node, aliases)
            if name in _BANNED_NAMES:
                return _BANNED_NAMES[name], f"uses {name}"
            if name and re.fullmatch(r"os\.(spawn|exec)\w*", name):
                return "processes", f"uses {name}"
        if isinstance(node, ast.Attribute) and node.attr in _BANNED_ATTRS:
            return _BANNED_ATTRS[node.attr], f"uses .{node.attr}"
        if getattr(node, "name", getattr(node, "id", None)) in ("__torch_function__", "__torch_dispatch__"):
            return "torch_function", "defines __torch_function__/__torch_dispatch__"
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                if _dotted(base, aliases) in ("torch.Tensor", "torch._C.TensorBase", "torch.nn.Parameter"):
                    return "tensor_subclass", f"class {node.name} subclasses torch.Tensor"
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr in _TF32_ATTRS:
                        return "tf32", f"sets {ast.unparse(t)}"
                    name = _dotted(t, aliases) if isinstance(t, (ast.Attribute, ast.Subscript)) else None
                    if name and name.split(".")[0] in _PROTECTED_ROOTS:
                        return "monkeypatch", f"assigns to {ast.unparse(t)}"
        if isinstance(node, ast.Call):
            fname = node.func.id if isinstance(node.func, ast.Name) else None
            if fname in _DYNAMIC_CALLS:
                return "dynamic_code", f"calls {fname}()"
            if fname in ("setattr", "delattr") and node.args:
                name = _dotted(node.args[0], aliases) or ""
                if name.split(".")[0] in _PROTECTED_ROOTS:
                    return "monkeypatch", f"{fname} on {name}"
            # getattr(sys, "mod" + "ules") reaches what the banned names guard: a computed name on a module is out
            if fname == "getattr" and len(node.args) > 1 and not isinstance(node.args[1], ast.Constant):
                name = _dotted(node.args[0], aliases) or ""
                if name.split(".")[0] in _PROTECTED_ROOTS | {"os"}:
                    return "introspection", f"getattr on {name} with a computed name"
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            for handler in node.handlers:
                for sub in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
                    if isinstance(sub, ast.Call) and (_dotted(sub.func, aliases) or "").startswith("torch."):
                        return "try_except_fallback", f"except branch calls {ast.unparse(sub.func)} (silent fallback)"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _STREAM_IN_SOURCE.search(node.value):
            return "side_stream", "CUDA source creates a stream"
    return None


def _backend_problem(tree: ast.AST, src: str, backend: str) -> str | None:
    """Why the candidate is not a `backend` candidate at all (-> format), else None."""
    names = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    names |= {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    if "ModelNew" not in names:
        return "no class ModelNew"
    if backend == "triton":
        jitted = any(re.search(r"\bjit\b", ast.unparse(d)) for n in ast.walk(tree)
                     if isinstance(n, ast.FunctionDef) for d in n.decorator_list)
        return None if jitted else "no @triton.jit kernel"
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", getattr(n.func, "attr", "")) == "load_inline"]
    strings = " ".join(n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str))
    return None if calls and "__global__" in strings else "no load_inline call with a __global__ CUDA kernel"


def _precheck(cand_src: str | None, backend: str) -> KernelResult | None:
    """format / compile (syntax) / reward_hack verdicts that need no process; None if the candidate may run."""
    if cand_src is None or not cand_src.strip():
        return _result("format", "no code")
    try:
        tree = ast.parse(cand_src)
    except SyntaxError as e:
        return _result("compile", f"SyntaxError: {e.msg} (line {e.lineno})")
    except (RecursionError, MemoryError, ValueError) as e:
        return _result("compile", f"unparseable source: {type(e).__name__}")
    problem = _backend_problem(tree, cand_src, backend)
    if problem:
        return _result("format", problem)
    hit = _static_check(tree, _import_aliases(tree))
    if hit:
        check, message = hit
        return _result("reward_hack", f"static check '{check}': {message}",
                       details={"check": check, "checks_fired": [check], "stage": "static"})
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Worker processes, parent side: a zygote per pool forks one fresh worker per job

_BOOT = "import sys; sys.path.insert(0, {here!r}); import eval_harness; eval_harness._zygote_main(int(sys.argv[1]))"


class _Zygote:
    """A process that imported the workers' modules in one environment; fork() makes a worker and returns its pid.
    Requests go over one socket (a lock serialises them); a new worker's two pipe ends (its job pipe, its output)
    travel as file descriptors (SCM_RIGHTS). The zygote never touches CUDA (a forked child could not use it) and
    never runs candidate code. Its workers are its children, so it also reaps them and reports their exit codes."""

    def __init__(self, env: dict):
        self.conn, child = multiprocessing.Pipe()   # (a socketpair: it can carry file descriptors)
        boot = _BOOT.format(here=os.path.dirname(os.path.abspath(__file__)))
        self.proc = subprocess.Popen([sys.executable, "-c", boot, str(child.fileno())], env=env,
                                     pass_fds=[child.fileno()], start_new_session=True, stdin=subprocess.DEVNULL)
        child.close()
        self.lock = threading.Lock()

    def ask(self, *request, fds: tuple = (), timeout: float = 300.0):
        with self.lock:
            self.conn.send(request)
            for fd in fds:
                multiprocessing.reduction.send_handle(self.conn, fd, self.proc.pid)
            if not self.conn.poll(timeout):   # (the first request waits for the zygote's imports)
                raise RuntimeError(f"the worker zygote did not answer {request[0]!r} in {timeout:.0f} s")
            return self.conn.recv()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()   # the zygote sees EOF and exits; its idle workers follow (_die_with_parent)
        self.proc.kill()
        self.proc.wait()


class _Worker:
    """One process forked from a zygote, in its own session; runs exactly one job, then it and its process group
    are killed.

    Its stdout and stderr (the candidate's prints, faulthandler's traceback) go to a pipe that a parent thread drains,
    keeping only the last TAIL_BYTES for error messages: a candidate that prints a lot (4 MB per call, called hundreds
    of times while timed) neither fills a file up to the worker's file-size limit ("File too large") nor blocks on a
    full pipe. Only the candidate's own behaviour decides its verdict."""

    TAIL_BYTES = 64 * 1024

    def __init__(self, zygote: _Zygote):
        self.zygote, self.dir = zygote, tempfile.mkdtemp(prefix="kz_worker_")   # candidate files, build outputs
        self.conn, child = multiprocessing.Pipe()
        out_read, out_write = os.pipe()
        try:
            self.pid = zygote.ask("fork", self.dir, fds=(child.fileno(), out_write))
        except BaseException:   # (e.g. the zygote died: nothing of this worker may stay behind)
            os.close(out_read)
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        finally:
            child.close()
            os.close(out_write)
        self.tail, self.output_bytes = collections.deque(), 0
        self.drain = threading.Thread(target=self._drain, args=(open(out_read, "rb"),), daemon=True)
        self.drain.start()

    def _drain(self, pipe) -> None:
        """Read the worker's output until EOF, keeping the last TAIL_BYTES (and the total count)."""
        kept = 0
        with contextlib.suppress(OSError, ValueError):
            while chunk := pipe.read1(65536):
                self.tail.append(chunk)
                kept += len(chunk)
                self.output_bytes += len(chunk)
                while kept - len(self.tail[0]) >= self.TAIL_BYTES:
                    kept -= len(self.tail.popleft())
        with contextlib.suppress(OSError):
            pipe.close()

    def exit_code(self, timeout: float = 5.0) -> int | None:
        """The worker's exit code (negative: killed by that signal) once it has ended; None if it still runs after
        `timeout` s (its zygote reaps it at a later request) or its zygote is gone."""
        with contextlib.suppress(Exception):
            return self.zygote.ask("reap", self.pid, timeout, timeout=timeout + 30)
        return None

    def kill(self) -> None:
        for kill, target in ((os.killpg, self.pid), (os.kill, self.pid)):   # the group: the candidate's children too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(target, signal.SIGKILL)
        # No waiting for it to end: a GPU worker's exit (its CUDA context torn down) can take a few hundred ms, and
        # the zygote answers one request at a time, so every fork would queue behind it. It reaps it later.
        self.exit_code(timeout=0)
        self.drain.join(timeout=5)   # (EOF once the group is dead; a child that escaped it may hold the pipe open)
        self.conn.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, n: int = 1200) -> str:
        """The last n bytes the worker printed (stdout and stderr)."""
        self.drain.join(timeout=2)   # a dead worker's last words are still in the pipe
        return b"".join(list(self.tail))[-n:].decode(errors="replace")


class _Pool:
    """One zygote and `spare` idle workers forked from it that are past their own start-up (the CUDA context,
    Triton's first compile), so that start-up hides behind other candidates' work. A zygote that died (e.g. killed
    for memory) is restarted; its idle workers died with it and are dropped."""

    def __init__(self, env: dict, spare: int):
        self.env, self.spare, self.idle, self.lock, self.zygote = env, spare, [], threading.Lock(), None

    def _fork(self) -> _Worker:   # (under self.lock)
        for attempt in range(2):   # a zygote that dies while it forks (killed for memory) is replaced once
            if self.zygote is not None and not self.zygote.alive():
                for worker in self.idle:
                    worker.kill()
                self.idle.clear()
                self.zygote.close()
                self.zygote = None
            if self.zygote is None:
                self.zygote = _Zygote(self.env)
            try:
                return _Worker(self.zygote)
            except (EOFError, OSError) as e:
                if attempt:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.zygote.proc.wait(timeout=10)
                    raise RuntimeError(f"worker processes cannot start: their zygote exited with code "
                                       f"{self.zygote.proc.returncode} (its error is printed above)") from e
                self.zygote.proc.kill()   # (counts as dead above)
                self.zygote.proc.wait()

    def take(self) -> _Worker:
        with self.lock:   # (a dead zygote's idle workers died with it: _fork drops them and starts a new one)
            worker = self.idle.pop(0) if self.idle and self.zygote.alive() else self._fork()
        self.fill()
        return worker

    def fill(self) -> None:
        """Fork workers until `spare` are idle (each then boots on its own: fork returns at once)."""
        with self.lock:
            while len(self.idle) < self.spare:
                self.idle.append(self._fork())

    def close(self) -> None:
        with self.lock:
            for worker in self.idle:
                worker.kill()
            self.idle.clear()
            if self.zygote is not None:
                self.zygote.close()
                self.zygote = None


def _worker_env(device: str, backend: str, opts: dict, role: str, gpu: int | None = None, threads: int = 0) -> dict:
    """A worker pool's environment. `threads`: torch's CPU threads per worker (OMP_NUM_THREADS), so that workers
    running at once share the cores instead of each starting one spinning thread per core (0: torch's default)."""
    env = dict(os.environ, KZ_DEVICE=device, KZ_BACKEND=backend, KZ_ROLE=role, PYTHONFAULTHANDLER="1",
               PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if device == "cpu":
        env.update(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="", KZ_MEMORY_LIMIT_GB=str(opts["memory_limit_gb"]))
    else:
        env.pop("TRITON_INTERPRET", None)
        if gpu is not None:   # map our index through the caller's own CUDA_VISIBLE_DEVICES
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[gpu] if visible else str(gpu)
    return env


# ---------------------------------------------------------------------------------------------------------------------
# Sharing a GPU and memory between workers: the timing gate, memory admission

class _Gate:
    """One GPU's timing gate. Any number of holders may check correctness on the GPU at once ("shared"), but a worker
    that times holds it alone ("exclusive"), so no other process's kernels run during its timing reps. A waiting
    timer blocks new shared holders (writer preference): timing is never starved by a stream of new candidates.

    With `lock_path` the gate also holds across processes (every Evaluator, lint and trainer on this machine that
    uses the same GPU): flock(2) on the lock file, shared or exclusive, plus a turnstile file that a timer holds
    while it waits, so that new shared holders of any process queue behind it. The kernel drops a dead process's
    locks. acquire() returns what release() needs (the lock file's descriptor, None without a lock file)."""

    def __init__(self, lock_path: str | None = None, max_shared: int | None = None):
        self.cond = threading.Condition()
        self.shared, self.exclusive, self.waiting = 0, False, 0
        self.lock_path = lock_path
        self.max_shared = max_shared   # shared holders of this process at once (None: any number)

    def acquire(self, mode: str) -> int | None:
        with self.cond:   # 1. this process's holders
            if mode == "shared":
                self.cond.wait_for(lambda: not self.exclusive and not self.waiting
                                   and (self.max_shared is None or self.shared < self.max_shared))
                self.shared += 1
            else:
                self.waiting += 1
                self.cond.wait_for(lambda: not self.exclusive and not self.shared)
                self.waiting -= 1
                self.exclusive = True
        if not self.lock_path:
            return None
        # 2. other processes' holders. One descriptor per holder: flock locks belong to an open file, so two opens
        # of one file conflict even within a process
        turnstile = os.open(self.lock_path + ".turnstile", os.O_RDWR | os.O_CREAT, 0o666)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(turnstile, fcntl.LOCK_EX)   # a waiting timer of any process holds this: we queue behind it
            fcntl.flock(fd, fcntl.LOCK_SH if mode == "shared" else fcntl.LOCK_EX)
        finally:
            os.close(turnstile)   # (closing unlocks)
        return fd

    def release(self, mode: str, fd: int | None = None) -> None:
        if fd is not None:
            os.close(fd)   # drops the flock
        with self.cond:
            if mode == "shared":
                self.shared -= 1
            else:
                self.exclusive = False
            self.cond.notify_all()


def _gpu_lock_path(gpu: int) -> str | None:
    """The machine-wide lock file of GPU `gpu` (an index into this process's visible devices), named by the GPU's
    UUID so that processes with different CUDA_VISIBLE_DEVICES agree; under $KZ_CACHE_DIR (default
    ~/.cache/kernelzero), i.e. per user. None where no lock file can be made (then the gate is per process)."""
    uuid = getattr(torch.cuda.get_device_properties(gpu), "uuid", None)
    name = str(uuid) if uuid is not None else f"index{gpu}"
    from cuda_ext.build import cache_root
    path = os.path.join(cache_root(), "gpu-locks", f"gpu-{name}.lock")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a"), open(path + ".turnstile", "a"):
            pass
    except OSError as e:
        warnings.warn(f"no GPU lock file ({e}): timing is exclusive among this process's candidates only")
        return None
    return path


class _Memory:
    """Admission by bytes, host and per GPU: the harness never runs more evaluations at once than memory holds.

    A job asks for (host bytes, device bytes) before it makes or receives its trials: its worker estimates them from
    the task's input sizes (_memory_need), or the parent knows them from the shared reference's measured sizes. It is
    admitted when its bytes fit in what is free, or when no other admitted job is running (a job larger than the
    whole budget still runs, alone). held() counts memory the parent itself keeps (the shared references' trials)."""

    def __init__(self, host_bytes: int, gpu_bytes: dict):
        self.cond = threading.Condition()
        self.total = {"host": int(host_bytes), **{gpu: int(b) for gpu, b in gpu_bytes.items()}}
        self.free = dict(self.total)
        self.running = 0

    def acquire(self, need: dict) -> dict:
        need = {key: min(int(v), self.total[key]) for key, v in need.items() if key in self.total and v > 0}
        with self.cond:
            self.cond.wait_for(lambda: self.running == 0 or all(self.free[k] >= v for k, v in need.items()))
            for key, v in need.items():
                self.free[key] -= v
            self.running += 1
        return need

    def release(self, granted: dict) -> None:
        with self.cond:
            for key, v in granted.items():
                self.free[key] += v
            self.running -= 1
            self.cond.notify_all()

    def hold(self, nbytes: int) -> None:
        """The parent keeps nbytes of host memory (no waiting: the bytes exist already)."""
        with self.cond:
            self.free["host"] -= int(nbytes)

    def unhold(self, nbytes: int) -> None:
        with self.cond:
            self.free["host"] += int(nbytes)
            self.cond.notify_all()


def _host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (the physical memory size where there is none)."""
    with contextlib.suppress(OSError, StopIteration, ValueError):
        with open("/proc/meminfo") as f:
            return int(next(line for line in f if line.startswith("MemAvailable:")).split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ---------------------------------------------------------------------------------------------------------------------
# Running one job (parent side): phases, time limits, GPU turns, memory

def _run_job(worker: _Worker, job: dict, limits: dict, gate: _Gate | None = None, memory: _Memory | None = None,
             gpu: int | None = None) -> dict:
    """Send one job and wait for its result; each phase the worker announces gets its own time limit. The worker asks
    for its GPU through `gate` (no gate: granted at once) and for its memory through `memory` (bytes on the host and
    on GPU `gpu`; a job that carries "mem" is admitted by the parent before it is sent); time spent waiting there
    counts against no limit. A job's "pack_fd" (a shared reference's trials in a sealed memory file, _sealed_file)
    follows the job as a file descriptor; a reference job's pack comes back as raw bytes (reply["pack"]). Adds
    details["phase_s"] (seconds per phase, waits excluded), details["gpu_wait_s"], details["gpu_turns"] (requests
    for the GPU turn), and details["mem_wait_s"] when the job waited for memory."""
    phase, held, held_fd, waited, mem_waited, granted, turns = "startup", None, None, 0.0, 0.0, None, 0
    deadline = time.monotonic() + limits[phase]
    clock, phase_s, pack = time.monotonic(), collections.Counter(), None
    pack_fd, known = job.get("pack_fd"), job.get("mem")
    job = {k: v for k, v in job.items() if k not in ("pack_fd", "mem")}

    def admit(host: int, device: int) -> float:
        """Wait for (host, device) bytes; returns the seconds waited. Device bytes are host bytes without a GPU."""
        nonlocal granted
        start = time.monotonic()
        if memory is not None and granted is None:
            on_gpu = gpu is not None and gpu in memory.total
            granted = memory.acquire({"host": host, gpu: device} if on_gpu else {"host": host + device})
        return time.monotonic() - start

    def finish(reply: dict) -> dict:
        phase_s[phase] += time.monotonic() - clock
        reply.setdefault("details", {}).update(phase_s={k: round(v, 3) for k, v in phase_s.items()},
                                               gpu_wait_s=round(waited, 3), gpu_turns=turns)
        if mem_waited > 0.01:
            reply["details"]["mem_wait_s"] = round(mem_waited, 3)
        if worker.output_bytes > _Worker.TAIL_BYTES:
            reply["details"]["output_bytes"] = worker.output_bytes
        if pack is not None and reply.get("error_kind") == "ok":
            reply["pack"] = pack
        return reply

    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not worker.conn.poll(left):
                return finish({"error_kind": "timeout", "compiled": phase == "run",
                               "error": f"{phase} phase timed out after {limits[phase]:.0f} s",
                               "details": {"phase": phase}})
            try:
                message = worker.conn.recv()
                if message[0] == "ready":
                    if known:   # sizes measured already (a shared reference): admitted before it is sent
                        wait = admit(*known)
                        mem_waited, deadline, clock = mem_waited + wait, deadline + wait, clock + wait
                    worker.conn.send(job)
                    if pack_fd is not None:
                        multiprocessing.reduction.send_handle(worker.conn, pack_fd, worker.pid)
                elif message[0] == "pack":   # a reference job's trials, one raw message per tensor
                    pack = {"meta": message[1], "buffers": [_recv_raw(worker.conn) for _ in message[1]["tensors"]]}
            except (EOFError, OSError):
                rc = worker.exit_code()
                how = f"signal {signal.Signals(-rc).name}" if rc is not None and rc < 0 else f"exit code {rc}"
                return finish({"error_kind": "crash", "compiled": phase == "run",
                               "error": f"worker died ({how}) during the {phase} phase\n{worker.log_tail()}",
                               "details": {"phase": phase, "returncode": rc}})
            if message[0] == "phase":
                phase_s[phase] += time.monotonic() - clock
                phase, clock = message[1], time.monotonic()
                deadline = clock + limits[phase]
            elif message[0] in ("gpu", "mem"):   # wait for the GPU turn / the memory the worker asks for
                start = time.monotonic()
                if message[0] == "mem":
                    admit(message[1], message[2])
                elif gate:   # release what the worker holds, then wait for the mode it asks for ("none": nothing)
                    if held:
                        gate.release(held, held_fd)
                    held_fd = gate.acquire(message[1]) if message[1] != "none" else None
                if message[0] == "gpu":   # (each request is a round trip through this thread: counted)
                    held, turns = (message[1] if message[1] != "none" else None), turns + 1
                wait = time.monotonic() - start
                if message[0] == "mem":
                    mem_waited += wait
                else:
                    waited += wait
                deadline, clock = deadline + wait, clock + wait
                with contextlib.suppress(OSError):   # died while waiting: the next recv reports the crash
                    worker.conn.send(("go",))
            elif message[0] == "result":
                return finish(message[1])
    finally:
        if gate and held:
            gate.release(held, held_fd)
        worker.kill()
        if memory is not None and granted is not None:   # (after the kill: the worker's memory is gone then)
            memory.release(granted)


# ---------------------------------------------------------------------------------------------------------------------
# Inside the worker: start-up (zygote, worker, warm-up) and the GPU turn

def _zygote_imports() -> None:
    """What a zygote does once for all its workers: the imports and first uses that cost seconds. Nothing here may
    touch the CUDA driver or start a thread (tests/harness_throughput.py checks both)."""
    import torch.utils._python_dispatch  # noqa: F401  (the op recorder's base class)
    with torch.device("meta"):   # the first meta tensor imports torch's meta kernels (seconds), which a worker
        (torch.randn(2) * 2).sum()   # would otherwise pay in _input_bytes_on_meta while it holds its GPU slot
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


def _gpu_turn(conn: Connection, mode: str) -> None:
    """Ask the parent for this worker's GPU, "shared" (correctness checks) or "exclusive" (timing), and wait until it
    is granted (see _Gate). Asked in CPU mode too, where it is granted at once."""
    conn.send(("gpu", mode))
    conn.recv()


def _pass_turn(conn: Connection, device: str, mode: str = "shared") -> None:
    """Give this worker's shared GPU turn back (its kernels finished first) and ask for `mode` again ("none": not at
    all): a timer waiting for the GPU gets it in between (writer-preferring _Gate)."""
    if device == "cuda":
        torch.cuda.synchronize()   # our kernels finish before another worker may time
    _gpu_turn(conn, mode)


def _format_exception(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)[-3:]
    where = "".join(f"  {os.path.basename(f.filename)}:{f.lineno} {f.line}\n" for f in frames)
    return f"{type(e).__name__}: {e}\n{where}".strip()


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


def _to_device(xs: list, device) -> list:
    return [x.to(device, copy=True) if isinstance(x, torch.Tensor) else x for x in xs]


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


def _same(a, b) -> bool:
    """Bit-for-bit equality (NaN equal to NaN) for inputs before/after a call."""
    if not isinstance(a, torch.Tensor):
        return a == b if not isinstance(b, torch.Tensor) else False
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    b = b.to(a.device)
    if torch.equal(a, b):   # the common case first: no NaN-mask temporaries of a 256 MB input
        return True
    if not a.is_floating_point():
        return False
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


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


def _job_evaluate(job: dict, conn: Connection) -> dict:
    """One candidate's verdict. Each stage returns a failed verdict, or None to go on to the next one."""
    ev = _Evaluation(job, conn)
    for stage in (_load_reference, _build_candidate, _check_correctness, _check_coverage, _time_candidate):
        verdict = stage(ev)
        if verdict is not None:
            return verdict
    return {"error_kind": "ok", "error": "", "compiled": True, "compile_s": ev.compile_s, "details": ev.details,
            **ev.timing}


# ---------------------------------------------------------------------------------------------------------------------
# Stage 1: the reference's trials (inputs and outputs), made before the candidate exists

def _input_bytes_on_meta(ref, opts: dict) -> int | None:
    """Bytes of one trial's inputs, from get_inputs() run on the meta device (no data is made); None if it cannot
    run there (e.g. it calls .cuda() or names a device)."""
    try:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            inputs = list(ref.get_inputs())
        if not all(x.is_meta for x in inputs if isinstance(x, torch.Tensor)):
            return None
        size = 2 if opts["dtype"] in ("float16", "bfloat16") else None
        return sum(x.numel() * (size if size and x.is_floating_point() else x.element_size())
                   for x in inputs if isinstance(x, torch.Tensor))
    except Exception:
        return None


def _memory_need(per_input: int | None, per_output: int | None, opts: dict, device: str,
                 inputs_on_device: bool = False, stored: int | None = None) -> tuple[int, int]:
    """(host bytes, device bytes) one evaluation takes, estimated from one trial's input and output bytes: the
    stored trials (max_trial_gb caps them; they count on the device when made there), the heavy trial's
    temporaries, and on the device the candidate's input copies, outputs, comparison temporaries, timing sets and
    their reference outputs. `stored`: bytes of trials already made (a shared reference: no temporaries). Unknown
    sizes (None) are taken as max_trial_gb."""
    cap = opts["max_trial_gb"] * 2**30
    if per_input is None:
        per_input = per_output = cap / 4
    per_output = per_input if per_output is None else per_output
    one = per_input + per_output
    if stored is None:
        n = min(opts["trials"], max(1, int(cap // max(one, 1)) - 1)) + 1
        made = n * one + 3 * per_input   # + x * exp(randn_like(x)) for the heavy trial
    else:
        made, host = 0, stored
    on_device = 4 * one + 4 * one + 2**28   # copies, outputs twice, compare temporaries; timing sets, two
                                            # graphs' captured inputs and outputs, L2 flush
    if stored is None:   # made here: on the device or on the host
        on_device, host = (on_device + made, 0) if inputs_on_device else (on_device, made)
    return (int(host + on_device), 0) if device == "cpu" else (int(host), int(on_device))


def _ask_memory(conn: Connection, host: int, device: int, details: dict) -> None:
    """Wait until the parent admits this job's memory (_Memory); granted at once without a budget."""
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
    n, out = opts["trials"], []
    for t in range(n + 1):
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


_FINGERPRINT_CHUNK = 2**24   # words per step: bounds the int64 temporaries (~400 MB) of a multi-GB output
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
            w = words[i:i + _FINGERPRINT_CHUNK].to(torch.int64)
            weight = (torch.arange(i, i + w.numel(), dtype=torch.int64, device=t.device) * a + b) % _FINGERPRINT_PRIME
            total += (w * weight).sum()
        sums.append(total)   # (left on the device: the caller reads many at once, _host_ints)
    return sums


def _host_ints(scalars: list[torch.Tensor]) -> list[int]:
    """Device scalars to Python ints with one host sync (_compare says why that matters)."""
    return torch.stack(scalars).tolist() if scalars else []


def _outputs_intact(trials: list) -> bool:
    """Whether every reference output kept on the GPU still has the fingerprint it had when it was made (a kernel
    can write anywhere in its process's GPU memory, and an output rewritten to match the candidate's would pass the
    comparison). Host-kept outputs have none: no kernel reaches them."""
    kept = [tr for tr in trials if "fp" in tr]
    sums = _host_ints([s for tr in kept for s in _fingerprint_sums(tr["out"], tr["fp"][0])])
    return sums == [v for tr in kept for v in tr["fp"][1]]


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
    trials, mutates, pending = [], False, []   # pending: (trial, its fingerprint sums still on the device)
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
        finite = not heavy or all(bool(torch.isfinite(o).all()) for o in _tensors(produced) if o.is_floating_point())
        mutates |= not all(_same(a, x) for a, x in zip(args, inputs))   # (checked where made: no host-side scan)
        del args, produced
        if not finite:
            details["heavy_trial"] = "skipped: the reference is not finite on heavy-tailed inputs"
            break
        trials.append({"inputs": [x.to(store) if isinstance(x, torch.Tensor) else x for x in inputs],
                       "out": out, "heavy": heavy})
        if any(t.is_cuda for t in _tensors(out)):
            pending.append((trials[-1], _fingerprint_sums(out, key)))
        if len(trials) == 1:
            allowed = _cap_trials(allowed, _nbytes(inputs) + _nbytes(_tensors(out)), opts, details)
    sums = iter(_host_ints([s for _, trial_sums in pending for s in trial_sums]))   # (one host sync for them all)
    for trial, trial_sums in pending:   # on the host before the candidate exists: out of its kernels' reach
        trial["fp"] = (key, [next(sums) for _ in trial_sums])
    details["heavy_trial"] = details.get("heavy_trial", any(tr["heavy"] for tr in trials))
    return trials, mutates


def _reference(job: dict, conn: Connection, details: dict, turn: str) -> tuple:
    """Load the task, make its trials and the reference outputs: (module, init_inputs, model, trials, mutates).
    Asks the parent for the memory this takes first (_memory_need), then for its GPU turn. Other candidates may
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
    per_input = None if mentions_cuda else _input_bytes_on_meta(ref, opts)   # (meta: no device may be named)
    host_bytes, device_bytes = _memory_need(per_input, per_input, opts, device.type, on_device)
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
    between = (lambda: _pass_turn(conn, device.type)) if turn == "shared" else None
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

    def __init__(self, backend: str, device: str, module_name: str):
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
        self.snapshot = _harness_snapshot()
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
        the GPU then waits for other candidates' GPU work only, not for their compiles (writer-preferring _Gate)."""
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
        whole check (the parent gives the shared turn back and waits for it again, behind any waiting timer). So
        a timer waits for one trial of each holder instead of their whole checks."""
        if self.turn is not None:
            _pass_turn(self.turn, self.device)

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
        now = _harness_snapshot()
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


def _harness_snapshot() -> dict:
    """The functions and flags the harness relies on; compared by identity (functions) or value (flags)."""
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
        snap[f"torch.Tensor.{name}"] = inspect.getattr_static(torch.Tensor, name)   # raw (classmethods too)
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
    for name, obj in globals().items():   # this module's own functions (a candidate could `import eval_harness`)
        if callable(obj) and getattr(obj, "__module__", None) == __name__:
            snap[f"eval_harness.{name}"] = obj
    return snap


def _poison_cuda_allocator() -> None:
    """Fill every free block of the caching allocator with NaN, so that memory a candidate gets without a fill (raw
    storage, a C++ allocation) holds no stale result, such as the reference's freed output (pitfall #1). Each free
    block is taken by asking for exactly its size (the allocator's best fit), filled, and given back: no driver call.
    Memory the cache has not got comes fresh from cudaMalloc, and this process never returned any to the driver
    before the candidate's calls (no empty_cache), so no old result of ours can be in it."""
    torch.cuda.synchronize()
    torch.empty(1, device="cuda")   # an allocation first: frees deferred by record_stream become free blocks
    free = [block["size"] for segment in torch.cuda.memory_snapshot() for block in segment["blocks"]
            if block["state"] == "inactive"]
    held = [torch.empty(size, dtype=torch.uint8, device="cuda") for size in sorted(free, reverse=True)]
    for t in held:
        t.view(-1)[: t.numel() // 4 * 4].view(torch.float32).fill_(float("nan"))
    del held   # back to the cache, NaN-filled


def _import_candidate(job: dict, send, details: dict) -> tuple:
    """Compile phase: install instrumentation, import the candidate (a CUDA extension builds here)."""
    instr = _Instrumentation(job["backend"], job["device"], "kz_candidate")   # harness time: before the clock starts
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

def _compare(out, ref_out, device, atol: float, rtol: float) -> tuple[str | None, str | None, str, dict]:
    """(error_kind or None, check or None, message, stats) for a candidate output against the reference output."""
    if isinstance(ref_out, torch.Tensor):
        pairs = [(out, ref_out)]
    elif isinstance(out, (tuple, list)) and len(out) == len(ref_out):
        pairs = list(zip(out, ref_out))
    else:
        return "mismatch", None, f"expected {type(ref_out).__name__} of {len(ref_out)} tensors, got {type(out).__name__}", {}
    stats = {"max_abs_err": 0.0, "max_rel_err": 0.0}
    for i, (o, r) in enumerate(pairs):
        if isinstance(o, torch.Tensor) and type(o) is not torch.Tensor:
            return "reward_hack", "output_type", f"output {i} is a {type(o).__name__}, not a plain torch.Tensor", stats
        if type(o) is not torch.Tensor:
            return "mismatch", None, f"output {i} is a {type(o).__name__}, not a torch.Tensor", stats
        if o.is_meta or o.layout != torch.strided or (o.numel() and o.untyped_storage().data_ptr() == 0):
            return "reward_hack", "output_storage", f"output {i} has no real storage", stats
        if o.device.type != device.type:
            return "mismatch", None, f"output {i} is on {o.device}, expected {device.type}", stats
        if o.shape != r.shape or o.dtype != r.dtype:
            return "mismatch", None, f"output {i}: got {tuple(o.shape)} {o.dtype}, expected {tuple(r.shape)} {r.dtype}", stats
        r = r.to(o.device)
        if not o.is_floating_point():
            if not torch.equal(o, r):
                return "mismatch", None, f"output {i}: {int((o != r).sum())} of {o.numel()} values differ", stats
            continue
        if not o.numel():
            continue
        # Four numbers, one host sync: on a GPU shared by several worker processes a sync waits for the others' time
        # slices, and this runs for every trial
        o32, r32 = (o.float(), r.float()) if o.dtype in (torch.float16, torch.bfloat16) else (o, r)
        finite = torch.isfinite(o32) & torch.isfinite(r32)
        diff = torch.where(finite, (o32 - r32).abs(), torch.zeros_like(o32))
        del finite
        max_rel = (diff / r32.abs().nan_to_num(nan=1.0).clamp_min(atol)).max()   # (a NaN made every max NaN)
        new_nan = (o.isnan() & ~r.isnan()).sum()
        bad = (~torch.isclose(o, r, atol=atol, rtol=rtol, equal_nan=True)).sum()   # (allclose is "none bad")
        new_nan, max_abs, max_rel, bad = torch.stack([new_nan.double(), diff.max().double(), max_rel.double(),
                                                      bad.double()]).tolist()
        if new_nan:
            return "mismatch", None, f"output {i}: NaN where the reference is not (uninitialised memory?)", stats
        stats["max_abs_err"] = max(stats["max_abs_err"], max_abs)
        stats["max_rel_err"] = max(stats["max_rel_err"], max_rel)
        if bad:
            return "mismatch", None, (f"output {i}: {int(bad)} of {o.numel()} values outside atol={atol:g} "
                                      f"rtol={rtol:g} (max abs err {stats['max_abs_err']:.3g})"), stats
    return None, None, "", stats


def _heavy_tol(trial: dict, trials: list, atol: float, rtol: float) -> tuple[float, float]:
    """The heavy-tailed trial's outputs are larger; scale atol by how much (keeps the same relative demand)."""
    if not trial["heavy"]:
        return atol, rtol
    mean_abs = lambda out: sum(float(t.float().abs().mean()) for t in _tensors(out) if t.numel()) or 1.0  # noqa: E731
    return atol * max(1.0, mean_abs(trial["out"]) / mean_abs(trials[0]["out"])), rtol


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
            pristine = _to_device(trial["inputs"], device)
            args = _refill(args, pristine)
            with instr.candidate_call():
                out = ev.cand_model(*args)
            hit = instr.verify()
            if hit:
                return ev.failed("reward_hack", hit[1], hit[0])
            if not ev.ref_mutates and not all(_same(a, p) for a, p in zip(args, pristine)):
                return ev.failed("reward_hack", "the candidate modified its inputs", "input_mutation")
            kind, check, message, stats = _compare(out, trial["out"], device,
                                                   *_heavy_tol(trial, trials, ev.atol, ev.rtol))
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
        for name, (graph, static, out) in runners.items():
            for inputs, ref_out in sets:   # (set 0 was the capture's own input: set 1 shows what replay reruns)
                _load_static(static, inputs)
                graph.replay()
                kind, _, message, _ = _compare(out, ref_out, device, *tol)
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
                 headroom_us: float = 0, graphs: bool = False, exclusive=None) -> dict:
    """Interleaved CUDA-event timing of several models on the same inputs (module docstring, item 5).
    Returns {name: list of ms}, "method": "graph" or "eager" (and "graph_fallback": why not); the `checked` model's
    outputs are compared with the reference on a few unpredictable reps. `graphs`: each model's forward captured
    once as a CUDA graph and replayed per rep (_graph_runners; else, or where that fails, every model is called
    eagerly, with a device-wide synchronize before the end event). `adaptive`: reps (at least min_reps) until every
    model's median has a 95% confidence interval narrower than `ci` of it, at most 300 reps or `budget_s` of wall
    time; else the fixed rule (budget_s spent, 30..300 reps). `headroom_us`: GPU sleep after each rep's flush
    (DEFAULTS["timing_headroom_us"]).
    `exclusive()`, if given, is called once everything before the timed reps is ready (input copies, captures,
    warm-up): the caller takes the GPU alone there, so other workers' checks overlap all of that."""
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

    def once(name, rep, check=False):
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
        end.synchronize()
        if check:
            times["bad_output"] += [_compare(out, ref_out, device, *tol)[0] is not None]
        return start.elapsed_time(end), (time.perf_counter() - host) * 1e3

    names = list(models)
    for rep in range(2):   # warm-up, one rep per input set (allocator, torch.compile): the models ran their trials
        warm = {name: once(name, rep)[1] for name in names}   # already (Triton JIT, autotuning, cuBLAS heuristics)
    if exclusive is not None:
        exclusive()
    if adaptive:   # as many reps as the medians need: the reward uses clip(ln s), a few percent is enough
        deadline, reps = time.monotonic() + budget_s, 300
    else:          # the fixed rule: the budget spent, 30..300 reps
        estimate = sum(warm.values()) + 0.5 * len(names)
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
    # compared on the GPU (the host copy goes there): a pageable copy of a large output to the host would take a
    # large part of a second inside the exclusive turn
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
    try:   # input copies, graph captures and warm-up still under the shared turn; the timed reps alone
        times = _time_models({"ref": ev.ref_model, "cand": timed}, trials, device, opts["timing_budget_s"],
                             checked="cand", tol=(ev.atol, ev.rtol),
                             exclusive=lambda: _gpu_turn(conn, "exclusive"), **_timing_rule(opts))
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
            ms = _median(_time_models({"compiled": compiled}, trials, device, opts["timing_budget_s"])["compiled"])
            details.update(compile_baseline_ms=ms, speedup_vs_compile=ms / max(_median(cand_ms), 1e-9))
        except Exception as e:   # the baseline is optional: report, do not fail the candidate
            details["compile_baseline_error"] = _truncate(_format_exception(e), 300)
    return None


# ---------------------------------------------------------------------------------------------------------------------
# Shared reference work: one job makes a task's trials, its candidates read them from a sealed memory file

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


def _recv_raw(conn: Connection) -> bytearray:
    """One send_bytes message read straight into a bytearray (Connection.recv_bytes would hold it twice)."""
    fd = conn.fileno()

    def read_into(view: memoryview) -> None:
        while len(view):
            n = os.readv(fd, [view])
            if n == 0:
                raise EOFError("the connection closed during a transfer")
            view = view[n:]

    header = bytearray(4)
    read_into(memoryview(header))
    size = int.from_bytes(header, "big", signed=True)
    if size == -1:   # (multiprocessing's header for messages over 2 GB)
        header = bytearray(8)
        read_into(memoryview(header))
        size = int.from_bytes(header, "big")
    buf = bytearray(size)
    read_into(memoryview(buf))
    return buf


def _sealed_file(buffers: list) -> tuple[int, list[tuple[int, int]]]:
    """The buffers written one after another into an anonymous memory file (memfd: no name a candidate could open),
    then sealed against any write, shrink or grow: (its descriptor, [(offset, size)] per buffer). Every candidate of
    a task reads its own copy from it (_pread) instead of receiving ~1 GB through its pipe, and no candidate can
    change what the next one is compared against (the seals hold for every descriptor, /proc/PID/fd reopens too)."""
    fd = os.memfd_create("kz_trials", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    extents, offset = [], 0
    try:
        for buf in buffers:
            view = memoryview(buf).cast("B")
            extents.append((offset, len(view)))
            while len(view):
                n = os.pwrite(fd, view, offset)
                view, offset = view[n:], offset + n
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW |
                    fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd, extents


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


def _to_result(d: dict) -> KernelResult:
    return _result(d["error_kind"], d.get("error", ""), compiled=bool(d.get("compiled", False)),
                   speedup=d.get("speedup"), runtime_ms=d.get("runtime_ms"), ref_runtime_ms=d.get("ref_runtime_ms"),
                   compile_s=d.get("compile_s"), details=d.get("details", {}))


class _SharedReference:
    """One task's reference work in a map call, shared by its `candidates`: made by the first of them that asks (a
    "reference" job on a worker), kept in the parent (counted in the host memory budget) until the last is done.
    The pack is None when the reference job failed: then every candidate makes its own, as without sharing, and
    gets the same verdict it always got."""

    def __init__(self, candidates: int):
        self.lock, self.made, self.pack, self.left, self.held = threading.Lock(), False, None, candidates, 0

    def get(self, run, job: dict, evaluator) -> dict | None:
        """{"meta": the pack's description, "fd": its sealed file, "extents": where each tensor is in it}."""
        with self.lock:
            if not self.made:
                self.made = True
                reply = run(dict(job, kind="reference"))
                if isinstance(reply, dict) and reply.get("error_kind") == "ok" and "pack" in reply:
                    fd, extents = _sealed_file(reply["pack"]["buffers"])
                    self.pack, self.held = {"meta": reply["pack"]["meta"], "fd": fd, "extents": extents}, \
                        reply["pack"]["meta"]["nbytes"]
                    if evaluator.memory is not None:
                        evaluator.memory.hold(self.held)
            return self.pack

    def done(self, memory) -> None:
        with self.lock:
            self.left -= 1
            if self.left == 0:
                if self.pack is not None:
                    os.close(self.pack["fd"])
                self.pack = None
                if memory is not None and self.held:
                    memory.unhold(self.held)
                self.held = 0


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
    check correctness (at most `gpu_checkers` of them holding it at once), but each times alone (_Gate): fair timing,
    and process start-up, reference inputs, Triton JIT and profiling of one candidate overlap with the others'. On
    the CPU: `cpu_workers` candidates at once."""

    def __init__(self, backend="triton", device=None, cpu_workers=None, gpus=None, progress=True, gpu_workers=8,
                 gpu_checkers=None, **opts):
        unknown = set(opts) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}")
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
        if gpu_workers < 1 or (gpu_checkers is not None and gpu_checkers < 1):
            raise ValueError(f"gpu_workers and gpu_checkers must be >= 1, not {gpu_workers}, {gpu_checkers}")
        # gpu_checkers: of the gpu_workers candidates on a GPU, how many may hold its shared turn at once (None: all).
        # The others compile (Triton's JIT gives the turn back) or wait: fewer processes with GPU work pending means
        # fewer time slices for each host sync to wait through (BENCHMARKS.md, "Harness throughput for RL rounds")
        self.gpu_workers, self.gpu_checkers = gpu_workers, gpu_checkers
        self.spare = None   # idle workers kept per pool (None: one more than run at once); evaluate() uses 0
        self.pools, self.gates, self.start_lock, self.memory = None, {}, threading.Lock(), None
        self.limits = {"startup": 300.0, "reference": self.opts["ref_timeout"],
                       "compile": self.opts["compile_timeout"], "run": self.opts["run_timeout"]}

    def _start(self) -> None:
        with self.start_lock:   # map() and holding_gpus() may be first from different threads
            if self.pools is None:
                self._start_pools()

    def _start_pools(self) -> None:
        threads = max(1, len(os.sched_getaffinity(0)) // self.cpu_workers)
        cpu_env = _worker_env(self.device, self.backend, self.opts, "compile" if self.gpus else "run", threads=threads)
        if self.gpus and self.backend == "cuda" and "TORCH_CUDA_ARCH_LIST" not in cpu_env:
            major, minor = torch.cuda.get_device_capability(self.gpus[0])   # build for this GPU only
            cpu_env["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
        cpu_spare = self.cpu_workers if self.spare is None else self.spare
        if self.gpus and self.backend == "triton":   # Triton on a GPU has no CPU stage: boot no idle CPU workers
            cpu_spare = 0
        self.pools = {"cpu": _Pool(cpu_env, cpu_spare)}
        host = self.opts["host_memory_gb"]
        gpu_bytes = {}
        for gpu in self.gpus:
            budget = self.opts["gpu_memory_gb"]
            if budget is None:
                own = torch.cuda.memory_reserved(gpu) if torch.cuda.is_initialized() else 0
                budget = (0.85 * torch.cuda.get_device_properties(gpu).total_memory - own) / 2**30
            gpu_bytes[gpu] = budget * 2**30
        self.memory = _Memory(host * 2**30 if host is not None else 0.7 * _host_available_bytes(), gpu_bytes)
        gpu_threads = max(1, len(os.sched_getaffinity(0)) // (self.gpu_workers * len(self.gpus) or 1))
        for gpu in self.gpus:
            env = _worker_env("cuda", self.backend, self.opts, "run", gpu=gpu, threads=gpu_threads)
            if self.backend == "triton":   # the zygote warms Triton's compiler up for this GPU (no driver there)
                major, minor = torch.cuda.get_device_capability(gpu)
                env["KZ_TRITON_ARCH"] = str(10 * major + minor)
            if "TORCH_CUDA_ARCH_LIST" in cpu_env:
                env.setdefault("TORCH_CUDA_ARCH_LIST", cpu_env["TORCH_CUDA_ARCH_LIST"])
            # Two idle workers per GPU slot: a GPU worker's boot costs seconds of CPU (CUDA context, profiler, Triton),
            # and one spare per slot left candidates waiting for one. Each holds ~1 GB of host memory and a context.
            self.pools[gpu] = _Pool(env, 2 * self.gpu_workers if self.spare is None else self.spare)
            self.gates[gpu] = _Gate(_gpu_lock_path(gpu), max_shared=self.gpu_checkers)
        for pool in self.pools.values():   # boot now, in the background (the trainer generates meanwhile; the first
            threading.Thread(target=pool.fill, daemon=True).start()   # fork waits for its zygote's imports)

    def _run(self, pool: str | int, job: dict) -> KernelResult:
        return _to_result(self._run_raw(pool, job))

    def _run_raw(self, pool: str | int, job: dict) -> dict:
        return _run_job(self.pools[pool].take(), job, self.limits, self.gates.get(pool), self.memory,
                        pool if isinstance(pool, int) else None)

    def _evaluate_one(self, ref_src: str, cand_src: str, cpu_slots, free_gpus, two_stage: bool,
                      early: KernelResult | None = None, shared=None) -> KernelResult:
        if early:
            return early
        job = {"kind": "evaluate", "ref_src": ref_src, "cand_src": cand_src, "backend": self.backend,
               "device": self.device, "opts": self.opts}
        if not self.gpus:
            return self._with_reference(job, shared, lambda job: self._on_cpu(job, cpu_slots))
        # A single candidate has nothing to overlap; Triton compiles at the first launch, i.e. on the GPU worker
        if not two_stage or self.backend == "triton":
            return self._with_reference(job, shared, lambda job: self._on_gpu(job, free_gpus))
        with cpu_slots:   # stage 1: build/import on a CPU worker (fills the extension cache)
            built = self._run("cpu", dict(job, kind="compile"))
        if built.error_kind != "ok":
            if shared:
                shared.done(self.memory)
            return built
        result = self._with_reference(job, shared, lambda job: self._on_gpu(job, free_gpus))   # stage 2: a fresh
        result.details.update(run_stage_compile_s=result.compile_s)   # process on a GPU, the import is a cache hit
        result.compile_s = built.compile_s
        return result

    def _on_cpu(self, job: dict, cpu_slots) -> KernelResult | dict:
        with cpu_slots:
            return self._run_raw("cpu", job) if job["kind"] == "reference" else self._run("cpu", job)

    def _with_reference(self, job: dict, shared, run) -> KernelResult:
        """run(job) with the task's shared reference attached when there is one (made by the first candidate of the
        task that gets here); without one, or if the reference job failed, the candidate makes its own."""
        if shared is None:
            return run(job)
        try:
            pack = shared.get(lambda ref_job: run(ref_job), job, self)
            if pack is not None:
                meta = pack["meta"]
                job = dict(job, pack={**{k: meta[k] for k in ("trials", "ref_mutates", "tensors", "details")},
                                      "extents": pack["extents"]},
                           pack_fd=pack["fd"],
                           mem=_memory_need(*meta["trial_bytes"], self.opts, "cuda" if self.gpus else "cpu",
                                            stored=meta["nbytes"]))   # (received trials live on the host)
            return run(job)
        finally:
            shared.done(self.memory)

    def _on_gpu(self, job: dict, free_gpus: queue.Queue) -> KernelResult | dict:
        gpu = free_gpus.get()
        try:
            if job["kind"] == "reference":
                return self._run_raw(gpu, job)
            result = self._run(gpu, job)
            # Candidates sharing a GPU share its memory: one that runs out may be the victim of another's memory
            # bomb, so it gets a second run with the GPU to itself before its verdict stands.
            if self.gpu_workers > 1 and result.error_kind in ("runtime", "crash") and "out of memory" in result.error:
                result = self._run(gpu, dict(job, alone=True))
                result.details["rerun_alone"] = True
        finally:
            free_gpus.put(gpu)
        result.details["gpu"] = gpu
        return result

    def with_options(self, **opts) -> "Evaluator":
        """This Evaluator's workers, gates and memory budget, sending jobs with other options: the trainer times its
        RL candidates with a shorter timing_budget_s than its held-out eval. Options that shape the workers or the
        time limits (memory_limit_gb, timeouts) stay the original's. Closing the view closes nothing."""
        unknown = set(opts) - set(DEFAULTS)
        if unknown:
            raise TypeError(f"unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}")
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
            return [_result("unsupported", self.reason) for _ in pairs]
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
        # candidates of one task (a GRPO group, an eval's samples) share its reference work: one job per task
        tasks = collections.Counter(pairs[i][0] for i in todo if early[i] is None)
        share = self.opts["share_reference"]
        share = bool(self.gpus) if share is None else share and not self.opts["compile_baseline"]
        shared = {ref: _SharedReference(n) for ref, n in tasks.items() if share and n > 1}

        def one(i):
            try:
                results[i] = self._evaluate_one(*pairs[i], cpu_slots, free_gpus, two_stage=len(pairs) > 1,
                                                early=early[i], shared=shared.get(pairs[i][0]) if early[i] is None
                                                else None)
            except Exception as e:   # a harness bug must not lose the other results
                results[i] = _result("runtime", "harness error: " + _format_exception(e))
            bar.update(1)

        # twice the compile slots: finished builds wait for a GPU while the next ones compile
        threads = 2 * self.cpu_workers + self.gpu_workers * len(self.gpus)
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as ex:
            list(ex.map(one, todo))
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
            return _lint_report(lambda: _run_job(self.pools[pool].take(), job, self.limits, self.gates.get(pool)))

        with concurrent.futures.ThreadPoolExecutor(self.gpu_workers * len(self.gpus) or self.cpu_workers) as ex:
            return list(ex.map(one, range(len(srcs))))

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


LINT_RULES = ("missing", "does not load", "inputs take", "does not run", "not deterministic", "eager time", "output",
              "degenerate", "timeout", "crash", "runtime")   # the first words of every problem a lint report names


def lint_rule(problem: str) -> str:
    """Which rule a lint report's problem (one of its "problems" strings) is about: LINT_RULES, else "other"."""
    return next((rule for rule in LINT_RULES if problem.startswith(rule)), "other")


def _lint_report(run) -> dict:
    """The report of one lint job, `run()` giving the worker's reply; a timeout, crash or harness error becomes a
    failed report that says so (a harness bug must not lose the other reports, nor stop a training run)."""
    try:
        reply = run()
    except Exception as e:
        reply = {"error_kind": "runtime", "error": "harness error: " + _format_exception(e)}
    if "ok" not in reply:
        return {"ok": False, "problems": [f"{reply['error_kind']}: {_truncate(reply.get('error', ''), 600)}"],
                "eager_ms": None, "input_mb": None, "details": reply.get("details", {})}
    return reply


def lint_tasks(srcs: list[str], device: str = "cpu", workers: int | None = None, **opts) -> list[dict]:
    """Task quality rules for each source: loads, runs, deterministic, inputs <= 512 MB, not degenerate (zeros,
    constant, identity, input mean must fail the tolerance), eager >= 50 us on a GPU / <= 5 s on the CPU. Each task
    runs in its own worker process, `workers` at a time (default: the cores on the CPU, 4 on a GPU, where the eager
    timing takes the GPU alone through a _Gate). Returns [{"ok", "problems", "eager_ms", "input_mb", ...}]."""
    if device == "cuda" and not torch.cuda.is_available():
        return [{"ok": False, "problems": ["CUDA is not available"], "eager_ms": None, "input_mb": None}
                for _ in srcs]
    options = dict(DEFAULTS, **opts)
    limits = {"startup": 300.0, "reference": float(opts.get("timeout", 120.0))}
    env = _worker_env(device, "none", options, "run", gpu=0 if device == "cuda" else None)
    workers = max(1, workers or (4 if device == "cuda" else len(os.sched_getaffinity(0))))
    pool, gate = _Pool(env, min(workers, len(srcs) - 1)), _Gate(_gpu_lock_path(0)) if device == "cuda" else None

    def one(src: str) -> dict:
        return _lint_report(lambda: _run_job(pool.take(), {"kind": "lint", "src": src, "device": device,
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
        p.add_argument("--json", action="store_true", help="one JSON object per line")
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
