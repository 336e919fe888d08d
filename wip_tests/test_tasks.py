"""Tests for kernelbench_tasks: the level1/level2 task files and the API catalog (helper "tasks").

CPU only: every task file passes eval_harness.lint_task on the CPU, every catalog call template runs, and the
source checks (module_uses_apis, normalized_source_hash) behave on positive and negative examples.
"""
import os
import random
import re
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_TASKS_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
@pytest.mark.parametrize("path", _TASKS_ALL, ids=[os.path.basename(p) for p in _TASKS_ALL])
def test_tasks_lint_gpu(path):
    """On the GPU the lint also requires >= 50 us of eager time (launch overhead must not dominate)."""
    import eval_harness
    report = eval_harness.lint_task(_tasks_read(path), device="cuda")
    assert report["ok"], (report["problems"], report["eager_ms"])


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
