"""Tests for eval_harness.py: known-good candidates, one adversarial candidate per pitfall row
(shared/reference/harness-pitfalls.md), isolation (timeouts, crashes, no processes left), CLI, lint.

CPU tests run Triton candidates under the interpreter. Most CPU cases are evaluated together in one Evaluator batch
per option set (worker start-up is the expensive part on a 2-core machine) and each test asserts its own verdict.
GPU tests: `python -m pytest -q -m gpu wip_tests/test_harness.py` on a machine with CUDA.
"""
import concurrent.futures
import functools
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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

def _harness_worker_children() -> list[int]:
    """Live direct children of this process that are harness workers."""
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"_worker_main" in cmd:
            pids.append(int(pid))
    return pids


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
pid = getattr(os, "fo" + "rk")()
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
    assert _harness_worker_children() == []
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
    assert _harness_worker_children() == []
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
        "broken": (RELU_TASK.replace("return torch.relu(x)", "raise RuntimeError('bad task')"), {}),
        "too_big": (RELU_TASK, {"max_input_mb": 0.01}),   # 16 KB of input against a 10 KB limit
        "missing": ("x = 1\n", {}),
    }
    with concurrent.futures.ThreadPoolExecutor(2) as ex:   # each lint_task is its own worker process
        reports = dict(zip(sources, ex.map(lambda v: eh.lint_task(v[0], device="cpu", **v[1]), sources.values())))

    def has(name, text):
        return any(text in p for p in reports[name]["problems"]) and not reports[name]["ok"]
    assert reports["good"]["ok"] and reports["good"]["input_mb"] > 0 and reports["good"]["eager_ms"] is not None
    assert reports["kernelbench_style_conv"]["ok"], reports["kernelbench_style_conv"]
    assert reports["cross_entropy"]["ok"], reports["cross_entropy"]
    assert has("relu_on_rand", "identity") and has("tiny_output", "zeros") and has("mean_of_rand", "mean")
    assert has("dropout", "deterministic") and has("broken", "bad task") and has("too_big", "MB")
    assert has("missing", "missing Model")


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
# GPU tests (the lead runs them on the H200: python -m pytest -q -m gpu wip_tests/test_harness.py)

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
    return CUDA_RELU.replace("BODY", body).replace("FORWARD", forward)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.gpu
@gpu
def test_harness_gpu_known_good_cuda_and_triton_with_timing():
    cuda = eh.evaluate(GPU_RELU_TASK, _harness_cuda(), backend="cuda", device="cuda")
    assert cuda.error_kind == "ok", cuda
    assert cuda.speedup > 0 and cuda.runtime_ms > 0 and cuda.ref_runtime_ms > 0 and cuda.compile_s is not None
    assert cuda.details["own_kernels"] and cuda.details["kernel_coverage"] > 0.5, cuda.details
    triton_ = eh.evaluate(GPU_RELU_TASK, GOOD_RELU, backend="triton", device="cuda", compile_baseline=True)
    assert triton_.error_kind == "ok", triton_
    assert triton_.speedup > 0 and triton_.details["reps"] >= 30 and triton_.details["compile_baseline_ms"] > 0
    assert triton_.details["own_kernels"] and triton_.details["kernel_coverage"] > 0.5, triton_.details
    autotuned = eh.evaluate(GPU_RELU_TASK, GOOD_AUTOTUNED, backend="triton", device="cuda")
    assert autotuned.error_kind == "ok", autotuned   # do_bench's torch ops are not a PyTorch fallback


@pytest.mark.gpu
@gpu
def test_harness_gpu_illegal_memory_access_is_crash_and_next_is_ok():
    oob = _harness_cuda(body="y[i + (1L << 40)] = x[i];")
    with eh.Evaluator(backend="cuda", device="cuda", progress=False) as ev:
        results = ev.map([(GPU_RELU_TASK, oob), (GPU_RELU_TASK, _harness_cuda())])
    assert [r.error_kind for r in results] == ["crash", "ok"], results
    assert _harness_worker_children() == []


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
        assert result.error_kind == kind, (check, result)
        if check:
            assert result.details["check"] == check, result


@pytest.mark.gpu
@gpu
def test_harness_gpu_stale_memory_and_lint_timing():
    stale = _harness_cuda(forward="ext.relu_cuda(x[:1].contiguous())\nreturn torch.empty_like(x)")
    result = eh.evaluate(GPU_RELU_TASK, stale, backend="cuda", device="cuda")
    assert result.error_kind in ("mismatch", "reward_hack"), result
    report = eh.lint_task(GPU_RELU_TASK, device="cuda")
    assert report["eager_ms"] is not None and report["ok"], report
    small = eh.lint_task(RELU_TASK, device="cuda")   # 4096 elements: launch-bound
    assert any("50 us" in p for p in small["problems"]), small
