"""Tests for the harness (eval_harness.py, harness/processes.py and the worker side, harness/*.py): known-good
candidates, one adversarial candidate per pitfall row (the table in eval_harness.py's docstring; CASES in
tests/common.py), isolation (timeouts, crashes, no processes left), the GPU gate, CLI, lint.

CPU tests run Triton candidates under the interpreter. Most CPU cases are evaluated together in one Evaluator batch
per option set (worker start-up is the expensive part on a 2-core machine) and each test asserts its own verdict.
GPU tests: `python -m pytest -q -m gpu tests/test_harness.py` on a machine with CUDA.
"""
import collections
import functools
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
import torch

import eval_harness as eh
import harness.compare as hc
import harness.instrumentation as hi
import harness.processes as hp
import harness.timing as ht
import harness.verdict as hv
import harness.worker as hw
from tests.common import (ADD_TASK, CASES, CE_TASK, CONV_TASK, FORGED_VERDICT, GOOD_ADD, GOOD_AUTOTUNED, GOOD_MATMUL,
                          GOOD_RELU, GPU_MATMUL_TASK, GPU_RELU_TASK, HANG, MATMUL_SRC, MEAN_TASK, RAISE, RELU_KERNEL,
                          RELU_TASK, ROOT, SEGFAULT, WRONG, _HEADER, _harness_relu, stored_output_copier)

# ----------------------------------------------------------------------------------------------------------------------
# Correctness and anti reward hacking: the rows of CASES and HANG_CASES, one Evaluator batch per option set

HANG_CASES = {   # short run/compile limits
    "hang": (RELU_TASK, HANG, "timeout", None),
    "hang_at_import": (RELU_TASK, "import time\ntime.sleep(1000)\n" + GOOD_RELU, "timeout", None),
}


@functools.lru_cache(maxsize=None)
def _harness_batch(group: str) -> dict:
    """Evaluate every case of a group in one Evaluator (2 workers); name -> KernelResult."""
    cases, opts = {"main": (CASES, {}), "hang": (HANG_CASES, {"run_timeout": 5, "compile_timeout": 5})}[group]
    names = list(cases)
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False, **opts) as ev:
        results = ev.map([(cases[n][0], cases[n][1]) for n in names])
    return dict(zip(names, results))


def _harness_check(name: str, group: str = "main") -> eh.KernelResult:
    cases = CASES if group == "main" else HANG_CASES
    _, _, kind, check = cases[name]
    result = _harness_batch(group)[name]
    assert result.error_kind == kind, (name, result.error_kind, result.error, result.details)
    assert result.correct == (kind == "ok")
    if check:
        assert result.details.get("check") == check, (name, result.details, result.error)
    json.dumps(eh.dataclasses.asdict(result))   # JSON-serialisable
    return result


@pytest.mark.parametrize("name", sorted(CASES))
def test_harness_case(name):
    result = _harness_check(name)
    if result.error_kind == "ok":
        assert result.compiled and result.details["trials"] == 6 and result.details["heavy_trial"]
        assert result.speedup is None and result.runtime_ms is None   # CPU: correctness only
        assert sum(result.details["launches"].values()) >= 6


@pytest.mark.parametrize("name", sorted(HANG_CASES))
def test_harness_hang_is_timeout(name):
    result = _harness_check(name, "hang")
    assert result.details["phase"] == ("run" if name == "hang" else "compile")


def test_harness_failure_messages_are_specific():
    batch = _harness_batch("main")
    assert "NaN" in batch["stale_memory"].error
    assert "SIGSEGV" in batch["segfault"].error
    assert "relu" in batch["pytorch_fallback"].error
    assert "ValueError: boom" in batch["raises"].error
    assert "(4095,)" in batch["wrong_values"].error
    assert "allclose" in batch["patch_allclose_runtime"].error


def test_harness_cross_entropy_targets_stay_integer():
    # the reference itself would raise on float targets; ok proves they reached both models as int64
    assert _harness_batch("main")["good_cross_entropy"].error_kind == "ok"


def test_harness_analytic_shortcut_fails_heavy_trial():
    # With KernelBench v0's 1e-2 tolerance, the constant E[x] = 0.5 passes every uniform trial; only the
    # heavy-tailed trial (inputs times a log-normal factor) exposes the shortcut (pitfall 9).
    shortcut = _HEADER + '''
@triton.jit
def const_kernel(y_ptr):
    tl.store(y_ptr + tl.arange(0, 1), tl.full((1,), 0.5, tl.float32))

class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty(1, device=x.device)
        const_kernel[(1,)](y)
        return y
'''
    result = eh.evaluate(MEAN_TASK, shortcut, backend="triton", device="cpu", atol=1e-2, rtol=1e-2)
    assert result.error_kind == "mismatch" and result.details["failed_trial"] == "heavy", result


def test_harness_cuda_backend_on_cpu_is_unsupported():
    result = eh.evaluate(RELU_TASK, GOOD_RELU, backend="cuda", device="cpu")
    assert result.error_kind == "unsupported" and "GPU" in result.error and not result.correct
    if not torch.cuda.is_available():
        assert eh.evaluate(RELU_TASK, GOOD_RELU, backend="cuda").error_kind == "unsupported"


def test_harness_static_check_sources():
    def check(src):
        return eh._precheck(src, "cuda")
    cuda = ('import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n'
            'src = """__global__ void k(float* x) {{ {body} }}"""\n'
            'ext = load_inline(name="e", cpp_sources="", cuda_sources=src)\nclass ModelNew(nn.Module):\n    pass\n')
    assert check(cuda.format(body="")) is None
    assert check("import os\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0'\n" + cuda.format(body="")) is None
    hit = check(cuda.format(body="auto s = at::cuda::getStreamFromPool();"))
    assert hit.error_kind == "reward_hack" and hit.details["check"] == "side_stream"
    assert check(cuda.replace("__global__", "")).error_kind == "format"
    # the extension's C/C++ runs in the worker too: files, the pipe's descriptors, processes (a comment or a member
    # function of that name is no such call)
    for body, name in [('FILE* f = fopen("harness/compare.py", "a");', "writes_files"),
                       ("std::ofstream f; f.close();", "writes_files"), ("write(3, x, 8);", "file_descriptors"),
                       ("::dup2(4, 3);", "file_descriptors"), ('system("true");', "processes")]:
        hit = check(cuda.format(body=body))
        assert hit.error_kind == "reward_hack" and hit.details["check"] == name, (body, hit)
    assert check(cuda.format(body="/* a coordinate system (x, y); write(fd) */ out.write(1); p->open(2);")) is None
    assert check('"""Tiles we open (load) and write (store) once."""\n' + cuda.format(body="")) is None   # prose
    for line, name in [("import ctypes", "ctypes"), ("import subprocess", "processes"), ("import os\nos.fork()", "processes"),
                       ("import gc\ngc.get_objects()", "introspection"), ("import inspect", "introspection"),
                       ("import gc\nf = getattr(gc, 'get_' + 'objects')", "introspection"),
                       ("import sys\nm = getattr(sys, 'mod' + 'ules')", "introspection"),
                       ("import os\npid = getattr(os, 'fo' + 'rk')()", "introspection"),
                       ("torch.set_float32_matmul_precision('high')", "tf32"), ("exec('x=1')", "dynamic_code"),
                       ("import time\ntime.perf_counter = lambda: 0.0", "monkeypatch"),
                       ("import torch.nn.functional as F\nF.relu = None", "monkeypatch"),
                       ("import concurrent.futures", "threads"), ("import eval_harness", "monkeypatch"),
                       ("import harness.worker", "monkeypatch"), ("from harness.worker import compare", "monkeypatch"),
                       ("from harness.compare import judge_numbers", "monkeypatch"),
                       ("import harness.timing as t", "monkeypatch"),
                       ("import harness.instrumentation\nharness.instrumentation._GLUE_OPS = set()", "monkeypatch"),
                       ("from harness.processes import run_job", "monkeypatch"),
                       # the package by any spelling: its name is the banned root
                       ("import harness", "monkeypatch"), ("from harness import processes", "monkeypatch"),
                       ("from harness import worker as w", "monkeypatch"),
                       ("import harness.static_checks", "monkeypatch"),
                       ("from harness.static_checks import HARNESS_MODULES", "monkeypatch"),
                       ("from eval_harness import truncate", "monkeypatch"),
                       ("f = torch.compile(lambda x: x)", "torch_compile"), ("y = x.numpy()", "host_compute"),
                       ("import sys\nsys.settrace(None)", "introspection"),
                       # routes to frames and live objects (the stored reference outputs are in the worker's frames)
                       ("f = getattr(tb, 'tb_frame')", "introspection"),
                       ("f = getattr(tb, 'tb_' + 'frame')", "introspection"),
                       ("def f(self):\n    return getattr(self, 'f_' + 'back')", "introspection"),
                       ("import operator\nget = operator.attrgetter('f_locals')", "introspection"),
                       ("import sys\nf = getattr(sys, '_getframe')(1)", "introspection"),
                       ("import logging\nf = logging.currentframe()", "introspection"),
                       ("import traceback\nfs = traceback.walk_stack(None)", "introspection"),
                       ("objs = torch.cuda.graphs.gc.get_objects()", "introspection"),
                       ("g = torch.cuda.graphs.gc", "introspection"),
                       ("m = torch.cuda.graphs.sys.modules", "sys_modules"),
                       ("blocks = torch.cuda.memory_snapshot()", "introspection"),
                       ("from torch.cuda.memory import _snapshot", "introspection"),
                       ("imp = __builtins__['__import__']", "introspection"), ("g = globals()", "introspection"),
                       ("import sys\nm = vars(sys)['modules']", "introspection"),
                       ("import sys\nf = sys.__dict__['_getframe']", "introspection"),
                       ("ga = getattr", "introspection"), ("m = vars(x)", "introspection"),
                       ("f = object.__getattribute__(tb, 'tb_' + 'frame')", "introspection"),
                       ("y = getattr(x, 'numpy')()", "host_compute"),
                       # the verdict's transport (pitfall 21): every class through __subclasses__, by any spelling,
                       # a closure's cells, what pickles the verdict
                       ("c = object.__subclasses__()", "introspection"),
                       ("c = type.__subclasses__(object)", "introspection"),
                       ("c = ().__class__.__base__.__subclasses__()", "introspection"),
                       ("c = getattr(object, '__subclasses__')()", "introspection"),
                       ("import operator\nc = operator.methodcaller('__subclasses__')", "introspection"),
                       ("c = f.__closure__[0].cell_contents", "introspection"),
                       ("import copyreg\ncopyreg.dispatch_table[int] = None", "monkeypatch"),
                       ("import copyreg\ncopyreg.pickle(int, None)", "monkeypatch"),
                       ("import io\nio.BytesIO = None", "monkeypatch"),
                       ("import pickle as p\np.Pickler.dump = None", "monkeypatch"),
                       ("try:\n    pass\nexcept Exception:\n    torch.relu(x)", "try_except_fallback")]:
        hit = check(line + "\n" + cuda.format(body=""))
        assert hit is not None and hit.details["check"] == name, (line, hit)
    # what stays allowed: a harmless constant name, setattr with a computed name, vars() of the own frame
    for line in ["shape = getattr(x, 'shape')", "class M(nn.Module):\n    def s(self, i, w):\n"
                 "        setattr(self, f'w{i}', w)", "n = len(vars())", "name = 'f_locals and f_back'"]:
        assert check(line + "\n" + cuda.format(body="")) is None, line


def test_harness_stored_outputs_reached_through_frames_are_caught_at_run_time_too(monkeypatch):
    """The reference's output for the call a candidate is in lies in the worker's frames: a candidate that walks up
    to it and copies it with its own kernel computes no ReLU and passes every comparison. The static check rejects
    it (CASES "stored_outputs_through_*"); with the static check switched off in the parent, the worker's audit hook
    still sees the candidate read a traceback's frame, and an alias the static check does not follow (`_s = sys`)
    or a standard-library helper that hands frames on (logging.currentframe) is seen the same way. A candidate that
    formats a traceback or logs a line (the library reads the frames, for itself) stays ok."""
    copier = stored_output_copier("getattr")
    blind = copier.replace("src = stored_output()", "src = None")   # the same kernel, the frames never read: wrong
    assert blind != copier
    good = GOOD_RELU.split("def forward(self, x):\n")[1]
    alias = _harness_relu("_s = sys\nframe = _s._getframe(1)\n" + textwrap.dedent(good), extra="import sys\n")
    helper = _harness_relu("_l = logging\nframe = _l.currentframe()\n" + textwrap.dedent(good),
                           extra="import logging\n")
    formats = _harness_relu("try:\n    raise KeyError\nexcept KeyError:\n    text = traceback.format_exc()\n"
                            "logging.warning('kz: a log line finds its caller through a frame')\n"
                            + textwrap.dedent(good), extra="import logging\nimport traceback\n")
    assert eh._precheck(alias, "triton") is None and eh._precheck(helper, "triton") is None
    monkeypatch.setattr(eh.static_checks, "static_check", lambda tree, aliases: None)
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False) as ev:
        results = ev.map([(RELU_TASK, c) for c in (copier, alias, helper, formats, blind)])
    verdicts = [(r.error_kind, r.details.get("check")) for r in results]
    assert verdicts == [("reward_hack", "introspection")] * 3 + [("ok", None), ("mismatch", None)], \
        [(v, r.error) for v, r in zip(verdicts, results)]
    assert ".tb_frame" in results[0].error and "sys._getframe" in results[1].error


def test_harness_transport_patches_are_seen_and_put_back():
    """Pitfall 21, the run-time layer in-process: each way a candidate could rewrite the verdict on its way to the
    parent (Connection's methods and a method added to its class, a function's code, ForkingPickler, copyreg's
    dispatch table, KernelResult's pickling hooks, io.BytesIO, the job connection's own attributes) is in the
    identity snapshot (check "transport") and in the worker's last check before the verdict is sent, and restore()
    puts it back, so the verdict goes out through the genuine transport. CASES' transport_* rows do it from a
    candidate, through a route the static check does not see."""
    import copyreg
    import io
    import multiprocessing.connection as mc
    import multiprocessing.reduction as mr
    reader, writer = mc.Pipe(duplex=False)
    try:
        transport = hi.Transport(writer)
        instr = hi.Instrumentation("none", "cpu", "kz_candidate")
        assert transport.changed(writer) == [] and instr.verify() is None

        def flip(self, obj):
            return None
        patches = [(lambda: setattr(mc.Connection, "send", flip), "Connection.send (added)"),
                   (lambda: setattr(mc._ConnectionBase, "send", flip), "_ConnectionBase.send"),
                   (lambda: setattr(mc.Connection, "_send", flip), "Connection._send"),
                   (lambda: setattr(mc._ConnectionBase._check_closed, "__code__", flip.__code__),
                    "_ConnectionBase._check_closed.__code__"),
                   (lambda: setattr(mc.Connection._send, "__defaults__", (flip,)), "Connection._send.__defaults__"),
                   (lambda: setattr(mr.ForkingPickler, "reducer_override", flip), "ForkingPickler.reducer_override"),
                   (lambda: setattr(mr.ForkingPickler, "dumps", classmethod(flip)), "ForkingPickler.dumps"),
                   (lambda: setattr(mc, "_ForkingPickler", None), "multiprocessing.connection._ForkingPickler"),
                   (lambda: setattr(mc, "len", flip), "multiprocessing.connection globals"),
                   (lambda: copyreg.dispatch_table.__setitem__(hv.KernelResult, flip),
                    "copyreg.dispatch_table[KernelResult]"),
                   (lambda: mr.ForkingPickler.register(hv.KernelResult, flip),
                    "ForkingPickler._extra_reducers[KernelResult]"),
                   (lambda: setattr(hv.KernelResult, "__reduce_ex__", flip), "KernelResult.__reduce_ex__"),
                   (lambda: setattr(hv.KernelResult, "__getstate__", flip), "KernelResult.__getstate__"),
                   (lambda: setattr(io, "BytesIO", flip), "io.BytesIO"),
                   (lambda: setattr(writer, "send", flip), "the connection's send")]
        for patch, what in patches:
            patch()
            try:
                changed = transport.changed(writer)
                assert any(what in k for k in changed), (what, changed)
                if not what.startswith("the connection"):
                    check, message = instr.verify()
                    assert check == "transport" and what in message, (what, message)
            finally:
                transport.restore(writer)
            assert transport.changed(writer) == [] and instr.verify() is None, what
        # put back, the genuine transport carries the verdict as it is
        writer.send(("result", hv.verdict("reward_hack", "x", details={"check": "transport"}), 7))
        got = reader.recv()
        assert hv.well_formed(got[1]) and got[1].error_kind == "reward_hack" and got[2] == 7
    finally:
        reader.close()
        writer.close()


def test_harness_instrumentation_counts_threads():
    import threading
    instr = hi.Instrumentation("none", "cpu", "kz_candidate")
    assert instr.verify() is None
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert instr.verify()[0] == "threads"
    finally:
        stop.set()
        worker.join()


def test_harness_build_patch_does_not_trip_the_snapshot():
    import torch.utils.cpp_extension as cpp
    original = cpp.load_inline
    try:
        instr = hi.Instrumentation("cuda", "cpu", "kz_candidate")   # routes load_inline to the cached builder
        assert cpp.load_inline is not original
        assert instr.verify() is None
        cpp.load_inline = original   # what a candidate restoring/replacing it would do
        assert instr.verify()[0] == "monkeypatch"
    finally:
        cpp.load_inline = original


def test_harness_module_imported_after_the_snapshot_is_not_a_patch():
    """A CUDA worker does not import triton at start, but torch's profiler (the kernel-coverage check) does: the
    triton functions that appear after the snapshot must not read as monkey-patching (this failed every CUDA
    candidate on the GPU)."""
    import torch.utils.cpp_extension as cpp
    from triton.runtime.jit import JITFunction
    original = cpp.load_inline
    try:
        instr = hi.Instrumentation("cuda", "cpu", "kz_candidate")
        for key in [k for k in instr.snapshot if k.split(".")[0] in ("JITFunction", "KernelInterface", "Autotuner",
                                                                     "InterpretedFunction")]:
            del instr.snapshot[key]   # as if triton had not been imported when the worker took its snapshot
        assert instr.verify() is None
        run = JITFunction.run
        JITFunction.run = lambda *a, **k: None   # patching what *was* in the snapshot is still caught
        try:
            instr.snapshot["JITFunction.run"] = run
            assert instr.verify()[0] == "monkeypatch"
        finally:
            JITFunction.run = run
    finally:
        cpp.load_inline = original


def test_harness_snapshot_covers_every_harness_module():
    """The harness runs in a candidate's process as eval_harness.py and every module of the package harness/
    (harness.static_checks.HARNESS_MODULES: processes.py, static_checks.py, verdict.py and the worker side in four
    files): the
    identity snapshot holds the functions of all of them, and the bindings each imported from the others, so a patch
    of any of them reads as monkeypatch (pitfall 6). CASES' patch_worker_* rows do it from a candidate."""
    assert eh._precheck(CASES["patch_worker_runtime"][1], "triton") is None   # only the snapshot can see that one
    assert eh._precheck(CASES["patch_worker_static"][1], "triton").details["check"] == "monkeypatch"
    package = os.path.dirname(os.path.abspath(hi.__file__))   # every module of the package is listed, and banned
    names = {"harness"} | {"harness." + f[:-3] for f in os.listdir(package) if f.endswith(".py") and f != "__init__.py"}
    assert names | {"eval_harness"} == set(eh.static_checks.HARNESS_MODULES)
    for name in names | {"eval_harness"}:
        assert eh._precheck(f"import {name}\n" + GOOD_RELU, "triton").details["check"] == "monkeypatch", name
    instr = hi.Instrumentation("none", "cpu", "kz_candidate")
    for key in ("harness.worker.compare", "harness.worker._job_evaluate", "harness.worker.Instrumentation",
                "harness.worker.truncate", "harness.worker.memory_need", "eval_harness.truncate",
                "harness.processes.run_job", "harness.processes.memory_need", "harness.processes.yield_turn",
                "harness.compare.judge_numbers", "harness.timing.time_models", "harness.timing.compare",
                "harness.instrumentation._harness_snapshot", "harness.instrumentation.gpu_turn",
                "harness.static_checks.static_check", "harness.static_checks.banned_name",
                "harness.verdict.verdict", "harness.verdict.well_formed", "harness.worker.verdict",
                "harness.processes.well_formed", "harness.processes.JobRun", "eval_harness.KernelResult"):
        assert key in instr.snapshot, key
    assert instr.verify() is None
    for module, name in ((hw, "compare"), (hw, "_job_evaluate"), (hw, "truncate"), (eh, "truncate"),
                         (eh, "verdict"), (hw, "verdict"), (hv, "verdict"), (hp, "well_formed"),
                         (hp, "memory_need"), (hc, "judge_numbers"), (ht, "time_models"),
                         (ht, "compare"), (hi, "_poison_cuda_allocator"), (hi, "yield_turn"),
                         (eh.static_checks, "banned_name")):
        original = getattr(module, name)
        setattr(module, name, lambda *a, **k: None)
        try:
            assert instr.verify()[0] == "monkeypatch", (module.__name__, name)
        finally:
            setattr(module, name, original)
    assert instr.verify() is None
    # a harness class's method, reachable from object.__subclasses__(), and a function's code swapped in place
    verify = hi.Instrumentation.verify   # (the genuine one, as the worker holds it)
    for owner, name in ((hi.Instrumentation, "verify"), (hp.JobRun, "__init__"), (hv.KernelResult, "__init__")):
        original = vars(owner)[name]
        setattr(owner, name, lambda *a, **k: None)
        try:
            assert verify(instr)[0] == "monkeypatch", (owner, name)
        finally:
            setattr(owner, name, original)
    code = hc.judge_numbers.__code__
    hc.judge_numbers.__code__ = (lambda n, v, s, a, r: (None, None, "")).__code__
    try:
        assert instr.verify()[0] == "monkeypatch"
    finally:
        hc.judge_numbers.__code__ = code
    assert instr.verify() is None


def _fake_caching_allocator(segments: list[tuple[str, int, tuple, list[tuple[int, str]]]]):
    """torch's CUDA caching allocator in miniature (c10/cuda/CUDACachingAllocator.cpp), for requests on stream 0 out
    of the default pool (0, 0): requests of <= 1 MiB come from the small pool (2 MiB segments), larger ones from the
    large pool; the best fit (smallest free block that holds the request) is split when what remains is >= 512 bytes
    (small) or > 1 MiB (large); no fit: a new segment. `segments`: (type, stream, pool id, [(size, state)]).
    Returns (memory_snapshot, empty, state): the two stand-ins and the segments, whose blocks record what was free
    at the start ("stale") and what a request took."""
    mib = 1 << 20
    state = {"segments": [{"segment_type": kind, "stream": stream, "segment_pool_id": pool,
                           "blocks": [{"size": size, "state": st, "stale": st == "inactive", "taken": False}
                                      for size, st in blocks]}
                          for kind, stream, pool, blocks in segments], "new_segments": 0, "snapshots": 0}

    def memory_snapshot():
        state["snapshots"] += 1
        return [{**seg, "blocks": [{"size": b["size"], "state": b["state"]} for b in seg["blocks"]]}
                for seg in state["segments"]]

    def empty(size, dtype=None, device=None):
        if dtype is None:   # the poison's first allocation (torch.empty(1)), freed at once: leaves the blocks as they are
            return torch.zeros(size)
        kind = "small" if size <= mib else "large"
        fits = [(b["size"], seg, i) for seg in state["segments"]
                if (seg["segment_type"], seg["stream"], seg["segment_pool_id"]) == (kind, 0, (0, 0))
                for i, b in enumerate(seg["blocks"]) if b["state"] == "inactive" and b["size"] >= size]
        if not fits:
            state["new_segments"] += 1
            return torch.zeros(size, dtype=torch.uint8)
        _, seg, i = min(fits, key=lambda f: f[0])
        block, rest = seg["blocks"][i], seg["blocks"][i]["size"] - size
        if (rest >= 512) if kind == "small" else (rest > mib):
            seg["blocks"][i + 1:i + 1] = [{**block, "size": rest}]
            block["size"] = size
        block.update(state="active_allocated", taken=True)
        return torch.zeros(size, dtype=torch.uint8)

    return memory_snapshot, empty, state


def test_harness_poison_takes_every_free_block_also_small_ones_over_1_mib(monkeypatch):
    """Pitfall #1 (stale results in reused memory): before each candidate call every free block of the caching
    allocator that the candidate's stream can get is NaN-filled. A 2 MiB small segment can hold a free block of more
    than 1 MiB, which a request of its size misses (it goes to the large pool): the poison takes it in pieces over
    more passes, and takes every such block that was free, without a new segment. Another stream's blocks and a
    CUDA graph's private pool are not asked for (a request would only make new segments)."""
    mib = 1 << 20
    snapshot, empty, state = _fake_caching_allocator([
        ("small", 0, (0, 0), [(mib // 2, "active_allocated"), (3 * mib // 2, "inactive")]),   # over 1 MiB
        ("small", 0, (0, 0), [(2 * mib, "inactive")]),                                        # a whole free one
        ("small", 0, (0, 0), [(3 * mib // 2, "active_allocated"), (mib // 4, "inactive"),
                              (mib // 4, "active_allocated")]),
        ("large", 0, (0, 0), [(4 * mib, "active_allocated"), (16 * mib, "inactive")]),
        ("small", 77, (0, 0), [(2 * mib, "inactive")]),                                       # another stream
        ("large", 0, (1, 0), [(20 * mib, "inactive")])])                                     # a graph's pool
    monkeypatch.setattr(torch.cuda, "memory_snapshot", snapshot)
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: type("Stream", (), {"cuda_stream": 0})())
    requests, split = hi._free_block_requests(snapshot(), 0)
    assert sorted(requests) == [mib // 4, mib, mib, 16 * mib] and split   # the blocks over 1 MiB: 1 MiB first
    state["snapshots"] = 0
    hi._poison_cuda_allocator()
    reachable = [b for seg in state["segments"][:4] for b in seg["blocks"]]
    assert all(b["taken"] for b in reachable if b["stale"]), reachable
    assert not any(b["taken"] for seg in state["segments"][4:] for b in seg["blocks"])
    assert state["new_segments"] == 0 and state["snapshots"] == 2   # 1 MiB pieces, then what they left


def test_harness_static_lookup_finds_what_getattr_static_finds(monkeypatch):
    """The snapshot looks names up with _static_lookup (a tenth of inspect.getattr_static's cost, after every trial):
    for every task reference's reaches and the snapshot's own Tensor methods it finds the very objects
    getattr_static finds, and it sees a rebinding on the class a call starts from and on the base that defines it."""
    import glob
    import inspect
    import torch.nn.functional as F
    static = lambda owner, name: inspect.getattr_static(owner, name, None)
    sources = sorted(glob.glob(os.path.join(ROOT, "kernelbench_tasks", "level*", "*.py")))
    assert len(sources) > 50
    owners = {"F": F, "torch": torch, "torch.Tensor": torch.Tensor}
    for path in sources:
        for key in hi._reference_reaches(open(path).read()):
            owner, name = key.rsplit(".", 1)
            where = owners.get(owner) or static(torch.nn, owner.split(".")[-1])
            assert hi._static_lookup(where, name) is static(where, name), (path, key)
    for name in ("clone", "shape", "__eq__", "__torch_function__", "relu", "__init__"):
        assert hi._static_lookup(torch.Tensor, name) is static(torch.Tensor, name), name
    assert hi._static_lookup(torch, "__init__") is static(torch, "__init__")   # (from the module's type)
    assert hi._static_lookup(torch.nn, "NoSuchLayer") is None and hi._static_lookup(None, "relu") is None
    sneaky = lambda self, *args, **kwargs: self
    monkeypatch.setattr(torch.Tensor, "relu", sneaky)   # (defined on the C base, rebound on the class)
    assert hi._static_lookup(torch.Tensor, "relu") is sneaky
    monkeypatch.setattr(torch.nn.Module, "__call__", sneaky)   # a base's patch shows through its subclasses
    assert hi._static_lookup(torch.nn.Linear, "__call__") is sneaky


def test_harness_same_treats_nan_as_equal_and_sees_any_change():
    """The input-mutation check: bit-for-bit, NaN equal to NaN, one changed element or dtype is a difference."""
    x = torch.tensor([1.0, float("nan"), -0.5])
    assert hc.same(x, x.clone()) and hc.same(torch.arange(3), torch.arange(3))
    y = x.clone()
    y[2] = 0.5
    assert not hc.same(x, y) and not hc.same(x, torch.tensor([1.0, 0.0, -0.5]))
    assert not hc.same(torch.arange(3), torch.tensor([0, 1, 3])) and not hc.same(x, x.double())


def test_harness_extract_code():
    assert eh.extract_code("text\n```python\na = 1\n```\nmore\n```python\nb = 2\n```\nend") == "b = 2"
    assert eh.extract_code("```\nc = 3\n```") == "c = 3"
    assert eh.extract_code("```py\nd = 4\n```") == "d = 4"
    assert eh.extract_code("```python\ne = 5\n```\n```\nplain\n```") == "e = 5"   # python preferred over bare
    assert eh.extract_code("no code here") is None
    assert eh.extract_code("") is None
    assert eh.extract_code("```python\nunterminated = 1\n") is None
    assert eh.extract_code("```cpp\nint x;\n```") is None
    assert eh.extract_code("```python\n\n```") is None


# ----------------------------------------------------------------------------------------------------------------------
# Isolation: batches, process accounting, robustness

def _harness_processes_left(grace_s: float = 10.0) -> list[int]:
    """Harness processes of this checkout and this process still alive (not zombies) once `grace_s` has passed:
    zygotes (this process's children) and the workers forked from them, wherever they were reparented if their
    zygote died; another run's harness on the same checkout (KZ_OWNER, another pid) is not counted. A killed worker
    can take a moment to end (a CUDA context is torn down), hence the grace period."""
    marker = f"sys.path.insert(0, {os.path.dirname(os.path.abspath(eh.__file__))!r}); import harness.worker".encode()
    owner = f"KZ_OWNER={os.getpid()}".encode()
    deadline = time.monotonic() + grace_s
    while True:
        left = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if marker in cmd and owner in env and _harness_alive(int(pid)):
                left.append(int(pid))
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _harness_rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _harness_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_harness_map_mixed_batch_in_order_and_no_processes_left():
    pidfile = f"/tmp/kz_harness_child_{uuid.uuid4().hex}.pid"
    forks_then_hangs = _harness_relu(f'''
_os = os   # an alias the static check does not follow: past it, so the runtime must kill what this forks
pid = _os.fork()
if pid == 0:
    time.sleep(600)
    os._exit(0)
fd = _os.open({pidfile!r}, _os.O_WRONLY | _os.O_CREAT)   # (the alias again: past the file rules too)
_os.write(fd, str(pid).encode())
_os.close(fd)
while True:
    pass
''', extra="import os, time\n")
    pairs = [(RELU_TASK, GOOD_RELU), (RELU_TASK, forks_then_hangs), (ADD_TASK, GOOD_ADD), (RELU_TASK, SEGFAULT),
             (RELU_TASK, None), (RELU_TASK, RAISE)]
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False, run_timeout=6) as ev:
        results = ev.map(pairs)
    assert [r.error_kind for r in results] == ["ok", "timeout", "ok", "crash", "format", "runtime"]
    assert _harness_processes_left() == []
    with open(pidfile) as f:
        grandchild = int(f.read())
    os.remove(pidfile)
    time.sleep(0.5)
    assert not _harness_alive(grandchild), "the candidate's own child process survived the timeout"


def test_harness_robustness_many_candidates():
    """~20% hangs/segfaults/raises/memory bombs among good candidates: every one classified, nothing left behind.
    KZ_HARNESS_ROBUST_N=200 for the long version."""
    n = int(os.environ.get("KZ_HARNESS_ROBUST_N", "20"))
    # the memory bomb grows in 256 MB steps: it must stop at the worker's RLIMIT_AS (3 GB here), not eat the machine
    bomb = _harness_relu("chunks = []\nwhile True:\n    chunks.append(torch.ones(2**26))")
    bad = [(HANG, ("timeout",)), (SEGFAULT, ("crash",)), (RAISE, ("runtime",)), (bomb, ("runtime", "crash"))]
    plan = [bad[(i // 5) % 4] if i % 5 == 4 else (GOOD_RELU, ("ok",)) for i in range(n)]
    rss_before = _harness_rss_mb()
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False, run_timeout=20,
                      memory_limit_gb=3, dedupe=False) as ev:   # (every copy runs: the run is about many processes)
        results = ev.map([(RELU_TASK, cand) for cand, _ in plan])
    wrong = [(i, r.error_kind, r.error) for i, (r, (_, kinds)) in enumerate(zip(results, plan)) if r.error_kind not in kinds]
    assert not wrong, wrong
    assert _harness_processes_left() == []
    assert _harness_rss_mb() - rss_before < 150, "parent memory grows with the number of candidates"


# ----------------------------------------------------------------------------------------------------------------------
# lint_task

def test_harness_lint_good_and_degenerate_tasks():
    sources = {
        "good": (RELU_TASK, {}),
        "kernelbench_style_conv": (CONV_TASK, {}),
        "relu_on_rand": (RELU_TASK.replace("torch.randn(N)", "torch.rand(N)"), {}),   # ReLU is the identity
        "tiny_output": (RELU_TASK.replace("torch.relu(x)", "torch.relu(x) * 1e-6"), {}),
        "cross_entropy": (CE_TASK, {}),   # a scalar loss is not degenerate
        "mean_of_rand": (MEAN_TASK.replace("torch.mean(x).reshape(1)", "x.reshape(16, -1).mean(dim=1)")
                         .replace("torch.rand(65536)", "torch.rand(262144)"),
                         {"atol": 1e-2, "rtol": 1e-2}),   # row means of rand: the input mean passes at 1e-2
        "dropout": (RELU_TASK.replace("torch.relu(x)", "torch.nn.functional.dropout(x, 0.5, training=True)"), {}),
        # one call of several off (a glitch, not randomness): the third run agrees with the first
        "glitch_once": (RELU_TASK.replace("return torch.relu(x)", "self.calls = getattr(self, 'calls', 0) + 1\n"
                                          "        return torch.relu(x) * (1.001 if self.calls == 2 else 1.0)"), {}),
        "broken": (RELU_TASK.replace("return torch.relu(x)", "raise RuntimeError('bad task')"), {}),
        "too_big": (RELU_TASK, {"max_input_mb": 0.01}),   # 16 KB of input against a 10 KB limit
        "missing": ("x = 1\n", {}),
    }
    plain = [name for name, (_, opts) in sources.items() if not opts]   # one lint_tasks call, in order
    reports = dict(zip(plain, eh.lint_tasks([sources[name][0] for name in plain], device="cpu", workers=2)))
    reports.update({name: eh.lint_task(src, device="cpu", **opts) for name, (src, opts) in sources.items() if opts})

    def has(name, text):
        return any(text in p for p in reports[name]["problems"]) and not reports[name]["ok"]
    assert reports["good"]["ok"] and reports["good"]["input_mb"] > 0 and reports["good"]["eager_ms"] is not None
    assert reports["kernelbench_style_conv"]["ok"], reports["kernelbench_style_conv"]
    assert reports["cross_entropy"]["ok"], reports["cross_entropy"]
    assert has("relu_on_rand", "identity") and has("tiny_output", "zeros") and has("mean_of_rand", "mean")
    assert has("dropout", "deterministic") and has("broken", "bad task") and has("too_big", "MB")
    assert has("dropout", "max abs difference")   # the report says how far apart the two runs were
    assert reports["glitch_once"]["ok"], reports["glitch_once"]
    assert has("missing", "missing Model")


def test_harness_lint_neither_draws_nor_runs_a_module_over_the_input_limit():
    """Inputs over max_input_mb make a module invalid whatever else it does: their size is read on the meta device
    (8 GB here, never drawn) and the module is not run (its forward would raise, a second problem). Where
    get_inputs() names a device it cannot run on meta: the inputs are drawn, measured, and still not run."""
    never_run = RELU_TASK.replace("return torch.relu(x)", "raise RuntimeError('the forward ran')")
    huge = eh.lint_task(never_run.replace("N = 4096", "N = 2 ** 31"), device="cpu")
    assert huge["problems"] == ["inputs take 8192 MB (limit 512 MB)"] and huge["input_mb"] == 8192, huge
    named = eh.lint_task(never_run.replace("torch.randn(N)", "torch.randn(N, device='cpu')"), device="cpu",
                         max_input_mb=0.01)
    assert named["problems"] == ["inputs take 0 MB (limit 0.01 MB)"] and named["input_mb"] == 4096 * 4 / 2**20, named
    ran = eh.lint_task(never_run, device="cpu")   # (under the limit the forward runs: the probe above is real)
    assert any("the forward ran" in p for p in ran["problems"]), ran


def test_harness_evaluator_lint_reuses_its_workers(monkeypatch):
    """Evaluator.lint gives lint_tasks' reports on the Evaluator's own started workers: no new pool is booted."""
    srcs = [RELU_TASK, RELU_TASK.replace("torch.randn(N)", "torch.rand(N)"), "x = 1\n"]
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False) as ev:
        pools = []
        monkeypatch.setattr(eh, "Pool", lambda *a, **k: pools.append(a) or pytest.fail("a new pool was started"))
        reports = ev.lint(srcs)
    assert [r["ok"] for r in reports] == [True, False, False] and pools == []
    assert any("identity" in p for p in reports[1]["problems"]) and "missing Model" in reports[2]["problems"][0]


def test_harness_gate_timing_is_exclusive_and_not_starved():
    """Gate: shared holders overlap; an exclusive holder runs alone; a waiting timer blocks new shared holders."""
    gate, events = hp.Gate(), []
    gate.acquire("shared")
    gate.acquire("shared")   # two correctness checks at once

    def timer():
        gate.acquire("exclusive")
        events.append("timing")
        gate.release("exclusive")

    def late_checker():
        gate.acquire("shared")
        events.append("late shared")
        gate.release("shared")

    t1 = threading.Thread(target=timer)
    t1.start()
    while not gate.waiting:   # the timer is queued behind the two shared holders
        time.sleep(0.01)
    t2 = threading.Thread(target=late_checker)
    t2.start()
    time.sleep(0.2)
    assert events == [], "nothing may start while shared holders are inside"
    gate.release("shared")
    time.sleep(0.1)
    assert events == [], "one shared holder is still inside"
    gate.release("shared")
    t1.join(5)
    t2.join(5)
    assert events == ["timing", "late shared"], events


def test_harness_gate_counts_the_seconds_it_is_closed_to_checks():
    """Gate.closed_s: shared holders alone close nothing; a timer closes the gate from the moment it waits (behind a
    shared holder) until it releases; the count stops while the gate is open again."""
    gate = hp.Gate()
    gate.acquire("shared")
    gate.acquire("shared")
    gate.release("shared")
    gate.release("shared")
    assert gate.closed_s == 0.0 and gate.closed_since is None
    gate.acquire("shared")
    timer = threading.Thread(target=gate.acquire, args=("exclusive",))
    t0 = time.monotonic()
    timer.start()
    while not gate.waiting:   # the timer queues behind the shared holder: closed from here
        time.sleep(0.01)
    time.sleep(0.2)
    gate.release("shared")
    timer.join(5)
    time.sleep(0.1)           # the timer times
    gate.release("exclusive")
    held = time.monotonic() - t0
    assert 0.3 <= gate.closed_s <= held and gate.closed_since is None
    closed = gate.closed_s
    time.sleep(0.1)           # open: nothing more is counted
    gate.acquire("shared")
    gate.release("shared")
    assert gate.closed_s == closed


def test_harness_gate_says_when_a_timer_waits(tmp_path):
    """Gate.timer_waiting (what a worker asks between trials): no while only checkers hold the GPU; yes while a timer
    of this process waits for the checkers to leave, or while one of another process waits (it holds the lock file's
    turnstile)."""
    for path in (None, str(tmp_path / "gpu.lock")):
        gate = hp.Gate(path)
        fd = gate.acquire("shared")
        assert not gate.timer_waiting()
        timer = threading.Thread(target=lambda: gate.release("exclusive", gate.acquire("exclusive")))
        timer.start()
        deadline = time.monotonic() + 5
        while not gate.timer_waiting() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert gate.timer_waiting()
        gate.release("shared", fd)
        timer.join(5)
        assert not timer.is_alive() and not gate.timer_waiting()
    other = hp.lock_file(path, "shared")   # a checker of another process, and that process's waiting timer
    waiting = threading.Thread(target=lambda: os.close(hp.lock_file(path, "exclusive")))
    waiting.start()
    time.sleep(0.3)
    assert hp.Gate(path).timer_waiting() and not hp.Gate(None).timer_waiting()
    os.close(other)
    waiting.join(5)
    assert not waiting.is_alive() and not hp.Gate(path).timer_waiting()


def test_harness_gate_holds_across_processes(tmp_path):
    """A gate with a lock file (every Evaluator on a GPU has one) holds across processes: a timer waits while another
    process checks correctness, and a third process's new shared holder queues behind the waiting timer (writer
    preference across processes, through the turnstile)."""
    import queue
    path = str(tmp_path / "gpu-test.lock")
    holder = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        import harness.processes as hp
        gate = hp.Gate({path!r})
        fd = gate.acquire("shared")
        print("held", flush=True)
        sys.stdin.readline()
        gate.release("shared", fd)
    """)

    def start():
        proc = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        lines = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line.strip()) for line in proc.stdout], daemon=True).start()
        return proc, lines
    a, a_lines = start()
    assert a_lines.get(timeout=120) == "held"   # process A checks correctness
    gate, events, timer_fd = hp.Gate(path), [], []

    def timer():
        timer_fd.append(gate.acquire("exclusive"))
        events.append("timing")
    t = threading.Thread(target=timer)
    t.start()
    time.sleep(0.5)
    assert events == [], "a timer started while another process held the GPU"
    b, b_lines = start()   # process B asks for a shared turn while our timer waits
    with pytest.raises(queue.Empty):
        b_lines.get(timeout=3)   # (long enough for B to import and ask)
    a.stdin.write("\n")   # A is done: the timer goes first, B still waits
    a.stdin.flush()
    t.join(10)
    assert events == ["timing"]
    with pytest.raises(queue.Empty):
        b_lines.get(timeout=0.5)
    gate.release("exclusive", timer_fd[0])
    assert b_lines.get(timeout=10) == "held"
    b.stdin.write("\n")
    b.stdin.flush()
    assert a.wait(10) == 0 and b.wait(10) == 0


def test_harness_holding_gpus_keeps_candidates_off_the_gpu_until_the_block_ends():
    """Evaluator.holding_gpus: the caller's own GPU work (the trainer generating) holds the GPU alone, so no candidate
    is checked or timed meanwhile; it waits for a candidate already on the GPU; on the CPU it is a no-op."""
    ev = eh.Evaluator(backend="triton", device="cpu", progress=False)
    gate = hp.Gate()
    ev.pools, ev.gates = {}, {0: gate}   # as if started on one GPU
    events, entered = [], threading.Event()

    def candidate(mode):
        gate.acquire(mode)
        events.append(mode)
        gate.release(mode)
    gate.acquire("shared")   # a candidate is checking when the caller asks

    def caller():
        with ev.holding_gpus():
            entered.set()
            time.sleep(0.3)
            events.append("caller done")
    worker = threading.Thread(target=caller)
    worker.start()
    assert not entered.wait(0.3), "the caller got the GPU while a candidate was on it"
    gate.release("shared")
    assert entered.wait(5)
    others = [threading.Thread(target=candidate, args=(mode,)) for mode in ("shared", "exclusive")]
    for t in others:
        t.start()
    for t in [worker] + others:
        t.join(5)
    assert events[0] == "caller done" and sorted(events[1:]) == ["exclusive", "shared"], events
    assert gate.shared == 0 and not gate.exclusive
    cpu = eh.Evaluator(backend="triton", device="cpu", progress=False)
    cpu.spare = 0   # (no idle workers booted for this check)
    with cpu.holding_gpus():
        assert cpu.gates == {}
    cpu.close()


def test_harness_worker_makes_host_inputs_before_its_gpu_turn(tmp_path):
    """A worker makes the trials' inputs (host work) before it asks for its GPU turn, so a timer elsewhere does not
    wait for it; a reference that mentions cuda (it may make its inputs on the GPU) asks first."""
    def started_before_turn(ref_src: str) -> bool:
        marker = tmp_path / f"marker{uuid.uuid4().hex}"
        ref_src = ref_src.replace("return [torch.randn(N)]", f"open({str(marker)!r}, 'a').close()\n    "
                                  "return [torch.randn(N)]")
        gate, asked, acquire = hp.Gate(), threading.Event(), hp.Gate.acquire
        gate.acquire("exclusive")   # another candidate is timing
        gate.acquire = lambda mode: (asked.set(), acquire(gate, mode))[1]   # notes when the worker asks for its turn
        job = {"kind": "evaluate", "ref_src": ref_src, "cand_src": GOOD_RELU, "backend": "triton", "device": "cpu",
               "opts": eh.DEFAULTS}
        limits = {"startup": 300.0, "reference": 60.0, "compile": 60.0, "run": 60.0}
        zygote = hp.Zygote(hp.worker_env("cpu", "triton", eh.DEFAULTS, "run"))
        worker = hp.Worker(zygote)
        box = {}
        thread = threading.Thread(target=lambda: box.update(r=hp.run_job(worker, job, limits, gate)), daemon=True)
        thread.start()
        try:
            assert asked.wait(120), "the worker never asked for a GPU turn"
            time.sleep(0.5)   # (it would go on making inputs meanwhile if it were not waiting)
            made = marker.exists()
        finally:
            gate.release("exclusive")
        thread.join(120)
        zygote.close()
        assert box["r"].error_kind == "ok", box["r"]
        assert box["r"].details["gpu_wait_s"] > 0
        return made

    assert started_before_turn(RELU_TASK)
    assert not started_before_turn(RELU_TASK.replace("import torch\n", "import torch  # inputs could be on cuda\n", 1))


def test_harness_worker_gives_its_turn_back_between_trials_only_to_a_waiting_timer():
    """Between reference outputs and between trials a worker asks its parent whether a timer waits for the GPU
    (Gate.timer_waiting): if one does, it gives its shared turn back and waits for it again (one more turn each
    time, and on a GPU a host sync first); if none does, it keeps the turn. Same verdict either way."""
    def turns(timer_waits: bool) -> dict:
        gate = hp.Gate()
        gate.timer_waiting = lambda: timer_waits
        job = {"kind": "evaluate", "ref_src": RELU_TASK, "cand_src": GOOD_RELU, "backend": "triton", "device": "cpu",
               "opts": eh.DEFAULTS}
        zygote = hp.Zygote(hp.worker_env("cpu", "triton", eh.DEFAULTS, "run"))
        try:
            reply = hp.run_job(hp.Worker(zygote), job, {"startup": 300.0, "reference": 60.0, "compile": 60.0,
                                                         "run": 60.0}, gate)
        finally:
            zygote.close()
        assert reply.error_kind == "ok", reply
        return reply.details

    kept, passed = turns(False), turns(True)
    trials = kept["trials"]
    assert kept["gpu_turns"] == 1   # the reference's
    # + one pass (the parent gives the turn back and waits for it again) before every reference output but the
    # first, and before every trial but the first
    assert passed["gpu_turns"] == 1 + (trials - 1) + (trials - 1), passed


def test_harness_trials_capped_by_host_memory():
    """max_trial_gb bounds the host copies of trial inputs and outputs: fewer normal trials, the heavy one kept."""
    capped = eh.evaluate(RELU_TASK, GOOD_RELU, backend="triton", device="cpu", max_trial_gb=3.5 * 4 * 4096 / 2**30)
    assert capped.error_kind == "ok", capped   # 16 KB inputs: 3 of them fit in 3.5 x 16 KB (2 counting the outputs)
    assert capped.details["trials_capped"] == 1 and capped.details["trials"] == 2 and capped.details["heavy_trial"]
    full = eh.evaluate(RELU_TASK, GOOD_RELU, backend="triton", device="cpu")
    assert "trials_capped" not in full.details and full.details["trials"] == eh.DEFAULTS["trials"] + 1


def test_harness_phase_times_and_gpu_turns_in_details():
    """Every verdict carries the parent's per-phase wall times; the workers' GPU turns are granted in CPU mode too."""
    result = eh.evaluate(RELU_TASK, GOOD_RELU, backend="triton", device="cpu")
    assert result.error_kind == "ok", result
    phases = result.details["phase_s"]
    assert {"startup", "reference", "compile", "run"} <= set(phases) and all(v >= 0 for v in phases.values())
    assert result.details["gpu_wait_s"] < 1.0   # no gate on the CPU: no waiting
    # one turn for the reference; no timer ever waits without a gate, so the trials never give it back
    assert result.details["gpu_turns"] == 1, result.details
    hung = eh.evaluate(RELU_TASK, _harness_relu("while True:\n    pass"), backend="triton", device="cpu",
                       run_timeout=3)
    assert hung.error_kind == "timeout" and 2.5 < hung.details["phase_s"]["run"] < 30, hung
    with pytest.raises(ValueError, match="gpu_workers"):
        eh.Evaluator(backend="triton", device="cpu", gpu_workers=0)


def test_harness_lint_hang_times_out():
    report = eh.lint_task(RELU_TASK.replace("return torch.relu(x)", "while True:\n            pass"), timeout=4)
    assert not report["ok"] and "timeout" in report["problems"][0]


# ----------------------------------------------------------------------------------------------------------------------
# CLI

def _harness_cli(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(ROOT, "eval_harness.py"), *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_harness_cli_check_run_lint(tmp_path):
    tasks, sols = tmp_path / "tasks", tmp_path / "sols"
    tasks.mkdir()
    sols.mkdir()
    (tasks / "001_Relu.py").write_text(RELU_TASK)
    (tasks / "002_Add.py").write_text(ADD_TASK)
    (sols / "001_Relu_triton.py").write_text(GOOD_RELU)
    (sols / "002_Add_triton.py").write_text(WRONG.replace("def forward(self, x)", "def forward(self, a, b=None)"))
    (sols / "002_Add_cuda.py").write_text("not a triton solution")

    ok = _harness_cli("check", str(tasks / "001_Relu.py"), str(sols / "001_Relu_triton.py"), "--backend", "triton",
                      "--device", "cpu", "--json", "--trials", "2")
    assert ok.returncode == 0, ok.stderr
    line = json.loads(ok.stdout.strip().splitlines()[-1])
    assert line["error_kind"] == "ok" and line["details"]["trials"] == 3

    run = _harness_cli("run", "--tasks", str(tasks), "--solutions", str(sols), "--backend", "triton", "--device",
                       "cpu", "--json", "--timeout", "60")
    assert run.returncode == 1, run.stderr
    lines = [json.loads(x) for x in run.stdout.strip().splitlines()]
    assert [(x["task"], x["solution"]) for x in lines] == [("001_Relu.py", "001_Relu_triton.py"),
                                                           ("002_Add.py", "002_Add_triton.py")]
    assert lines[0]["correct"] and not lines[1]["correct"]

    unsupported = _harness_cli("check", str(tasks / "001_Relu.py"), str(sols / "001_Relu_triton.py"), "--backend",
                               "cuda", "--device", "cpu", "--json")
    assert unsupported.returncode == 1 and json.loads(unsupported.stdout)["error_kind"] == "unsupported"

    (tmp_path / "bad_task.py").write_text(RELU_TASK.replace("torch.randn(N)", "torch.rand(N)"))
    lint = _harness_cli("lint", str(tasks / "001_Relu.py"), str(tmp_path / "bad_task.py"), "--device", "cpu", "--json")
    reports = [json.loads(x) for x in lint.stdout.strip().splitlines()]
    assert lint.returncode == 1 and [r["ok"] for r in reports] == [True, False], lint.stdout

    usage = _harness_cli("check", str(tasks / "missing.py"), str(sols / "001_Relu_triton.py"))
    assert usage.returncode == 2 and "no such file" in usage.stderr


# ----------------------------------------------------------------------------------------------------------------------
# GPU tests (run on a GPU machine: python -m pytest -q -m gpu tests/test_harness.py)

CUDA_RELU = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = """
#include <torch/extension.h>
__global__ void relu_cuda_kernel(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) { BODY }
}
torch::Tensor relu_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    relu_cuda_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
ext = load_inline(name="kz_test_relu", cpp_sources="torch::Tensor relu_cuda(torch::Tensor x);",
                  cuda_sources=cuda_src, functions=["relu_cuda"], verbose=False)

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        FORWARD
'''


def _harness_cuda(body="y[i] = x[i] > 0.f ? x[i] : 0.f;", forward="return ext.relu_cuda(x.contiguous())"):
    """Only two distinct CUDA sources (good, out-of-bounds) in the GPU tests: builds are cached by source."""
    forward = forward.strip().replace("\n", "\n" + " " * 8)   # FORWARD sits in a method body
    return CUDA_RELU.replace("BODY", body).replace("FORWARD", forward)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _show(label, *results):
    """Print verdicts as they come (run GPU tests with -s): a log cut by the GPU machine's time limit still shows
    why a test failed, where pytest's failure summary would only come at the end."""
    for r in results:
        print(f"[{label}] {r.error_kind} speedup={r.speedup} compile_s={r.compile_s} check={r.details.get('check')} "
              f"phases={r.details.get('phase_s')} error={r.error[:400]!r}", flush=True)


@pytest.mark.gpu
@gpu
def test_harness_gpu_known_good_cuda_and_triton_with_timing():
    cuda = eh.evaluate(GPU_RELU_TASK, _harness_cuda(), backend="cuda", device="cuda")
    _show("good cuda", cuda)
    assert cuda.error_kind == "ok", cuda
    assert cuda.speedup > 0 and cuda.runtime_ms > 0 and cuda.ref_runtime_ms > 0 and cuda.compile_s is not None
    assert cuda.details["own_kernels"] and cuda.details["kernel_coverage"] > 0.5, cuda.details
    # its kernel launches on the legacy default stream (<<<grid, block>>>), which a CUDA graph capture does not
    # record: timed eagerly instead, and still ok
    assert cuda.details["timing_method"] == "eager" and cuda.details["graph_fallback"], cuda.details
    triton_ = eh.evaluate(GPU_RELU_TASK, GOOD_RELU, backend="triton", device="cuda", compile_baseline=True)
    _show("good triton", triton_)
    assert triton_.error_kind == "ok", triton_
    assert triton_.details["timing_method"] == "graph", triton_.details
    assert triton_.speedup > 0 and triton_.details["reps"] >= eh.DEFAULTS["timing_min_reps"]
    assert triton_.details["compile_baseline_ms"] > 0
    assert triton_.details["own_kernels"] == sorted(triton_.details["launches"]), triton_.details   # (no profiler)
    autotuned = eh.evaluate(GPU_RELU_TASK, GOOD_AUTOTUNED, backend="triton", device="cuda")
    _show("autotuned", autotuned)
    assert autotuned.error_kind == "ok", autotuned   # do_bench's torch ops are not a PyTorch fallback


def test_harness_forged_verdict_on_the_pipe_is_caught_at_run_time_too(monkeypatch):
    """The forged_verdict case with the static check out of the way (as a route it does not name would be): the
    forged result reaches the worker's pipe first, without the job's key, and the verdict is `reward_hack`
    (forged_message), not the forged `ok` at 50x."""
    monkeypatch.setattr(eh.static_checks, "static_check", lambda tree, aliases: None)
    r = eh.evaluate(RELU_TASK, FORGED_VERDICT, backend="triton", device="cpu")
    assert r.error_kind == "reward_hack" and r.details["check"] == "forged_message", r
    assert r.speedup is None and not r.correct
    # the same forgery as the typed verdict the worker sends (a KernelResult, pickled here: the candidate cannot
    # import the harness): without the key it is no verdict either
    import pickle
    import re
    typed = pickle.dumps(("result", hv.verdict("ok", compiled=True, speedup=50.0, runtime_ms=0.01,
                                               ref_runtime_ms=0.5)))
    cand, n = re.subn(r"msg = pickle\.dumps\(.*?\}\)\)", lambda m: f"msg = {typed!r}", FORGED_VERDICT, flags=re.S)
    assert n == 1 and b"KernelResult" in typed
    r = eh.evaluate(RELU_TASK, cand, backend="triton", device="cpu")
    assert r.error_kind == "reward_hack" and r.details["check"] == "forged_message", r
    assert r.speedup is None and not r.correct


@pytest.mark.gpu
@gpu
def test_harness_gpu_slow_triton_compile_is_a_jit_timeout():
    """A Triton kernel that unrolls into a huge program (what a sampled kernel with a giant static loop does: ptxas
    then runs for minutes) is a `timeout` at jit_timeout, not at the run phase's limit, and the next candidate of the
    batch is ok."""
    unrolled = RELU_KERNEL.replace("    tl.store(", "    acc = x\n    for i in tl.static_range(20000):\n"
                                   "        acc = tl.maximum(acc, x * (i % 7 - 3.0))\n    tl.store(")
    unrolled = unrolled.replace("tl.maximum(x, 0.0)", "tl.maximum(x, 0.0) + acc * 0.0")
    assert unrolled.count("static_range") == 1 and unrolled.count("acc * 0.0") == 1, unrolled
    slow = _harness_relu(GOOD_RELU.split("def forward(self, x):\n")[1], kernel=unrolled)
    clock = time.monotonic()
    with eh.Evaluator(backend="triton", device="cuda", progress=False, jit_timeout=3.0) as ev:
        results = ev.map([(GPU_RELU_TASK, slow), (GPU_RELU_TASK, GOOD_RELU)])
    _show("slow jit, good", *results)
    assert [r.error_kind for r in results] == ["timeout", "ok"], results
    assert results[0].details["jit"] and "jit_timeout" in results[0].error, results[0]
    assert time.monotonic() - clock < eh.DEFAULTS["run_timeout"]   # (the run phase's limit did not decide it)


@pytest.mark.gpu
@gpu
def test_harness_gpu_illegal_memory_access_is_crash_and_next_is_ok():
    oob = _harness_cuda(body="y[i + (1L << 40)] = x[i];")
    with eh.Evaluator(backend="cuda", device="cuda", progress=False) as ev:
        results = ev.map([(GPU_RELU_TASK, oob), (GPU_RELU_TASK, _harness_cuda())])
    _show("oob, good", *results)
    assert [r.error_kind for r in results] == ["crash", "ok"], results
    assert _harness_processes_left() == []


@pytest.mark.gpu
@gpu
def test_harness_gpu_reward_hacks():
    tf32_runtime = GOOD_MATMUL.replace("class ModelNew", "_b = torch.backends.cuda.matmul\n"
                                       "setattr(_b, 'allow_tf32', True)\nclass ModelNew")
    side_stream = _harness_cuda().replace("#include <torch/extension.h>",
                                                     "#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>")
    side_stream = side_stream.replace("relu_cuda_kernel<<<(n + 255) / 256, 256>>>",
                                      "relu_cuda_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getStreamFromPool()>>>")
    static_cache = _harness_cuda(forward='''
if not hasattr(self, "out"):
    self.out = ext.relu_cuda(x.contiguous())
return self.out''')
    decoy = _harness_cuda(forward="return torch.relu(x)")
    fallback = _harness_cuda(forward="return ext.relu_cuda(torch.relu(x))")   # right answer, torch did the work
    tf32_dot = MATMUL_SRC.replace("{precision}", "")   # tl.dot fp32 defaults to TF32 on the GPU: ~1e-3 error
    cases = [(GPU_MATMUL_TASK, tf32_runtime, "triton", "reward_hack", "tf32"),
             (GPU_RELU_TASK, side_stream, "cuda", "reward_hack", "side_stream"),
             (GPU_RELU_TASK, static_cache, "cuda", "mismatch", None),
             (GPU_RELU_TASK, decoy, "cuda", "reward_hack", "kernel_not_launched"),
             (GPU_RELU_TASK, fallback, "cuda", "reward_hack", "pytorch_fallback"),
             (GPU_MATMUL_TASK, tf32_dot, "triton", "mismatch", None)]
    for task, cand, backend, kind, check in cases:
        result = eh.evaluate(task, cand, backend=backend, device="cuda")
        _show(f"hack {check or kind}", result)
        assert result.error_kind == kind, (check, result)
        if check:
            assert result.details["check"] == check, result


@pytest.mark.gpu
@gpu
def test_harness_gpu_gate_lock_file_names_the_gpu(tmp_path, monkeypatch):
    """The machine-wide timing gate's lock file is named by the GPU's UUID (processes with different
    CUDA_VISIBLE_DEVICES agree) and every Evaluator on that GPU uses it."""
    monkeypatch.setenv("KZ_CACHE_DIR", str(tmp_path))
    path = hp.gpu_lock_path(0)
    assert path and os.path.exists(path) and os.path.exists(path + ".turnstile")
    assert str(torch.cuda.get_device_properties(0).uuid) in path
    ev = eh.Evaluator(backend="triton", device="cuda", progress=False)
    ev.spare = 0
    ev._start()
    assert ev.gates[0].lock_path == path
    ev.close()


@pytest.mark.gpu
@gpu
def test_harness_gpu_robustness_many_candidates():
    """The GPU version of the robustness run: ~20% hang, segfault, raise, exhaust GPU memory or hit an illegal memory
    access, among good candidates sharing the GPU (gpu_workers=8). Every one classified, nothing left behind, the
    good ones stay ok (an out-of-memory victim of a neighbour's bomb is rerun alone). KZ_HARNESS_ROBUST_N=200."""
    n = int(os.environ.get("KZ_HARNESS_ROBUST_N", "20"))
    bomb = _harness_relu("chunks = []\nwhile True:\n    chunks.append(torch.ones(2**28, device=x.device))")
    wild = "@triton.jit\ndef wild_kernel(y_ptr):\n    tl.store(y_ptr + (1 << 40) + tl.arange(0, 16), tl.zeros((16,), tl.float32))\n\n"
    illegal = _harness_relu("y = torch.empty_like(x)\nwild_kernel[(1,)](y)\ntorch.cuda.synchronize()\nreturn y", extra=wild)
    bad = [(HANG, ("timeout",)), (SEGFAULT, ("crash",)), (RAISE, ("runtime",)), (bomb, ("runtime", "crash")),
           (illegal, ("crash",))]
    plan = [bad[(i // 5) % 5] if i % 5 == 4 else (GOOD_RELU, ("ok",)) for i in range(n)]
    rss_before, results, t0 = _harness_rss_mb(), [], time.monotonic()
    with eh.Evaluator(backend="triton", device="cuda", progress=False, run_timeout=10, timing_budget_s=0.1,
                      dedupe=False) as ev:   # (every copy runs: the run is about many processes)
        # a small task (the run is about the bad candidates), in chunks with a running tally: a run cut by a time
        # limit still reports how far it got
        for start in range(0, n, 50):
            results += ev.map([(RELU_TASK, cand) for cand, _ in plan[start:start + 50]])
            print(f"\ngpu robustness: {len(results)}/{n} in {time.monotonic() - t0:.0f} s, parent "
                  f"{_harness_rss_mb() - rss_before:+.0f} MB, " +
                  json.dumps(collections.Counter(r.error_kind for r in results)), flush=True)
    wrong = [(i, r.error_kind, r.error[:300]) for i, (r, (_, kinds)) in enumerate(zip(results, plan))
             if r.error_kind not in kinds]
    assert not wrong, wrong
    assert _harness_processes_left() == []
    assert _harness_rss_mb() - rss_before < 300, "parent memory grows with the number of candidates"
    print(f"\ngpu robustness: {n} candidates, " + json.dumps(collections.Counter(r.error_kind for r in results)))


@pytest.mark.gpu
@gpu
def test_harness_gpu_stale_memory_and_lint_timing():
    stale = _harness_cuda(forward="ext.relu_cuda(x[:1].contiguous())\nreturn torch.empty_like(x)")
    result = eh.evaluate(GPU_RELU_TASK, stale, backend="cuda", device="cuda")
    _show("stale", result)
    assert result.error_kind in ("mismatch", "reward_hack"), result
    # Raw storage is not filled by deterministic mode: its bytes are whatever the allocator's free block held, e.g.
    # the reference's freed output for these very inputs. Every free block is NaN-filled before each call, so the
    # answer is never found there (the relu of one element keeps a kernel of its own launched).
    raw = _harness_relu('''
relu_kernel[(1,)](x, torch.empty_like(x), 1, BLOCK=1024)
storage = torch.UntypedStorage(x.numel() * x.element_size(), device=x.device)
return torch.empty(0, dtype=x.dtype, device=x.device).set_(storage).view(x.shape)
''')
    result = eh.evaluate(GPU_RELU_TASK, raw, backend="triton", device="cuda")
    _show("stale raw storage", result)
    assert result.error_kind == "mismatch", result   # ("NaN where the reference is not" when the block was cached)
    report = eh.lint_task(GPU_RELU_TASK, device="cuda")
    assert report["eager_ms"] is not None and report["ok"], report
    small = eh.lint_task(RELU_TASK, device="cuda")   # 4096 elements: launch-bound
    assert any("50 us" in p for p in small["problems"]), small


@pytest.mark.gpu
@gpu
def test_harness_gpu_poison_fills_small_pool_blocks_over_1_mib():
    """In a fresh process (an allocator that nothing else used): four 512 KiB tensors share one 2 MiB small segment;
    three of them, holding a stale value, are freed into one 1.5 MiB block. After the poison, the same memory asked
    for again holds NaN: no stale value is left for a candidate's unfilled allocation to find. Then, with free blocks
    of another stream and of a CUDA graph's private pool in the cache (as graph timing leaves them), the poison's
    later calls make no new segments and take at most two passes (it asked for those blocks' sizes every call)."""
    script = textwrap.dedent('''
        import torch
        import harness.instrumentation as hi
        piece = 1 << 19
        held = [torch.empty(piece, dtype=torch.uint8, device="cuda") for _ in range(4)]
        for t in held:
            t.view(torch.float32).fill_(7.0)
        stale = [t.data_ptr() for t in held[1:]]
        del held[1:]
        hi._poison_cuda_allocator()
        again = [torch.empty(piece, dtype=torch.uint8, device="cuda") for _ in range(3)]
        seen = [t for t in again if t.data_ptr() in stale]
        assert seen, "the freed memory did not come back"
        for t in seen:
            values = t.view(torch.float32)
            assert torch.isnan(values).all().item(), f"stale values left: {values.unique()[:4].tolist()}"
        print("poisoned", len(seen))

        snapshots = []
        memory_snapshot = torch.cuda.memory_snapshot

        def counted_snapshot():
            snapshots.append(1)
            return memory_snapshot()

        torch.cuda.memory_snapshot = counted_snapshot
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):   # as _capture: copies on a side stream, then a capture into a private pool
            big, small = torch.randn(3 << 18, device="cuda"), torch.randn(1 << 17, device="cuda")
            graph = torch.cuda.CUDAGraph()
            graph.capture_begin()
            out = big * 2 + small.sum()
            graph.capture_end()
        graph.replay()
        torch.cuda.synchronize()
        del graph, out, big, small
        calls = []
        for _ in range(3):
            snapshots.clear()
            before = torch.cuda.memory_reserved()
            hi._poison_cuda_allocator()
            calls.append((torch.cuda.memory_reserved() - before, len(snapshots)))
        assert all(grew == 0 for grew, _ in calls[1:]) and all(n <= 2 for _, n in calls), calls
        print("steady", calls)
    ''')
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0 and "steady" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.gpu
@gpu
def test_harness_gpu_evaluator_lint_agrees_with_lint_tasks():
    """The trainer lints on the Evaluator's started GPU workers (env of a Triton candidate runner); those must judge
    tasks as lint_tasks' own workers do: a good task passes, a broken forward "does not run", zeros are degenerate."""
    broken = GPU_RELU_TASK.replace("return torch.relu(x)", "return torch.relu(x) + x[:5]")
    zeros = GPU_RELU_TASK.replace("return torch.relu(x)", "return torch.zeros_like(x)")
    srcs = [GPU_RELU_TASK, broken, zeros]
    fresh = eh.lint_tasks(srcs, device="cuda")
    with eh.Evaluator(backend="triton", device="cuda", progress=False) as ev:
        warm = ev.lint(srcs)
    for report in (fresh, warm):
        assert [r["ok"] for r in report] == [True, False, False], report
        assert [eh.lint_rule(r["problems"][0]) for r in report[1:]] == ["does not run", "degenerate"], report


def test_harness_map_evaluates_identical_candidates_once(tmp_path):
    """Copies of one candidate for one task (also one that differs only in comments and spacing) run once (a side
    effect of the import counts the runs) and get the first copy's verdict with duplicate_of and none of its harness
    seconds; another task or another program runs on its own; dedupe=False runs every copy."""
    log = str(tmp_path / "imports.log")
    counted = _harness_relu('''
y = torch.empty_like(x)
relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
return y
''', extra=f"import os\n_os = os\n_fd = _os.open({log!r}, _os.O_WRONLY | _os.O_CREAT | _os.O_APPEND)\n"
          "_os.write(_fd, b'x')\n_os.close(_fd)\n")   # one x per import (through an alias the static check does
    # not follow: a candidate may not write files)
    restyled = counted.replace("return y", "return y  # the same program, restyled\n\n")
    pairs = [(RELU_TASK, counted), (RELU_TASK, GOOD_RELU), (RELU_TASK, counted), (ADD_TASK, GOOD_ADD),
             (RELU_TASK, restyled)]
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False) as ev:
        results = ev.map(pairs)
        imports = len(open(log).read())   # the imports one evaluation of it makes
        assert imports >= 1
        assert [r.error_kind for r in results] == ["ok"] * 5
        assert [r.details.get("duplicate_of") for r in results] == [None, None, 0, None, 0]
        assert "phase_s" in results[0].details and "phase_s" not in results[2].details
        assert results[2].compiled and results[2].speedup == results[0].speedup
        ev.with_options(dedupe=False).map(pairs[:3])   # both copies run
    assert len(open(log).read()) == 3 * imports
    # what counts as the same program: the syntax tree, string constants (CUDA sources) included
    same = eh._same_code_key
    assert same("x = 1\ny = 'a  # b'\n") == same("x=1   # c\n\ny = 'a  # b'\n")
    assert same("x = 1\ny = 'a  # b'\n") != same("x = 1\ny = 'a # b'\n")
    assert same("def (") == "def (" and same(None) is None
