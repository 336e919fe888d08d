"""Shared by the suites: the repository root, KernelBench-format task sources written here, Triton candidates
(known good, adversarial, broken), the pitfall table CASES (one row per pitfall of eval_harness.py's docstring: task,
candidate, expected verdict) and a tolerance check for tensors."""
import os
import textwrap

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository root


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

# A candidate that computes nothing: it walks up its call stack to the worker's frame that holds the trial it is
# being called for, and copies the stored reference output with its own kernel. {tb_frame}, {f_locals} and {f_back}
# are how it reads the three attributes (written out, through getattr, or with computed names).
COPY_KERNEL = """
@triton.jit
def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def stored_output():
    try:
        raise KeyError
    except KeyError as e:
        frame = {tb_frame}
    while frame is not None:
        trial = {f_locals}.get("trial")
        if isinstance(trial, dict) and "out" in trial:
            return trial["out"]
        frame = {f_back}
    return None
"""
STORED_OUTPUT_COPY = """
src = stored_output()
y = torch.empty_like(x)
copy_kernel[(triton.cdiv(x.numel(), 1024),)](x if src is None else src, y, x.numel(), BLOCK=1024)
return y
"""


def stored_output_copier(route: str) -> str:
    """The frame-walking copier of COPY_KERNEL, its attributes read by `route`: "getattr" (constant names) or
    "computed" (names built at run time)."""
    reads = {"getattr": dict(tb_frame='getattr(e.__traceback__, "tb_frame")', f_locals='getattr(frame, "f_locals")',
                             f_back='getattr(frame, "f_back")'),
             "computed": dict(tb_frame='getattr(e.__traceback__, "tb_" + "frame")',
                              f_locals='getattr(frame, "f_" + "locals")', f_back='getattr(frame, "f_" + "back")')}
    return _harness_relu(STORED_OUTPUT_COPY, kernel=COPY_KERNEL.format(**reads[route]))


# Writes a pickled ("result", ok with speedup 50) message, framed as multiprocessing does, to every file descriptor:
# one of them is the worker's pipe to the harness; its own kernel writes zeros
FORGED_VERDICT = _harness_relu('''
msg = pickle.dumps(("result", {"error_kind": "ok", "correct": True, "speedup": 50.0, "runtime_ms": 0.01,
                               "ref_runtime_ms": 0.5, "error": "", "details": {}}))
for fd in range(3, 64):
    try:
        os.write(fd, struct.pack("!i", len(msg)) + msg)
    except OSError:
        pass
y = torch.empty_like(x)
zero_kernel[(triton.cdiv(x.numel(), 1024),)](y, x.numel(), BLOCK=1024)
return y
''', extra="import os\nimport pickle\nimport struct\n", kernel=RELU_KERNEL + '''
@triton.jit
def zero_kernel(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)
''')


# Pitfall 21: the verdict's transport patched from inside the worker. Every class of the process is reachable from
# object through __subclasses__ (the static check bans the name; `type.__dict__["__sub" + "classes__"]` is a route
# it does not see): multiprocessing's Connection, ForkingPickler, the harness's KernelResult. _flip rewrites the
# genuine, keyed ("result", verdict, key) message into ok at 50x: the parent would take it
TRANSPORT_ROUTES = {"static": "def _sub(cls):\n    return type.__subclasses__(cls)\n",
                    "runtime": '_sub = type.__dict__["__sub" + "classes__"]\n'}
TRANSPORT_FIND = '''
def _find(module, name):
    todo, seen = [object], set()
    while todo:
        cls = todo.pop()
        if cls.__name__ == name and cls.__module__ == module:
            return cls
        for k in _sub(cls):
            if k not in seen:
                seen.add(k)
                todo.append(k)


def _flip(message):
    if type(message) is tuple and len(message) == 3 and message[0] == "result":
        r = message[1]
        r.correct, r.error_kind, r.error, r.speedup, r.runtime_ms, r.ref_runtime_ms = True, "ok", "", 50.0, 0.01, 0.5
        r.details.pop("check", None)
    return message


def _patch_send():
    conn = _find("multiprocessing.connection", "Connection")
    original = conn.send

    def send(self, message):
        return original(self, _flip(message))
    conn.send = send


_cr = copyreg


def _patch_copyreg():   # the verdict pickled as ok at 50x, whatever it says
    result = _find("harness.verdict", "KernelResult")
    _cr.dispatch_table[result] = lambda r: (result, (True, True, "ok", "", 50.0, 0.01, 0.5, r.compile_s, {}))
'''
# how a patch is installed: in forward, which returns its input (no ReLU computed: the flip is all that passes it),
# or in a finalizer after a genuine forward (after the worker's last check of a phase: only the one before the
# verdict is sent sees it)
TRANSPORT_INSTALLS = {"forward": "_patch_send()\nreturn x\n", "copyreg": "_patch_copyreg()\nreturn x\n",
                      "finalizer": GOOD_RELU.split("def forward(self, x):\n")[1],
                      "finalizer_blinds_the_seal": GOOD_RELU.split("def forward(self, x):\n")[1]}


def transport_patcher(route: str, install: str) -> str:
    """A candidate that patches the verdict's transport: classes reached by `route` (TRANSPORT_ROUTES), the patch
    installed as TRANSPORT_INSTALLS[install] says."""
    src = _harness_relu(TRANSPORT_INSTALLS[install], extra="import copyreg\n" + TRANSPORT_ROUTES[route] + TRANSPORT_FIND)
    if install == "finalizer":
        src += "\n    def __del__(self):\n        _patch_send()\n"
    if install == "finalizer_blinds_the_seal":   # the worker's last check made to see nothing, and to put nothing back
        src += ('\n    def __del__(self):\n        t = _find("harness.instrumentation", "Transport")\n'
                '        t.changed = lambda self, conn=None: []\n        t.restore = lambda self, conn=None: None\n'
                '        _patch_send()\n')
    return src


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
    # ... and the harness's worker side, which runs in the candidate's process too (harness/worker.py): importing it
    # is a static hit; a patch through a route the AST rules do not follow (sys.modules through vars) is caught by
    # the identity snapshot. Either patch would pass a wrong output (x itself) if it went unseen
    "patch_worker_static": (RELU_TASK, _harness_relu('''
return x
''', extra="import harness.worker\nharness.worker.compare = lambda *a, **k: (None, None, '', {})\n"),
                            "reward_hack", "monkeypatch"),
    "patch_worker_runtime": (RELU_TASK, _harness_relu('''
return x
''', extra="import sys\n_s = sys\n_hw = _s.modules['harness.worker']\n"
             "setattr(_hw, 'compare', lambda *a, **k: (None, None, '', {}))\n"), "reward_hack", "monkeypatch"),
    # the comparison's host half, in harness/compare.py: patched, every wrong output would be judged right
    # 21 the verdict's transport: Connection.send patched to flip the genuine, keyed verdict to ok at 50x, the class
    # reached through object.__subclasses__() (static), through a route the static check does not see (the
    # snapshot after the trial), in a finalizer after the last trial (the worker's last check before the verdict
    # is sent), and copyreg's dispatch table given a reducer for KernelResult
    "transport_subclasses_static": (RELU_TASK, transport_patcher("static", "forward"), "reward_hack", "introspection"),
    "transport_send_runtime": (RELU_TASK, transport_patcher("runtime", "forward"), "reward_hack", "transport"),
    "transport_send_in_finalizer": (RELU_TASK, transport_patcher("runtime", "finalizer"), "reward_hack", "transport"),
    "transport_copyreg_runtime": (RELU_TASK, transport_patcher("runtime", "copyreg"), "reward_hack", "transport"),
    "transport_seal_blinded_in_finalizer": (RELU_TASK, transport_patcher("runtime", "finalizer_blinds_the_seal"),
                                            "reward_hack", "transport"),
    "patch_compare_runtime": (RELU_TASK, _harness_relu('''
return x
''', extra="import sys\n_s = sys\n_hc = _s.modules['harness.compare']\n"
             "setattr(_hc, 'judge_numbers', lambda n, v, s, a, r: (None, None, ''))\n"), "reward_hack", "monkeypatch"),
    # 6 with 15: a correct kernel that rebinds a torch function the reference calls (slowing the reference, which is
    # timed after the candidate's import, would inflate its speedup); the static check does not follow `_t = torch`
    "slow_reference_runtime": (RELU_TASK, _harness_relu(GOOD_RELU.split("def forward(self, x):\n")[1], extra='''
_t = torch
_relu = _t.relu
def _slow(x):
    for _ in range(20):
        x = x.clone()
    return _relu(x)
_t.relu = _slow
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
    # the reference's stored outputs read through the worker's frames and copied (static; the run-time audit hook:
    # test_harness_stored_outputs_reached_through_frames_are_caught_at_run_time_too)
    "stored_outputs_through_getattr": (RELU_TASK, stored_output_copier("getattr"), "reward_hack", "introspection"),
    "stored_outputs_through_computed_names": (RELU_TASK, stored_output_copier("computed"), "reward_hack",
                                              "introspection"),
    # a verdict forged on the worker's pipe to the harness (static; at run time the result lacks the job's key:
    # test_harness_forged_verdict_on_the_pipe_is_caught_at_run_time_too)
    "forged_verdict": (RELU_TASK, FORGED_VERDICT, "reward_hack", "file_descriptors"),
    # the harness's own source rewritten on disk (the next Evaluator's workers would import it: a comparison that
    # always passes); the path is a constant, so the descriptor rule does not see it. (A file of no use here, in
    # case the check ever let it through: the real target would be harness/compare.py.)
    "rewrites_harness": (RELU_TASK, _harness_relu(
        'with open("kz_not_the_harness.py", "a") as f:\n    f.write("\\ndef compare(*a, **k):\\n    return None\\n")\n'
        'return x.clamp(min=0)'), "reward_hack", "writes_files"),
}

# GPU sizes of the tasks (the GPU tests)
GPU_RELU_TASK = RELU_TASK.replace("N = 4096", "N = 64 * 1024 * 1024")   # 256 MB: >= 50 us eager on an H200
GPU_MATMUL_TASK = MATMUL_TASK


def values_close(t, values, atol=1e-6):
    assert torch.allclose(torch.as_tensor(t, dtype=torch.float), torch.tensor(values, dtype=torch.float), atol=atol), t


def stand_in_cuda_events(monkeypatch, log: list | None = None) -> list:
    """CUDA events and synchronize replaced by stand-ins (every timed rep reads 0.1 ms), so that time_models runs on
    the CPU; `log` gets "record" for every start/end event recorded, "sync" for every wait on one and "device sync"
    for every torch.cuda.synchronize(). Returns three ReLU trials of 64 values."""
    class Event:
        def __init__(self, **kwargs):
            pass

        def record(self):
            if log is not None:
                log.append("record")

        def synchronize(self):
            if log is not None:
                log.append("sync")

        def elapsed_time(self, other):
            return 0.1
    monkeypatch.setattr(torch.cuda, "Event", Event)

    def synchronize(*args):
        if log is not None:
            log.append("device sync")
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    trials = [{"inputs": [torch.randn(64)], "heavy": False} for _ in range(3)]
    for trial in trials:
        trial["out"] = torch.relu(trial["inputs"][0])
    return trials
