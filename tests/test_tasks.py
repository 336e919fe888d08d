"""Tests for kernelbench_tasks: the task library, the API catalog, the golden solutions and the synthetic pair generator.

Task library and catalog (CPU only): every task file passes eval_harness.lint_task on the CPU, every catalog call
template runs, and the source checks (module_uses_apis, normalized_source_hash) behave on positive and negative examples.

Golden solutions (kernelbench_tasks/solutions) and synth.py. CPU: every golden Triton solution passes the harness under
the Triton interpreter; every solution file names a golden task and a backend; synth.py is deterministic, verifies
>= 95% of its pairs, never reproduces a held-out task and writes the JSONL fields of the contract. GPU
(@pytest.mark.gpu): `eval_harness.py run` over every golden solution in both backends.
"""
import ast
import functools
import gzip
import json
import os
import random
import re
import subprocess
import sys

import pytest
import torch

import eval_harness
import kernelzero as kz
from kernelbench_tasks import catalog, synth
from tests.common import ROOT

_TASKS_DIR = os.path.join(ROOT, "kernelbench_tasks")


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


@functools.lru_cache(maxsize=1)
def _tasks_lint_reports():
    """{path: lint report} of every task on the CPU, from one lint_tasks call: each task still runs in its own worker
    process, but the pool (a zygote that imports torch and triton) starts once instead of once per task, which took
    ~6 s per task on 2 cores. (So `-k` on one task's lint lints them all: ~2 min.)"""
    return dict(zip(_TASKS_ALL, eval_harness.lint_tasks([_tasks_read(p) for p in _TASKS_ALL], device="cpu")))


@pytest.mark.parametrize("path", _TASKS_ALL, ids=[os.path.basename(p) for p in _TASKS_ALL])
def test_tasks_lint(path):
    report = _tasks_lint_reports()[path]
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


def test_tasks_catalog_examples_scaled_for_a_gpu_keep_their_shapes_consistent():
    """At 2**25 values (the seed pool's and the Proposer prompt's size on a GPU) every example of every API and rank
    still runs (on the meta device: shapes only), its inputs fit the linter's 512 MB, its output stays under 1 GB,
    and it grew: ~32M values in its largest input, or for a matmul ~2M (a 1024 x 2048 operand) or more FLOPs."""
    grew = 0
    for e in catalog.CATALOG:
        for rank in e["ranks"]:
            shapes = catalog.scaled_shapes(e, rank, 2 ** 25)
            assert [len(s) for s in shapes] == [len(s) for s in e["example_shapes"][rank]], (e["name"], rank)
            ns = {}
            exec(catalog.example_module_source(e, rank, elements=2 ** 25), ns)
            with torch.device("meta"):
                model = ns["Model"](*ns["get_init_inputs"]())
                ints = [e["domains"].get(n, "").startswith("int:") for n in e["inputs"]]
                out = model(*[torch.empty(s, dtype=torch.int64 if i else torch.float32) for s, i in zip(shapes, ints)])
            outs = out if isinstance(out, (tuple, list)) else [out]
            assert sum(4 * torch.Size(s).numel() for s in shapes) <= 512 * 2 ** 20, (e["name"], rank, shapes)
            assert max(o.numel() for o in outs) <= 2 ** 28, (e["name"], rank, shapes)
            largest = max(torch.Size(s).numel() for s in shapes)
            grew += largest >= (2 ** 20 if e["kind"] == "matmul" else 2 ** 23 // e["fanout"])
    assert grew >= 0.95 * sum(len(e["ranks"]) for e in catalog.CATALOG)   # (a few mixed-size inputs stay small)
    assert catalog.scaled_shapes(catalog.lookup("torch.mm"), 2, 2 ** 25) == [[1024, 2048], [2048, 1536]]
    assert catalog.scaled_shapes(catalog.lookup("F.relu"), 2, 0) == [[16, 32]]   # (0: the CPU's small sizes)


def test_tasks_proposer_prompt_shows_each_api_at_a_shared_rank():
    """The Proposer's prompt carries one runnable example module per API of its set, all at a rank every API of the
    set accepts, so that a module composed from them can chain the calls."""
    apis = [catalog.lookup("nn.Conv2d"), catalog.lookup("F.relu")]   # Conv2d: rank 4 only; relu: ranks 1-5
    text = catalog.render_examples(apis, 2 ** 25)
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 2 and all("rank 4," in b for b in blocks)
    prompt = kz.proposer_prompt(catalog.render_api_set(apis), text)
    assert text in prompt and "ONE new module" in prompt
    assert "Each operation" not in kz.proposer_prompt(catalog.render_api_set(apis))   # (no examples, no heading)


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
# Golden solutions and the synthetic pair generator

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


def _legacy_stream_launches(cuda_src: str) -> list[str]:
    """The kernel launches in a CUDA source that do not go to PyTorch's current stream: every <<<...>>> must pass a
    fourth argument `stream`, declared from c10::cuda::getCurrentCUDAStream() (its header included). A launch on the
    legacy default stream (<<<grid, block>>>) cannot be captured in a CUDA graph, so the harness times it eagerly,
    with the host's launch latency inside the timed window: the noisier speedup."""
    launches = re.findall(r"<<<(.*?)>>>", cuda_src, re.S)
    bad = [f"<<<{a}>>>" for a in launches if [x.strip() for x in a.split(",")][-1] != "stream" or a.count(",") < 3]
    if launches and not ("#include <c10/cuda/CUDAStream.h>" in cuda_src
                         and "cudaStream_t stream = c10::cuda::getCurrentCUDAStream();" in cuda_src):
        bad.append("no `cudaStream_t stream = c10::cuda::getCurrentCUDAStream();` (and its header)")
    return bad


def test_solutions_cuda_sources_we_teach_launch_on_the_current_stream():
    """What a Coder learns CUDA from (the one-shot example, the golden solutions, the synthetic SFT pairs) launches
    its kernels on PyTorch's current stream, so that its answers are timed as CUDA graph replays. The rule itself
    sees a legacy launch and a missing declaration."""
    sources = {"cuda_ext/example_cuda.py": open(os.path.join(ROOT, "cuda_ext", "example_cuda.py")).read()}
    sources.update({name: _solutions_read(os.path.join(SOLUTIONS, level, name))
                    for level, name in _solutions_files() if name.endswith("_cuda.py")})
    pairs, _ = synth.generate_pairs(40, "cuda", seed=11, verify=False)
    sources.update({f"synth {p['kind']} {i}": p["solution"] for i, p in enumerate(pairs)})
    assert len(sources) == 1 + 21 + 40 and {p["kind"] for p in pairs} >= {"elementwise", "gemm", "norm"}
    for where, src in sources.items():
        cuda_src = re.search(r'cuda_source = r"""(.*?)"""', src, re.S).group(1)
        assert "<<<" in cuda_src and not _legacy_stream_launches(cuda_src), (where, _legacy_stream_launches(cuda_src))
    example = sources["cuda_ext/example_cuda.py"]
    assert _legacy_stream_launches(example.replace(", 0, stream>>>", ">>>")) == ["<<<blocks, threads>>>"]
    assert _legacy_stream_launches(example.replace("cudaStream_t stream = c10::cuda::getCurrentCUDAStream();",
                                                   "cudaStream_t stream = 0;"))


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
    """`eval_harness.py run` over every golden solution of a backend: every verdict ok and timed as CUDA graph
    replays (the CUDA ones launch on PyTorch's current stream); speedups printed."""
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
            elif row["details"].get("timing_method") != "graph":   # (all launch on the current stream: capturable)
                failures.append(f"{key}: timed {row['details'].get('timing_method')}: "
                                f"{row['details'].get('graph_fallback')}")
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


def test_solutions_synth_gpu_sized_grows_only_the_sizes():
    """synth.gpu_sized (the Proposer's SFT targets on a GPU): only size constants change; a gemm's features reach
    1024 and its rows 2048, any other module's largest input lands in [elements / 2, elements); the inputs stay under
    the linter's 512 MB; the APIs are still used; no `elements`, no change. One module of each kind, so grown, passes
    the task linter on the CPU."""
    import re
    pairs, _ = synth.generate_pairs(300, "triton", seed=11, verify=False)
    size_line = re.compile(r"^\w+ = \d+$", re.M)

    def inputs(src):
        return catalog.on_meta(src)[1]

    linted = {}
    for p in pairs:
        grown = synth.gpu_sized(p["module"], 2 ** 25)
        assert size_line.sub("", grown) == size_line.sub("", p["module"]), grown   # (the rest is untouched)
        assert synth.gpu_sized(p["module"], 0) == p["module"]
        xs = inputs(grown)
        largest = max(x.numel() for x in xs)
        if p["kind"] == "gemm":
            features = {k: int(v) for k, v in re.findall(r"^(in_features|out_features) = (\d+)$", grown, re.M)}
            assert min(features.values()) >= 1024 and largest // features["in_features"] >= 2048, grown
        else:
            assert 2 ** 24 <= largest < 2 ** 25 or largest == max(x.numel() for x in inputs(p["module"])), grown
        assert sum(x.numel() * x.element_size() for x in xs) <= 512 * 2 ** 20, grown
        assert catalog.module_uses_apis(grown, p["apis"]) == [], grown
        linted.setdefault(p["kind"], grown)
    reports = eval_harness.lint_tasks(list(linted.values()), device="cpu", workers=2)
    assert all(r["ok"] for r in reports), [(k, r["problems"]) for k, r in zip(linted, reports) if not r["ok"]]


def test_solutions_compose_chains_two_apis_and_the_list_lints():
    """compose.py: the second API takes the first's output (its other inputs shaped like that output), a module each
    in its own attribute; a second API whose inputs differ in shape is not composable; the committed list renders at
    the example and the GPU sizes (inputs under 512 MB), spans most catalog kinds, and a sample of it passes the task
    linter on the CPU."""
    import random
    from kernelbench_tasks import compose
    src = compose.composed_module("torch.cummin", "torch.nn.functional.relu", 2)
    assert "h = torch.cummin(x, dim=-1).values\n        return F.relu(h)" in src, src
    src = compose.composed_module("torch.mm", "torch.add", 2, 2 ** 25)
    assert "return torch.add(h, u)" in src and "torch.randn((1024, 1536))" in src, src   # u: h's shape
    two = compose.composed_module("torch.nn.Linear", "torch.nn.LayerNorm", 2)
    assert "self.op1 = nn.Linear(32, 64)" in two and "return self.op2(h)" in two, two
    assert not compose.composable("torch.mm") and not compose.composable("torch.nn.functional.cross_entropy")
    assert compose.composable("torch.add") and compose.composable("torch.cumsum")
    listed = json.load(open(compose.COMPOSITIONS))
    assert listed["stats"]["kept"] == len(listed["compositions"]) >= 500
    small, large = compose.proposer_targets(0), compose.proposer_targets(2 ** 25)
    assert len(small) == len(large) == len(listed["compositions"])
    kinds = {catalog.BY_NAME[apis[0]]["kind"] for apis, _ in small}
    assert len(kinds) >= 9, kinds
    for apis, module in large:
        xs = catalog.on_meta(module)[1]
        assert sum(x.numel() * x.element_size() for x in xs) <= 512 * 2 ** 20, module
        assert catalog.module_uses_apis(module, apis) == [], module
    sample = random.Random(0).sample(small, 8)
    reports = eval_harness.lint_tasks([module for _, module in sample], device="cpu", workers=2)
    failed = [(apis, r["problems"]) for (apis, _), r in zip(sample, reports) if not r["ok"]]
    assert not failed, failed


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
