"""harness/instrumentation.py: what the harness installs in a worker before a candidate is imported, and verifies
after every candidate phase. Runs inside a worker process only (harness/worker.py's stages 2-5).

What it installs (Instrumentation) and why
  - An op recorder (a TorchDispatchMode) that counts the aten ops a candidate's forward runs outside a short list of
    glue ops (_GLUE_OPS: allocation, views, copies): any other is a PyTorch fallback (pitfall 11).
  - A launch counter on Triton's JITFunction.run (the candidate's own @triton.jit kernels; pitfall 11), and
    load_inline routed to cuda_ext/build.py's fast cached build, with each build recorded (its kernels' names are
    what the profiler must find).
  - The shared GPU turn given back while a Triton kernel compiles (off_gpu) and between two trials when a timer waits
    (yield_turn): a timer waits for other workers' GPU work only.
  - Around each candidate call (candidate_call): the caching allocator's free blocks NaN-filled
    (_poison_cuda_allocator) and deterministic mode's fill of uninitialized memory switched on (pitfall 1).
  - An audit hook (sys.addaudithook, PEP 578; it cannot be removed) that notes when the candidate's own code asks
    for frames or live objects: sys._getframe and sys._current_frames (also through logging.currentframe,
    traceback.walk_stack or inspect), gc.get_objects / get_referrers / get_referents, and a traceback's, generator's
    or coroutine's frame. The reference's outputs for the call the candidate is in lie in the worker's frames, so a
    candidate could copy them with its own kernel and compute nothing (pitfall 17); the static check rejects the
    routes it can name, this catches an alias it cannot follow (`s = sys; s._getframe(2)`). Library code asking
    for frames (a traceback printed by torch, Triton reading its kernels' source) is not the candidate's and is not
    noted.

What it verifies (verify): an identity snapshot of the functions and flags the harness relies on (torch's
comparisons, timers, Module.__call__, TF32 switches, Triton's launchers, every function of every harness module:
pitfall 6; the verdict's way to the parent, Transport: Connection's and ForkingPickler's methods, copyreg's
dispatch table, KernelResult's pickling hooks, check "transport": pitfall 21) and of what the reference's source
may call (_reference_reaches: a rebound torch function could slow the reference, which is timed after the
candidate's import: pitfalls 6 with 15); the flags flipped inside a call; the thread count (pitfall 4); the
candidate's introspection that the audit hook noted.

How it departs from KernelBench's eval, which runs the candidate as it is: every item above. Nothing to run:
harness/worker.py imports it; it imports harness/processes.py (the GPU turn) and harness/static_checks.py
(HARNESS_MODULES), neither of which imports it: no import cycle. To a candidate it is part of the harness:
harness/static_checks.py bans importing it, and the snapshot covers its own functions too.
"""
from __future__ import annotations
import ast
import collections
import contextlib
import inspect
import logging
import os
import sys
import threading
import time
import traceback
import warnings
from types import FunctionType as _FunctionType

import torch

from harness.processes import gpu_turn, pass_turn, yield_turn
from harness.static_checks import HARNESS_MODULES


# ---------------------------------------------------------------------------------------------------------------------
# The op recorder, the launch counter, the GPU turn around compiles, the poisoned calls

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


class Instrumentation:
    """Everything the harness installs in a worker before the candidate is imported, and verifies afterwards."""

    def __init__(self, backend: str, device: str, module_name: str, ref_src: str = ""):
        from torch.utils._python_dispatch import TorchDispatchMode
        self.device, self.module_name = device, module_name
        self.launches = collections.Counter()   # own kernel name -> launches during forward
        self.ops = collections.Counter()        # non-glue aten ops during forward (outside own launches)
        self.builds = []                        # load_inline calls: {"name", "cuda_sources"}
        self.recording, self.paused = False, 0
        self.turn = None                        # the job's connection while it holds a shared GPU turn
        self.conn = None                        # the job's connection: each Triton JIT compile is announced on it
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
        self.transport = Transport()   # (its state is in the snapshot: made once, looked up again at every verify)
        self.snapshot = _harness_snapshot(self.reaches, self.transport)
        self.threads = threading.active_count()
        self.introspection = []                 # what the audit hook saw the candidate's code ask for
        sys.addaudithook(_introspection_hook(os.path.abspath(module_name + ".py"), self.introspection))

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
                with self.off_gpu(), self.compiling():
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
        harness.processes.Gate)."""
        if self.turn is None:   # (no shared turn held: e.g. the GPU held alone, keep it)
            yield
            return
        conn, self.turn = self.turn, None
        pass_turn(conn, self.device, "none")
        try:
            yield
        finally:
            gpu_turn(conn, "shared")
            self.turn = conn

    @contextlib.contextmanager
    def compiling(self):
        """One Triton JIT compile, announced to the parent (run_job), which gives it its own time limit (jit_timeout)
        inside the phase's: a kernel that unrolls into megabytes of PTX keeps ptxas busy for minutes. The parent's
        kill of the worker's process group ends ptxas too."""
        if self.conn is None:
            yield
            return
        self.conn.send(("jit", True))
        try:
            yield
        finally:
            self.conn.send(("jit", False))

    def yield_turn(self) -> None:
        """Between two correctness trials: a timer waiting for this GPU gets it now, not after this candidate's
        whole check (harness.processes.yield_turn)."""
        if self.turn is not None:
            yield_turn(self.turn, self.device)

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
        now = _harness_snapshot(self.reaches, self.transport)
        changed = [k for k, v in self.snapshot.items() if not _same_ref(v, now.get(k))]
        if changed:
            check = "tf32" if any("tf32" in k or "precision" in k for k in changed) else \
                "transport" if any(k.startswith("transport ") for k in changed) else "monkeypatch"
            if check == "transport":   # (naming an added method too, not only its class's count of entries)
                changed = self.transport.changed() + [k for k in changed if not k.startswith("transport ")]
            return check, f"the candidate changed {', '.join(changed[:8])}"
        if self.problems:
            return "monkeypatch", self.problems[0]
        if self.introspection:
            return "introspection", self.introspection[0]
        if threading.active_count() > self.threads:
            return "threads", f"{threading.active_count() - self.threads} new thread(s) still alive"
        return None


# ---------------------------------------------------------------------------------------------------------------------
# The audit hook: the candidate asking for frames or live objects

_FRAME_EVENTS = {"sys._getframe", "sys._current_frames", "gc.get_objects", "gc.get_referrers", "gc.get_referents"}
_FRAME_ATTRS = {"tb_frame", "gi_frame", "cr_frame", "ag_frame"}   # audited reads ("object.__getattr__" events)
# standard-library functions that hand the frame they get on to their caller (logging.currentframe is a lambda):
# who called them asked. (Not their other callers: logging.warning finds its caller's line through currentframe.)
_FRAME_HELPERS = {os.path.abspath(m.__file__) for m in (logging, traceback, inspect)}
_FRAME_HANDOUTS = {"<lambda>", "currentframe", "walk_stack", "stack", "trace"}


def _introspection_hook(candidate_file: str, seen: list):
    """An audit hook (PEP 578) that appends to `seen` what the candidate's own code (code from `candidate_file`)
    asked for: an event of _FRAME_EVENTS called by it (or by a _FRAME_HANDOUTS function of _FRAME_HELPERS that it
    called), or a frame attribute of _FRAME_ATTRS it read itself. Runs for every audit event of the process, so it
    returns at once for the others; the frame lookup inside it raises an event of its own, hence the guard."""
    busy = [False]

    def hook(event: str, args: tuple) -> None:
        attr = event == "object.__getattr__" and len(args) > 1 and args[1] in _FRAME_ATTRS
        if busy[0] or not (attr or event in _FRAME_EVENTS):
            return
        busy[0] = True
        try:
            frame = sys._getframe(1)   # the Python code that raised the event (C functions have no frame)
            code = frame.f_code
            if not attr and code.co_filename in _FRAME_HELPERS and code.co_name in _FRAME_HANDOUTS:
                frame = frame.f_back   # (the helper returns the frame to its caller)
            if frame is not None and frame.f_code.co_filename == candidate_file and len(seen) < 8:
                seen.append(f"the candidate asked for {f'.{args[1]}' if attr else event + '()'} (frames or live "
                            f"objects: the stored reference outputs are among them)")
        finally:
            busy[0] = False
    return hook


# ---------------------------------------------------------------------------------------------------------------------
# The identity snapshot: the harness's functions and flags, and what the reference may call

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


# The verdict's way to the parent, which runs in the candidate's process: the worker's conn.send(("result", verdict,
# key)) is Connection.send -> ForkingPickler.dumps (io.BytesIO, the C pickler with a copy of copyreg.dispatch_table
# and ForkingPickler._extra_reducers; the KernelResult through its class's pickling hooks, copyreg._slotnames on its
# first pickle, its class found through sys.modules) -> Connection._send_bytes (struct.pack) -> Connection._send
# (os.write, a default argument). A candidate that reaches any of them (object.__subclasses__() hands out every class)
# could rewrite the genuine, keyed verdict on its way out: correct=True, a large speedup. Transport names them all.
_PICKLING_HOOKS = ("__reduce_ex__", "__reduce__", "__getstate__", "__setstate__", "__getattribute__", "__getattr__",
                   "__module__")   # (statically looked up on KernelResult: _static_lookup)
_TRANSPORT_GLOBALS = (("multiprocessing.connection", ("_ForkingPickler", "struct", "_write")),   # (immutable)
                      ("multiprocessing.reduction", ("ForkingPickler", "io", "copyreg", "pickle")),
                      ("io", ("BytesIO",)), ("struct", ("pack",)),
                      ("copyreg", ("dispatch_table", "_slotnames", "__newobj__", "__newobj_ex__", "_reconstructor",
                                   "__reduce_ex__")))
_TRANSPORT_BUILTINS = ("super", "len", "memoryview", "OSError")   # what those functions call by a global name


class Transport:
    """The verdict's transport (above), as it was when this was made (before any candidate code: the worker makes
    one at its start, Instrumentation one before the import). state(): its current state, {key: value}, compared by
    identity like the rest of the snapshot (_same_ref), about 150 entries: every entry of the dictionaries of
    Connection's and ForkingPickler's classes (and their count: an added method shadows nothing unseen), their
    functions' __code__ and defaults, the classes' metaclasses and MROs, the module globals of _TRANSPORT_GLOBALS
    (and the two multiprocessing modules' global counts: a global `len` would shadow the builtin), the builtins
    those functions call, sys.modules' entries for these modules and harness.verdict, KernelResult's pickling hooks
    and whether copyreg.dispatch_table or ForkingPickler._extra_reducers has an entry for it. restore(): everything
    back as it was (the worker sends its verdict only after that, so a verdict of a patched transport goes out
    through the genuine one), and a connection's own attributes too (only the job's connection: reached through the
    harness's objects, an instance attribute `send` would shadow the class's: Transport(conn) keeps its attributes
    as they were, changed(conn) and restore(conn) cover them)."""

    def __init__(self, conn=None):
        import builtins
        import copyreg
        import multiprocessing.connection as mc   # (it imports struct, multiprocessing.reduction io)
        import multiprocessing.reduction as mr
        from harness.verdict import KernelResult
        self.builtins, self.result = builtins, KernelResult
        self.classes = list(dict.fromkeys(k for c in (mc.Connection, mr.ForkingPickler) for k in c.__mro__[:-1]))
        self.connection = mc.Connection
        self.modules = {name: sys.modules[name] for name in (*dict(_TRANSPORT_GLOBALS), "harness.verdict")}
        self.tables = {"copyreg.dispatch_table": copyreg.dispatch_table,
                       "ForkingPickler._extra_reducers": mr.ForkingPickler._extra_reducers}
        self.own = {cls: dict(vars(cls)) for cls in self.classes}
        self.conn_attrs = dict(vars(conn)) if conn is not None else {}
        self.saved = self.state()

    def state(self) -> dict:
        snap, result = {}, self.result
        for cls in self.classes:
            label = f"transport {cls.__name__}"
            snap[label + ".__class__"], snap[label + ".__mro__"] = type(cls), cls.__mro__
            own = vars(cls)
            snap[label + " entries"] = len(own)
            for name, value in own.items():
                snap[f"{label}.{name}"] = value
                fn = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
                if type(fn) is _FunctionType:
                    snap[f"{label}.{name}.__code__"] = fn.__code__
                    snap[f"{label}.{name}.__defaults__"] = fn.__defaults__
                    snap[f"{label}.{name}.__kwdefaults__"] = fn.__kwdefaults__
        for module, names in _TRANSPORT_GLOBALS:
            found = vars(self.modules[module])
            for name in names:
                snap[f"transport {module}.{name}"] = found.get(name)
            if module.startswith("multiprocessing."):
                snap[f"transport {module} globals"] = len(found)
        for name, module in self.modules.items():
            snap[f"transport sys.modules[{name!r}]"] = sys.modules.get(name) is module
        for name in _TRANSPORT_BUILTINS:
            snap[f"transport builtins.{name}"] = vars(self.builtins).get(name)
        snap["transport KernelResult.__class__"] = type(result)
        for name in _PICKLING_HOOKS:
            snap[f"transport KernelResult.{name}"] = _static_lookup(result, name)
        snap["transport KernelResult.__qualname__"] = result.__qualname__
        for label, table in self.tables.items():
            snap[f"transport {label}[KernelResult]"] = result in table
        return snap

    def changed(self, conn=None) -> list[str]:
        """What differs from the state at construction; with `conn` (the one given then), its class and its own
        attributes too."""
        now = self.state()
        changed = [k for k, v in self.saved.items() if not _same_ref(v, now.get(k))]
        changed += [f"transport {cls.__name__}.{name} (added)" for cls, own in self.own.items() for name in vars(cls)
                    if name not in own]
        if conn is not None:
            if type(conn) is not self.connection:
                changed.append("transport the connection's class")
            changed += [f"transport the connection's {k}" for k, v in vars(conn).items()
                        if k not in self.conn_attrs or not _same_ref(v, self.conn_attrs[k])]
        return changed

    def restore(self, conn=None) -> None:
        """Put back everything state() covers as it was at construction, and `conn`'s own attributes and class as
        they were then. Idempotent; cheap when nothing changed."""
        saved, result = self.saved, self.result
        for cls, own in self.own.items():
            label = f"transport {cls.__name__}"
            if type(cls) is not saved[label + ".__class__"]:
                cls.__class__ = saved[label + ".__class__"]
            if cls.__mro__ != saved[label + ".__mro__"]:
                cls.__bases__ = saved[label + ".__mro__"][1:2]
            for name in [n for n in vars(cls) if n not in own]:
                delattr(cls, name)
            for name, value in own.items():
                if vars(cls).get(name) is not value:
                    setattr(cls, name, value)
            for name, value in own.items():
                fn = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
                if type(fn) is _FunctionType:
                    for attr in ("__code__", "__defaults__", "__kwdefaults__"):
                        if getattr(fn, attr) is not saved[f"{label}.{name}.{attr}"]:
                            setattr(fn, attr, saved[f"{label}.{name}.{attr}"])
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                sys.modules[name] = module
        for module, names in _TRANSPORT_GLOBALS:
            found = vars(self.modules[module])
            for name in names:
                if found.get(name) is not saved[f"transport {module}.{name}"]:
                    found[name] = saved[f"transport {module}.{name}"]
            if module.startswith("multiprocessing."):   # a global added there (one shadowing a builtin, say)
                for name in list(found)[saved[f"transport {module} globals"]:]:
                    del found[name]
        found = vars(self.builtins)
        for name in _TRANSPORT_BUILTINS:
            if found.get(name) is not saved[f"transport builtins.{name}"]:
                found[name] = saved[f"transport builtins.{name}"]
        if type(result) is not saved["transport KernelResult.__class__"]:
            result.__class__ = saved["transport KernelResult.__class__"]
        for name in _PICKLING_HOOKS:   # (KernelResult's own dictionary has none of them but __module__)
            if not _same_ref(_static_lookup(result, name), saved[f"transport KernelResult.{name}"]):
                if name in vars(result):
                    delattr(result, name)
                if not _same_ref(_static_lookup(result, name), saved[f"transport KernelResult.{name}"]):
                    setattr(result, name, saved[f"transport KernelResult.{name}"])
        if result.__qualname__ != saved["transport KernelResult.__qualname__"]:
            result.__qualname__ = saved["transport KernelResult.__qualname__"]
        for table in self.tables.values():
            table.pop(result, None)
        if conn is not None:
            if type(conn) is not self.connection:
                conn.__class__ = self.connection
            for name in [k for k in vars(conn) if k not in self.conn_attrs]:
                delattr(conn, name)
            vars(conn).update(self.conn_attrs)


def _harness_snapshot(reaches: list[str], transport: Transport) -> dict:
    """The functions and flags the harness relies on; compared by identity (functions) or value (flags). `reaches`
    (from _reference_reaches) names what the reference may call: each is looked up again, by the same route.
    `transport` (made once, before the candidate runs): the verdict's way to the parent, its state in the snapshot."""
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
    # a candidate's outputs reach a reference server through torch's sharing reductions (harness.compare.share): a
    # patched one would send other tensors than the candidate returned
    import torch.multiprocessing.reductions as reductions
    for name in ("reduce_tensor", "reduce_storage"):
        snap[f"reductions.{name}"] = getattr(reductions, name)
        snap[f"reductions.{name}.__code__"] = getattr(reductions, name).__code__
    for name in ("_share_cuda_", "_share_filename_cpu_", "share_memory_"):
        snap[f"torch.UntypedStorage.{name}"] = _static_lookup(torch.UntypedStorage, name)
    modules = [sys.modules[name] for name in HARNESS_MODULES if name in sys.modules]
    own = {module.__name__ for module in modules}
    for module in modules:
        for name, obj in vars(module).items():
            if callable(obj) and getattr(obj, "__module__", None) in own:
                snap[f"{module.__name__}.{name}"] = obj
                if type(obj) is _FunctionType:   # (its code swapped in place keeps its identity)
                    snap[f"{module.__name__}.{name}.__code__"] = obj.__code__
                elif isinstance(obj, type) and obj.__module__ == module.__name__:
                    # the methods of the harness's classes, where they are defined (a class is reachable from
                    # object.__subclasses__(): Instrumentation.verify replaced would see nothing)
                    for attr, value in vars(obj).items():
                        if type(value) is _FunctionType:
                            snap[f"{module.__name__}.{name}.{attr}"] = value
                            snap[f"{module.__name__}.{name}.{attr}.__code__"] = value.__code__
    snap.update(transport.state())
    return snap


# ---------------------------------------------------------------------------------------------------------------------
# The allocator poison: every free block NaN-filled before a candidate call

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
