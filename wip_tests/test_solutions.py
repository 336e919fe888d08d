"""Tests for the golden solutions (kernelbench_tasks/solutions) and the synthetic pair generator (synth.py).

CPU: every golden Triton solution passes the harness under the Triton interpreter; every solution file names a
golden task and a backend; synth.py is deterministic, verifies >= 95% of its pairs, never reproduces a held-out task
and writes the JSONL fields of the contract. GPU (@pytest.mark.gpu): `eval_harness.py run` over every golden
solution in both backends.
"""
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    has 8M-element inputs and the interpreter runs the real sizes (plus the heavy-tailed trial and a re-run)."""
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
# Golden solutions: the GPU (the lead runs these on the H200)


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
            speedups[key] = row["speedup"]
            if row["error_kind"] != "ok":
                failures.append(f"{key}: {row['error_kind']}: {row['error'][:500]}")
        seen = {row["solution"] for row in rows}
        missing = [n for n in GOLDEN[level] if f"{n}_{backend}.py" not in seen]
        assert not missing, f"{level}: no verdict for {missing}"
    with capsys.disabled():
        print(f"\n{backend} golden speedups: " + json.dumps(speedups, indent=1))
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
