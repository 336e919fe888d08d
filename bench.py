"""bench.py: KernelZero's benchmarks, one subcommand each; results print as tables and are appended as JSON lines to
OUT/bench.jsonl (BENCHMARKS.md quotes them).

  python bench.py harness --out runs/bench     # GPU machine: CUDA build latency, harness throughput, timing stability

`harness` needs a GPU, nvcc and ninja. On one H200 (16 cores) the whole run takes ~15 minutes; in pieces of < 10:
  python bench.py harness --sections cold,warm                                    # ~4 min
  python bench.py harness --sections throughput --throughput-backends cuda        # ~7 min
  python bench.py harness --sections throughput,stability --throughput-backends triton   # ~5 min
Sections:
  (a) cold: >= 5 different small CUDA candidates built with cuda_ext.build.fast_load_inline and with torch's plain
      load_inline (default flags, fresh build directories), each build in its own fresh process, `parallel_builds`
      builds of one kind at a time (each build runs ~2 compiler processes, so 5 at a time fit 16 cores). Median and
      ratio. The precompiled header that fast builds use is built once per machine first and reported separately.
  (b) warm: the same source again in a new process (fast: a cache hit, the .so is imported directly; plain: ninja
      finds nothing to do).
  (c) throughput: 32 CUDA + 32 Triton candidates (correct, wrong, not compiling, mixed) through
      eval_harness.Evaluator, against evaluating them one after another in one process with plain load_inline, as
      KernelBench's eval_from_generations does on one GPU (import, build, check, time). The sequential baseline
      runs on a subset (`baseline_cuda`, `baseline_triton`) and is extrapolated per backend: the output says so.
      Verdicts are compared with the label each candidate was generated with, and with the baseline's.
  (d) stability: one candidate whose kernel takes >= 100 us, measured by `stability_runs` separate evaluate() runs:
      max/min of its speedup.
Every generated candidate carries a per-run tag inside its kernel source, so no build cache (ours, torch's, Triton's)
can serve a cold measurement from an earlier run.

How it departs from KernelBench's scripts: (1) builds are timed in fresh processes (torch import excluded);
(2) the sequential baseline checks 3 trials with atol = rtol = 1e-4 (KernelBench: 5 trials, 1e-2).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)   # spawned workers import cuda_ext and eval_harness from here


@dataclass
class Config:
    command: str = "harness"         # what to benchmark: harness (rollout and train are added by the trainer's helper)
    out: str = "runs/bench"          # results are appended to OUT/bench.jsonl
    sections: str = "cold,warm,throughput,stability"  # comma-separated subset of the harness sections to run
    cold_candidates: int = 5         # (a) different CUDA candidates, each built cold with fast and with plain
    parallel_builds: int = 5         # (a) builds of one kind running at once (1 = strictly one after another)
    throughput_backends: str = "cuda,triton"  # (c) which backends (one command each fits the GPU machine's 10 min)
    cuda_candidates: int = 32        # (c) CUDA candidates through the Evaluator
    triton_candidates: int = 32      # (c) Triton candidates through the Evaluator
    baseline_cuda: int = 3           # (c) CUDA candidates also evaluated sequentially with plain load_inline (~50 s each)
    baseline_triton: int = 8         # (c) Triton candidates also evaluated sequentially
    timing_budget_s: float = 0.5     # (c) the harness's timing budget per candidate (its default is 2.0)
    stability_runs: int = 5          # (d) separate evaluate() runs of one >= 100 us candidate
    seed: int = 0                    # which candidate variants are generated


# ---------------------------------------------------------------------------------------------------------------------
# Candidate generators: KernelBench-style references and CUDA/Triton candidates, each source different
#
# Every candidate is (ref_src, cand_src, label) with label "ok" (correct), "wrong" (compiles, wrong output) or "fail"
# (does not compile / does not run). A per-run `tag` goes inside each kernel's source text, so that the build caches
# (cuda_ext's, torch's, Triton's: all keyed by source) never turn a cold build into a warm one.

OPS = {  # name: (torch expression of a and b, CUDA expression of x and y, Triton expression of x and y)
    "add": ("a + b", "x + y", "x + y"),
    "sub": ("a - b", "x - y", "x - y"),
    "mul": ("a * b", "x * y", "x * y"),
    "max": ("torch.maximum(a, b)", "fmaxf(x, y)", "tl.maximum(x, y)"),
}
WRONG_OP = {"add": "sub", "sub": "add", "mul": "add", "max": "mul"}


def ref_elementwise(op: str, n: int) -> str:
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return {OPS[op][0]}


N = {n}


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
'''


def ref_rowsum(rows: int, cols: int) -> str:
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sum(x, dim=1)


ROWS, COLS = {rows}, {cols}


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
'''


def cuda_elementwise(op: str, tag: str, label: str, threads: int, grid_stride: bool, cuda_flags: list,
                     stream: bool = False) -> dict:
    """load_inline pieces of an elementwise CUDA candidate; `label` says how it is broken ("ok": not). `stream`:
    launch on at::cuda::getCurrentCUDAStream() (a common pattern; needs <ATen/cuda/CUDAContext.h>)."""
    expr = OPS[WRONG_OP[op] if label == "wrong" else op][1]
    end = ";" if label != "fail" else ""   # "fail": a missing semicolon, a compile error
    if grid_stride:
        loop = (f"for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; "
                f"i += (int64_t)gridDim.x * blockDim.x) {{\n        float x = a[i], y = b[i];\n"
                f"        out[i] = {expr}{end}\n    }}")
        blocks = f"std::min<int64_t>((n + {threads} - 1) / {threads}, 8192)"
    else:
        loop = (f"int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) {{\n"
                f"        float x = a[i], y = b[i];\n        out[i] = {expr}{end}\n    }}")
        blocks = f"(n + {threads} - 1) / {threads}"
    include = "#include <ATen/cuda/CUDAContext.h>\n" if stream else ""
    launch = f"<<<{blocks}, {threads}, 0, at::cuda::getCurrentCUDAStream()>>>" if stream else f"<<<{blocks}, {threads}>>>"
    cuda = f"""#include <torch/extension.h>
{include}
__global__ void ew_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, int64_t n) {{
    // kz-bench {tag}
    {loop}
}}

torch::Tensor ew_forward(torch::Tensor a, torch::Tensor b) {{
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "CUDA tensors expected");
    a = a.contiguous();
    b = b.contiguous();
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    ew_kernel{launch}(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}}
"""
    return dict(name=f"kzb_{op}", cpp_sources="torch::Tensor ew_forward(torch::Tensor a, torch::Tensor b);",
                cuda_sources=cuda, functions=["ew_forward"], extra_cuda_cflags=cuda_flags, args="a, b")


def cuda_rowsum(tag: str, label: str, threads: int, cuda_flags: list) -> dict:
    """A row-sum CUDA candidate: one block per row, a shared-memory tree reduction."""
    bound = "cols - 1" if label == "wrong" else "cols"   # "wrong": skips the last column
    undeclared = " + missing_offset" if label == "fail" else ""   # "fail": an undeclared identifier
    cuda = f"""#include <torch/extension.h>
#define THREADS {threads}

__global__ void rowsum_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t cols) {{
    // kz-bench {tag}
    __shared__ float buf[THREADS];
    const float* row = x + (int64_t)blockIdx.x * cols{undeclared};
    float acc = 0.0f;
    for (int64_t j = threadIdx.x; j < {bound}; j += THREADS) acc += row[j];
    buf[threadIdx.x] = acc;
    __syncthreads();
    for (int s = THREADS / 2; s > 0; s >>= 1) {{
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }}
    if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}}

torch::Tensor rowsum_forward(torch::Tensor x) {{
    TORCH_CHECK(x.is_cuda() && x.dim() == 2, "a 2-D CUDA tensor expected");
    x = x.contiguous();
    auto out = torch::empty({{x.size(0)}}, x.options());
    rowsum_kernel<<<x.size(0), THREADS>>>(x.data_ptr<float>(), out.data_ptr<float>(), x.size(1));
    return out;
}}
"""
    return dict(name="kzb_rowsum", cpp_sources="torch::Tensor rowsum_forward(torch::Tensor x);", cuda_sources=cuda,
                functions=["rowsum_forward"], extra_cuda_cflags=cuda_flags, args="x")


def cuda_module(pieces: dict) -> str:
    """The candidate file for load_inline pieces (KernelBench style: the build runs when the module is imported)."""
    fn = pieces["functions"][0]
    return f'''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
{pieces["cuda_sources"]}"""

ext = load_inline(name="{pieces["name"]}", cpp_sources="{pieces["cpp_sources"]}", cuda_sources=cuda_source,
                  functions={pieces["functions"]!r}, extra_cuda_cflags={pieces["extra_cuda_cflags"]!r})


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {pieces["args"]}):
        return ext.{fn}({pieces["args"]})
'''


def triton_elementwise(op: str, tag: str, label: str, block: int) -> str:
    expr = OPS[WRONG_OP[op] if label == "wrong" else op][2]
    load_b = "tl.load(c_ptr + offs, mask=mask)" if label == "fail" else "tl.load(b_ptr + offs, mask=mask)"
    return f'''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def ew_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # kz-bench {tag}
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(a_ptr + offs, mask=mask)
    y = {load_b}
    tl.store(out_ptr + offs, {expr}, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty_like(a)
        n = out.numel()
        ew_kernel[(triton.cdiv(n, {block}),)](a, b, out, n, BLOCK={block})
        return out
'''


def triton_rowsum(tag: str, label: str, cols: int) -> str:
    mask = "offs < cols - 1" if label == "wrong" else "offs < cols"
    arange = "tl.arange(0, BLOCK - 1)" if label == "fail" else "tl.arange(0, BLOCK)"   # not a power of 2
    return f'''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rowsum_kernel(x_ptr, out_ptr, cols, BLOCK: tl.constexpr):
    # kz-bench {tag}
    row = tl.program_id(0)
    offs = {arange}
    x = tl.load(x_ptr + row * cols + offs, mask={mask}, other=0.0)
    tl.store(out_ptr + row, tl.sum(x, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
        rowsum_kernel[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
        return out
'''


def candidates(backend: str, count: int, tag: str, seed: int = 0, n: int = 1 << 24,
               rows: int = 4096, cols: int = 4096) -> list[tuple[str, str, str]]:
    """`count` (ref_src, cand_src, label) triples: every 4th a row sum, the rest elementwise ops; labels cycle
    ok, ok, wrong, ok, fail, ok, ... (~60% ok, 20% wrong, 20% fail); block sizes and loop styles vary."""
    labels = ["ok", "ok", "wrong", "ok", "fail"]
    out = []
    for i in range(count):
        j = i + seed
        label, t = labels[j % len(labels)], f"{tag}-{i}"
        threads = (128, 256, 512)[j % 3]
        if j % 4 == 3:
            ref = ref_rowsum(rows, cols)
            cand = (cuda_module(cuda_rowsum(t, label, threads, ["-O3"] if j % 2 else []))
                    if backend == "cuda" else triton_rowsum(t, label, cols))
        else:
            op = list(OPS)[j % len(OPS)]
            ref = ref_elementwise(op, n)
            cand = (cuda_module(cuda_elementwise(op, t, label, threads, j % 2 == 0, ["-O3", "--use_fast_math"][: j % 3],
                                                 stream=j % 3 == 1))
                    if backend == "cuda" else triton_elementwise(op, t, label, (1024, 2048, 4096)[j % 3]))
        out.append((ref, cand, label))
    return out


# ---------------------------------------------------------------------------------------------------------------------
# Small helpers: tables, JSON lines, fresh processes

def table(title: str, header: list[str], rows: list[list]) -> None:
    cells = [header] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(r[k]) for r in cells) for k in range(len(header))]
    print(f"\n{title}")
    for k, r in enumerate(cells):
        print("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths)))
        if k == 0:
            print("  " + "  ".join("-" * w for w in widths))


def record(cfg: Config, section: str, result: dict) -> None:
    os.makedirs(cfg.out, exist_ok=True)
    row = {"bench": cfg.command, "section": section, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
           "host": platform.node(), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, **result}
    with open(os.path.join(cfg.out, "bench.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def ninja_steps(directory: str) -> dict:
    """Seconds per build step (main.o, cuda.cuda.o, the .so link) from the .ninja_log files under `directory`."""
    steps = {}
    for here, _, files in os.walk(directory):
        if ".ninja_log" in files:
            for line in open(os.path.join(here, ".ninja_log")).read().splitlines()[1:]:
                start, end, _, output, _ = line.split("\t")
                steps["link" if output.endswith(".so") else output] = (int(end) - int(start)) / 1000
    return steps


def build_once(job: dict) -> dict:
    """One build in a fresh process (Pool(maxtasksperchild=1)): torch's import and the CUDA initialisation (the
    candidate's process does both anyway, and torch needs the GPU to pick the arch) are not timed, the build is."""
    from cuda_ext import build
    torch.cuda.init()
    pieces = {k: job[k] for k in ("name", "cpp_sources", "cuda_sources", "functions", "extra_cuda_cflags")}
    os.makedirs(job["root"], exist_ok=True)
    t0 = time.perf_counter()
    try:
        if job["mode"] == "fast":
            module = build.fast_load_inline(**pieces, build_directory=job["root"])
        else:
            module = build.PLAIN_LOAD_INLINE(**pieces, build_directory=job["root"])
        path, error = getattr(module, "__kz_build__", "plain"), ""
    except Exception as e:   # noqa: BLE001  a failed build is a result too
        path, error = "failed", str(e)[-300:]
    return {"mode": job["mode"], "seconds": time.perf_counter() - t0, "path": path, "error": error,
            "steps": ninja_steps(job["root"])}


def in_fresh_processes(jobs: list[dict], parallel: int) -> list[dict]:
    with multiprocessing.get_context("spawn").Pool(parallel, maxtasksperchild=1) as pool:
        return pool.map(build_once, jobs, chunksize=1)


# ---------------------------------------------------------------------------------------------------------------------
# (a) cold builds and (b) warm builds

def bench_cold_warm(cfg: Config, tag: str, sections: set) -> None:
    from cuda_ext import build
    t0 = time.perf_counter()
    pch = build.ensure_pch([], [], verbose=True)   # once per machine and flag set; every fast build reuses it
    pch_s = time.perf_counter() - t0
    print(f"precompiled <torch/extension.h>: {pch} ({pch_s:.1f} s, one-time per machine; 0 s if it existed)")
    pieces = []
    for i in range(cfg.cold_candidates):   # different ops, block sizes, loop styles and flags: all sources differ
        if i % 3 == 2:
            pieces.append(cuda_rowsum(f"{tag}-cold{i}", "ok", (128, 256, 512)[i % 3], ["-O3"] if i % 2 else []))
        else:
            pieces.append(cuda_elementwise(list(OPS)[i % 4], f"{tag}-cold{i}", "ok", (128, 256, 512)[i % 3],
                                           i % 2 == 0, ["-O3", "--use_fast_math"][: i % 3]))
    root = tempfile.mkdtemp(prefix="kzbench_builds_")
    jobs = {mode: [dict(p, mode=mode, root=os.path.join(root, f"{mode}{i}")) for i, p in enumerate(pieces)]
            for mode in ("plain", "fast")}
    results = {}
    if "cold" in sections:
        for mode in ("plain", "fast"):
            t1 = time.perf_counter()
            results[mode] = in_fresh_processes(jobs[mode], cfg.parallel_builds)
            print(f"{mode}: {len(pieces)} cold builds, {cfg.parallel_builds} at a time, in "
                  f"{time.perf_counter() - t1:.1f} s")
        rows = [[i, f"{p['name']}", results["plain"][i]["seconds"], results["fast"][i]["seconds"],
                 results["fast"][i]["seconds"] / results["plain"][i]["seconds"], results["fast"][i]["path"]]
                for i, p in enumerate(pieces)]
        med = {m: statistics.median(r["seconds"] for r in results[m]) for m in results}
        rows.append(["median", "", med["plain"], med["fast"], med["fast"] / med["plain"], ""])
        table(f"(a) cold builds, seconds (fresh process and build directory each; {cfg.parallel_builds} of a kind at "
              f"a time)", ["#", "candidate", "plain", "fast", "fast/plain", "fast path"], rows)
        steps = sorted({k for m in results for r in results[m] for k in r["steps"]})
        table("(a) median seconds per ninja step (the two compiles run in parallel; the link waits for both)",
              ["mode", *steps], [[m, *[statistics.median([r["steps"].get(k, 0.0) for r in results[m]]) for k in steps]]
                                 for m in results])
        record(cfg, "cold", {"pch_build_s": pch_s, "parallel_builds": cfg.parallel_builds, "median_plain_s": med["plain"],
                             "median_fast_s": med["fast"], "ratio": med["fast"] / med["plain"], "builds": results})
    if "warm" in sections:
        if "cold" not in sections:   # warm needs something built
            in_fresh_processes([jobs["fast"][0], jobs["plain"][0]], 2)
        warm = in_fresh_processes([jobs["fast"][0], jobs["plain"][0]], 1)
        table("(b) warm build of the same source in a new process, seconds", ["mode", "seconds", "path"],
              [[w["mode"], w["seconds"], w["path"]] for w in warm])
        record(cfg, "warm", {"fast_s": warm[0]["seconds"], "fast_path": warm[0]["path"], "plain_s": warm[1]["seconds"]})


# ---------------------------------------------------------------------------------------------------------------------
# (c) throughput: the Evaluator against KernelBench-style sequential evaluation

def coarse(error_kind: str) -> str:
    """ok / wrong (ran, wrong output) / fail (anything else), to compare with the generated labels."""
    return {"ok": "ok", "mismatch": "wrong"}.get(error_kind, "fail")


def load_source(src: str, name: str, directory: str):
    path = os.path.join(directory, f"{name}.py")
    with open(path, "w") as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sequential_eval(ref_src: str, cand_src: str, name: str, directory: str, trials: int = 3, reps: int = 100) -> str:
    """KernelBench's eval_from_generations on one GPU, in this process: import (the CUDA build happens here, with
    plain load_inline), check `trials` random inputs, time reference and candidate with CUDA events."""
    try:
        ref = load_source(ref_src, f"{name}_ref", directory)
        cand = load_source(cand_src, f"{name}_cand", directory)
    except Exception:   # noqa: BLE001
        return "fail"
    try:
        model = ref.Model(*ref.get_init_inputs()).cuda()
        new = cand.ModelNew(*ref.get_init_inputs()).cuda()
        with torch.no_grad():
            for t in range(trials):
                torch.manual_seed(t)
                inputs = [x.cuda() for x in ref.get_inputs()]
                want, got = model(*inputs), new(*inputs)
                if got.shape != want.shape or not torch.allclose(got, want, atol=1e-4, rtol=1e-4):
                    return "wrong"
            for m in (model, new):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(reps):
                    m(*inputs)
                end.record()
                torch.cuda.synchronize()
        return "ok"
    except Exception:   # noqa: BLE001  a Triton compile error surfaces at the first call
        return "fail"


def bench_throughput(cfg: Config, tag: str) -> None:
    import eval_harness
    counts = {"cuda": cfg.cuda_candidates, "triton": cfg.triton_candidates}
    sets = {b: candidates(b, counts[b], f"{tag}-tp", cfg.seed) for b in cfg.throughput_backends.split(",")}
    rows, summary = [], {}
    for backend, pairs in sets.items():
        t0 = time.perf_counter()
        with eval_harness.Evaluator(backend=backend, timing_budget_s=cfg.timing_budget_s) as ev:
            results = ev.map([(r, c) for r, c, _ in pairs])
        harness_s = time.perf_counter() - t0
        got = [coarse(r.error_kind) for r in results]
        agree = sum(g == label for g, (_, _, label) in zip(got, pairs))
        kinds = [r.error_kind for r in results]
        # the sequential baseline: a subset, in this process, with torch's plain load_inline (fresh extension dir)
        n_base = min(cfg.baseline_cuda if backend == "cuda" else cfg.baseline_triton, len(pairs))
        os.environ["TORCH_EXTENSIONS_DIR"] = tempfile.mkdtemp(prefix="kzbench_torch_ext_")
        directory = tempfile.mkdtemp(prefix="kzbench_seq_")
        t1 = time.perf_counter()
        subset = ([0, 2, 4] + list(range(len(pairs))))   # with seed 0: labelled ok, wrong, fail
        subset = list(dict.fromkeys(i for i in subset if i < len(pairs)))[:n_base]
        base = [sequential_eval(pairs[i][0], pairs[i][1], f"seq_{backend}_{i}", directory) for i in subset]
        base_s = time.perf_counter() - t1
        base_total = base_s / max(n_base, 1) * len(pairs)
        base_agree = sum(b == got[i] for b, i in zip(base, subset))
        rows.append([backend, len(pairs), harness_s, f"{base_total:.1f}" + (" (est.)" if n_base < len(pairs) else ""),
                     base_total / harness_s, f"{agree}/{len(pairs)}", f"{base_agree}/{n_base}"])
        summary[backend] = {"n": len(pairs), "harness_s": harness_s, "baseline_measured": n_base,
                            "baseline_measured_s": base_s, "baseline_total_s": base_total,
                            "labels": [p[2] for p in pairs], "harness": kinds, "baseline": dict(zip(subset, base)),
                            "agree_with_labels": agree, "agree_with_baseline": base_agree,
                            "compile_s": [r.compile_s for r in results]}
        for i, ((_, _, label), r) in enumerate(zip(pairs, results)):   # (every 3rd CUDA candidate includes
            if coarse(r.error_kind) != label:                            # ATen/cuda/CUDAContext.h: cuSPARSE headers)
                print(f"{backend} #{i}: labelled {label}, harness says {r.error_kind}: {r.error[:300]!r}")
    table("(c) throughput, seconds: Evaluator vs one-after-another in one process with plain load_inline "
          "(est. = the baseline ran on a subset and is extrapolated per candidate)",
          ["backend", "candidates", "harness", "sequential", "speedup", "harness=label", "baseline=harness"], rows)
    record(cfg, "throughput", summary)


# ---------------------------------------------------------------------------------------------------------------------
# (d) timing stability

def bench_stability(cfg: Config, tag: str) -> None:
    import eval_harness
    ref = ref_elementwise("add", 1 << 26)   # 64M floats: ~0.8 GB of traffic, ~200 us on an H200
    cand = cuda_module(cuda_elementwise("add", f"{tag}-stab", "ok", 256, True, []))
    runs = [eval_harness.evaluate(ref, cand, backend="cuda") for _ in range(cfg.stability_runs)]
    rows = [[i, r.error_kind, r.runtime_ms, r.ref_runtime_ms, r.speedup] for i, r in enumerate(runs)]
    speedups = [r.speedup for r in runs if r.speedup]
    spread = max(speedups) / min(speedups) if speedups else None
    table(f"(d) timing stability: one candidate, {cfg.stability_runs} separate evaluate() runs; max/min speedup = "
          f"{spread}", ["run", "verdict", "cand ms", "ref ms", "speedup"], rows)
    record(cfg, "stability", {"runs": [dataclasses.asdict(r) for r in runs], "max_over_min_speedup": spread})


def bench_harness(cfg: Config) -> None:
    if not torch.cuda.is_available():
        sys.exit("bench.py harness needs a CUDA GPU (and nvcc, ninja): run it on the GPU machine")
    tag = f"{time.time_ns()}"   # makes every source of this run new to every build cache
    sections = set(cfg.sections.split(","))
    t0 = time.perf_counter()
    if sections & {"cold", "warm"}:
        bench_cold_warm(cfg, tag, sections)
    if "throughput" in sections:
        bench_throughput(cfg, tag)
    if "stability" in sections:
        bench_stability(cfg, tag)
    print(f"\nbench.py harness: {time.perf_counter() - t0:.0f} s; results appended to {cfg.out}/bench.jsonl")


# ---------------------------------------------------------------------------------------------------------------------
# rollout and train benchmarks: reserved here, in this order, for the trainer's helper (not implemented yet).


# ---------------------------------------------------------------------------------------------------------------------
# main

COMMANDS = {"harness": bench_harness}


def parse_args(argv=None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=sorted(COMMANDS))
    for f in dataclasses.fields(Config):
        if f.name != "command":
            p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    return Config(**vars(p.parse_args(argv)))


def main(cfg: Config) -> None:
    print("config:", json.dumps(dataclasses.asdict(cfg)))
    COMMANDS[cfg.command](cfg)


if __name__ == "__main__":
    main(parse_args())
