"""bench.py: KernelZero's benchmarks, one subcommand each; results print as tables and are appended as JSON lines to
OUT/bench.jsonl (BENCHMARKS.md quotes them).

  python bench.py harness --out runs/bench     # GPU machine: CUDA build latency, harness throughput, timing stability
  python bench.py rollout --out runs/bench     # GPU machine: the trainer's rollouts against plain model.generate
  python bench.py train --out runs/bench       # GPU machine: the CA-GRPO update step, FLOP/s and peak memory
  python bench.py attention --out runs/bench   # GPU machine: one decode step's attention, per implementation
  python bench.py models --out runs/bench      # named models before training: load time, Coder pass@k, Proposer validity

`harness` needs a GPU, nvcc and ninja. On one H200 (16 cores) the whole run takes ~15 minutes; in pieces of < 10:
  python bench.py harness --sections cold,warm                                    # ~4 min
  python bench.py harness --sections throughput --throughput-backends cuda        # ~7 min
  python bench.py harness --sections throughput,stability --throughput-backends triton   # ~5 min
Sections:
  (a) cold: >= 5 different small CUDA candidates built with cuda_ext.build.fast_load_inline and with torch's plain
      load_inline (default flags, fresh build directories), each build in its own fresh process, `parallel_builds`
      builds of one kind at a time (each build runs ~2 compiler processes, so 5 at a time fit 16 cores). Median and
      ratio. The precompiled header that fast builds use is built once per machine first and reported separately.
      `--cold-stream c10` launches the elementwise ones on PyTorch's current stream, as the one-shot example does
      (what its header costs a build: run both ways in one call).
  (b) warm: the same source again in a new process (fast: a cache hit, the .so is imported directly; plain: ninja
      finds nothing to do).
  (c) throughput: 32 CUDA + 32 Triton candidates (correct, wrong, not compiling, mixed) through
      eval_harness.Evaluator, against evaluating them one after another in one process with plain load_inline, as
      KernelBench's eval_from_generations does on one GPU (import, build, check, time). The sequential baseline
      runs on a subset (`baseline_cuda`, `baseline_triton`) and is extrapolated per backend: the output says so.
      Verdicts are compared with the label each candidate was generated with, and with the baseline's.
  (d) stability: one candidate whose kernel takes >= 100 us, measured by `stability_runs` separate evaluate() runs:
      max/min of its speedup.
  (e) round: a round-shaped batch (16 tasks x 8 candidates from the golden solutions, mostly correct) through the
      Evaluator, against an older harness on the same batch (`round_*` fields; BENCHMARKS.md says how it is made).
      Each run reports the host's and the GPU's busy fractions and how much of the GPU slots' time candidates held.
  (f) processes: what the harness's isolation (one fresh process per candidate, so one CUDA context each) costs
      the GPU's driver, with nothing of the harness in the way. A process that imported torch but never touched CUDA
      (as a worker zygote) forks `processes_children` children, `processes_at_once` alive at a time; each creates
      its context, runs one tiny op and exits: ms per child at each concurrency, the floor that no harness keeping
      the isolation gets under. Then N processes (`processes_syncing`) each launch a tiny kernel and synchronize,
      over and over, at once: the median latency of one launch + sync, i.e. what time-slicing the GPU between
      processes adds to every host sync. `processes_env` repeats both under other environments (driver knobs such
      as CUDA_DEVICE_MAX_CONNECTIONS, the number of hardware queues each context gets).
  (g) kernelbench: official KernelBench tasks (`kb_dir`, level `kb_level`, the first `kb_tasks`) x `kb_samples`
      Triton candidates each, through the Evaluator with its reference server (a task's trials made once per GPU,
      mapped by its candidates) and without (`kb_runs`, alternated: machines drift): wall seconds, the ratio, where
      the harness's seconds went, each candidate's GPU peak against the memory it was admitted with, and whether
      every verdict is the same. No model here, so the candidates are made
      from the task itself (kb_candidates): its reference plus a Triton copy of the output (correct on every trial,
      then a PyTorch fallback), the same with the copy off by one (a mismatch on the first trial), one that raises
      in forward; that is the reference, trials and correctness path, which the server changes. Where one of our
      Triton solutions computes the task (KB_GOLDEN: ReLU, Sigmoid, Tanh, Swish) the fourth candidate is that
      solution: correct, hence timed, so its GPU peak covers the timing's memory too.
Every generated candidate carries a per-run tag inside its kernel source, so no build cache (ours, torch's, Triton's)
can serve a cold measurement from an earlier run.

How it departs from KernelBench's scripts: (1) builds are timed in fresh processes (torch import excluded);
(2) the sequential baseline checks 3 trials with atol = rtol = 1e-4 (KernelBench: 5 trials, 1e-2).

`rollout` and `train` time the trainer's own code on any kernelzero model name (default: the named offline model
qwen-coder-0.5b, which needs its packages, see docs/training.md, "Models") and on a random Qwen2 model shaped like Qwen2.5-Coder-1.5B (no
download; Qwen's or SmolLM2's tokenizer when installed, for realistic prompt lengths).
  rollout: Coder prompts (level-1 modules) through kernelzero.rollout with the trainer's Config (bf16 sampler, static
      cache + compiled decode, then the fp32 log-prob pass), `rollout_new_tokens` per completion, at each batch of
      `rollout_batches`. The first call of a shape compiles: its extra time is reported separately, and the "phase"
      speedup counts it once over `phase_prompts` prompts. Baseline: plain generate on the same bf16 sampler (stock
      sdpa, dynamic cache, nothing compiled, same sampling settings), warmed up, timed over `baseline_new_tokens`
      steps and extrapolated (the table says so). Then greedy token ids of both paths (the rollout path with the first
      `rollout_attention`), before and after one policy_update.
      `rollout_attention` sets the sampler's attention for the timed rollouts, any of plumbing.models.ATTENTIONS:
      sdpa_gqa (plumbing/models.py's GQA-aware function, the trainer's default) and sdpa (transformers' stock: with a
      mask it copies K/V G times per layer and step). Each batch is timed with each (a switch recompiles: in compile s); when sdpa is
      among them, an "attention" record per other one gives stock ms/step / its ms/step. Each new batch size or attention is another
      compile of the same code, and dynamo falls back to eager beyond torch._dynamo.config.recompile_limit (8): time one batch per call
      when comparing, e.g. `python bench.py rollout --rollout-models smollm2 --rollout-batches 64
      --rollout-attention sdpa_gqa,sdpa`. `--rollout-profile` (GPU): after each timed rollout, `profile_steps`
      decode steps of the same compiled path under torch.profiler: the top CUDA kernels and kernel ms against wall ms
      per step (GPU-busy share), in a "rollout_profile" record.
  train: kernelzero.policy_update on `train_seqs` x `train_seq_len` random tokens, per `train_lora` setting (LoRA
      rank, 0: all weights), gradient-checkpointing setting and `train_logprob_chunk` setting (kernelzero's
      logprob_chunk: lm_head and log-softmax over that many completion tokens at a time, recomputed in backward):
      median step time, tokens/s, 6 x params x tokens / step (4 x with LoRA: the frozen weights get no gradient)
      against a bf16 torch.matmul timed in the same process, peak memory allocated.
  attention: the attention of one decode step alone (every layer, one query per sequence over a static cache of
      `attention_cache` slots of which `attention_filled` hold tokens, random left padding), per implementation in
      `attention_variants`: sdpa_gqa (plumbing.models.sdpa_gqa_attention as the eager sampler runs it), *_compiled (the
      function under torch.compile, as in the compiled decode step; flex is a flex_attention with the mask as a
      score_mod). Relative error against float64 on the CPU; on a GPU the layers are captured in one CUDA graph and
      replayed (like the decode step's reduce-overhead graphs), median of `attention_reps` event-timed replays,
      against the floor of reading K and V once at the copy bandwidth measured in the same call.
How these depart from plain generate and training: EOS is masked until the last token in both paths (min_new_tokens),
so every call decodes the same number of steps; the greedy check runs rollout at temperature 0. Random weights have
near-tied logits, so one bf16 rounding difference can flip a greedy token: exact greedy identity is meaningful for
SmolLM2. On a CPU (the tests) the trainer's tiny preset
runs (short prompts, nothing compiled) and the GPU-only fields are null.
On one H200 (2026-12-02): `rollout` ~8 min (of which ~200 s compiling: ~30 s for a model's first shape, ~70 s when a
second shape makes dynamo recompile with dynamic shapes), `train` ~1.5 min.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import gc
import glob
import importlib.util
import json
import math
import multiprocessing
import os
import platform
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)   # spawned workers import cuda_ext, eval_harness and harness.worker from here
from plumbing.console import gpu_peak_mb  # noqa: E402  (after the path: run from anywhere)


@dataclass
class Config:
    command: str = "harness"         # what to benchmark: harness, rollout, train, attention or models
    out: str = "runs/bench"          # results are appended to OUT/bench.jsonl
    sections: str = "cold,warm,throughput,stability"  # comma-separated subset of the harness sections to run
    cold_candidates: int = 5         # (a) different CUDA candidates, each built cold with fast and with plain
    parallel_builds: int = 5         # (a) builds of one kind running at once (1 = strictly one after another)
    cold_stream: str = ""            # (a) the elementwise candidates launch on PyTorch's current stream: "c10" (the
    #                                  one-shot example's <c10/cuda/CUDAStream.h>) or "aten"; "": the legacy stream
    throughput_backends: str = "cuda,triton"  # (c) which backends (one command each fits the GPU machine's 10 min)
    cuda_candidates: int = 32        # (c) CUDA candidates through the Evaluator
    triton_candidates: int = 32      # (c) Triton candidates through the Evaluator
    baseline_cuda: int = 3           # (c) CUDA candidates also evaluated sequentially with plain load_inline (~50 s each)
    baseline_triton: int = 8         # (c) Triton candidates also evaluated sequentially
    timing_budget_s: float = 0.5     # (c) the harness's timing budget per candidate (its default is 2.0)
    gpu_workers: int = 8             # (c) candidates sharing the GPU for correctness checks (Evaluator's gpu_workers)
    stability_runs: int = 5          # (d) separate evaluate() runs of one >= 100 us candidate
    round_tasks: int = 16            # (e) tasks of the round-shaped batch (golden solutions' tasks)
    round_backend: str = "triton"    # (e) the candidates' language: triton or cuda (every CUDA candidate is a cold
    #                                  build: its source carries the run's tag)
    round_samples: int = 8           # (e) candidates per task (5 correct, 1 wrong, 1 not compiling, 1 raising)
    round_answers: str = ""          # (e) eval JSONs (kernelzero.py eval, bench.py models), comma-separated: a
    #                                  model's failing answers to a task replace its synthetic wrong and failing
    #                                  candidates (a real mix of errors), where the files have some
    round_baseline: str = ""         # (e) a directory holding an older eval_harness.py (and the harness/ package or
    #                                  the older top-level files it has, and cuda_ext/) to run on
    #                                  the same batch in the same call; "" : the current harness with host inputs
    #                                  and the fixed timing budget stands in for it; "none": no baseline run
    round_baseline_first: bool = False  # (e) run the baseline before the variants (run a round both ways to see
    #                                  whether going first or second costs a harness time)
    round_timing: str = ""           # (e) options of the new harness, "key=value,..."; several variants, each run
    #                                  on the same batch and compared with the first and the baseline, separated by
    #                                  ";" (e.g. "inputs_on_device=false;timing_budget_s=0.25;timing_adaptive=true")
    round_warm: int = 0              # (e) candidates each Evaluator verifies (tagged apart: no cache hit) before the
    #                                  timed batch, as in a loop's later rounds (its pools booted while the trainer
    #                                  generated); 0: a cold Evaluator, whose start counts in the wall time
    round_profile: str = ""          # (e) a directory: every worker job of each run under cProfile
    #                                  (KZ_WORKER_PROFILE), merged and printed per run: where a verdict's time goes
    kb_dir: str = ""                 # (g) an official KernelBench checkout (its KernelBench/levelN/ or levelN/)
    kb_level: int = 1                # (g) which level
    kb_tasks: int = 20               # (g) its first N tasks (sorted by number; 0 = all)
    kb_samples: int = 4              # (g) candidates per task (kb_candidates: fallback, wrong, raising, fallback)
    kb_runs: str = "private,server,private,server"  # (g) the harness runs, in order: "private" (each candidate's
    #                                  worker makes the trials: reference_server=False) or "server"
    processes_children: int = 32     # (f) children forked (each: CUDA context, one tiny op, exit) per concurrency
    processes_at_once: str = "1,4,8,16"  # (f) children alive at once, comma-separated
    processes_syncing: str = "1,2,4,8"   # (f) processes launching + synchronizing at once, comma-separated
    processes_sync_reps: int = 2000  # (f) launch + sync round trips per process; median
    processes_env: str = ""          # (f) environment variants to run it all under, ";"-separated, each
    #                                  "KEY=VALUE,..." ("" : as is), e.g. ";CUDA_DEVICE_MAX_CONNECTIONS=1"
    seed: int = 0                    # which candidate variants are generated
    # rollout and train: models are any kernelzero model name (the named offline models "qwen-coder-0.5b",
    # "qwen-coder-1.5b", "smollm2"; "tiny"; an HF id or path) or a random shape: "qwen1.5b-shape" (Qwen2.5-Coder-1.5B,
    # with Qwen's tokenizer when qwen-coder-0.5b is installed, else SmolLM2's) and, for the CPU tests, "qwen-tiny-shape"
    rollout_models: str = "qwen-coder-0.5b,qwen1.5b-shape"  # rollout: the policies whose rollouts are timed
    rollout_batches: str = "1,64,256"  # rollout: prompts per generate call (one call per rollout)
    rollout_new_tokens: int = 512    # rollout: tokens every completion gets (EOS is masked until then, in both paths)
    rollout_reps: int = 1            # rollout: timed rollouts per batch after the first (compiling) one; median
    rollout_attention: str = "sdpa_gqa"  # rollout: the sampler's attention per timed rollout, comma-separated
    #                                  plumbing.models.ATTENTIONS (sdpa_gqa, sdpa = transformers' stock); with
    #                                  sdpa among them, an "attention" record per other one holds the ratio
    baseline_new_tokens: int = 32    # rollout: plain generate runs this many steps (~100 ms each), extrapolated
    phase_prompts: int = 128         # rollout: prompts of one Coder phase (16 modules x 8): compile amortised over it
    greedy_batch: int = 4            # rollout: prompts of the greedy identity check (0: no check), which runs the
    #                                  first of rollout_attention
    greedy_new_tokens: int = 32      # rollout: tokens of the greedy identity check
    greedy_update_lr: float = 1e-3   # rollout: AdamW lr of the update between the two checks (must change the output)
    rollout_profile: bool = False    # rollout: profile a few compiled decode steps and print the top CUDA kernels and
    #                                  GPU-busy share (kernel time / wall time per step: launch-bound or kernel-bound?)
    profile_steps: int = 16          # rollout: decode steps under the profiler (after 8 unprofiled ones), per batch
    train_models: str = "qwen-coder-0.5b,qwen1.5b-shape"  # train: the policies whose CA-GRPO update is timed
    train_seqs: int = 64             # train: sequences per update (one generation batch)
    train_seq_len: int = 1024        # train: tokens per sequence, prompt included
    train_prompt_len: int = 256      # train: of which prompt (not trained on); the rest is completion
    train_micro_batch: int = 0       # train: sequences per forward/backward; 0 = the trainer's default
    train_grad_ckpt: str = "off,on"  # train: gradient checkpointing settings to time, comma-separated
    train_lora: str = "0"            # train: kernelzero's lora_rank settings to time, comma-separated (0 = all weights)
    train_logprob_chunk: str = "0"   # train: kernelzero's logprob_chunk settings to time (0 = whole logits at once),
    #                                  comma-separated; each runs with each grad_ckpt setting
    train_steps: int = 3             # train: timed updates after one warm-up update; median
    matmul_size: int = 8192          # train: side of the bf16 torch.matmul that measures the matrix rate (GPU)
    attention_models: str = "smollm2,qwen1.5b-shape"  # attention: decode-step shapes (ATTENTION_SHAPES)
    attention_batches: str = "64,256"  # attention: sequences per decode step, comma-separated
    attention_cache: int = 2048      # attention: static cache slots (the rollout bench: prompt bucket 1536 + 512)
    attention_filled: int = 1792     # attention: slots holding tokens (the rest masked, as mid-way through decoding)
    attention_variants: str = "sdpa_gqa,sdpa_gqa_compiled,flex_compiled"  # attention: what
    #                                  is timed, comma-separated (see the docstring)
    attention_reps: int = 30         # attention: timed replays (GPU) or calls (CPU); median
    models: str = "qwen-coder-0.5b"  # models: the model names measured (any kernelzero model name), comma-separated
    models_backend: str = "triton"   # models: the kernel language the Coder writes
    models_temperatures: str = "1.0,0.7,0"  # models: sampling temperatures of the held-out eval (0 = greedy, 1 sample)
    models_levels: str = "1,2"       # models: held-out kernelbench_tasks levels
    models_samples: int = 8          # models: kernels per task when sampling (pass@k for k <= it)
    models_max_tasks: int = 0        # models: only the first N tasks per level (0 = all; the CPU test uses 1)
    models_proposals: int = 64       # models: Proposer modules generated and validated (uniform API sets)


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


# cuda_elementwise's launch: its include and the launch's stream argument. "": the legacy default stream; "aten" and
# "c10": PyTorch's current stream, as ATen (a common pattern) or c10 (what the one-shot example teaches) spell it
STREAMS = {"": ("", ""), "aten": ("#include <ATen/cuda/CUDAContext.h>\n", ", 0, at::cuda::getCurrentCUDAStream()"),
           "c10": ("#include <c10/cuda/CUDAStream.h>\n", ", 0, c10::cuda::getCurrentCUDAStream()")}


def cuda_elementwise(op: str, tag: str, label: str, threads: int, grid_stride: bool, cuda_flags: list,
                     stream: str = "") -> dict:
    """load_inline pieces of an elementwise CUDA candidate; `label` says how it is broken ("ok": not). `stream`: the
    stream it launches on, a key of STREAMS."""
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
    if stream not in STREAMS:
        raise ValueError(f"stream must be one of {list(STREAMS)}, not {stream!r}")
    include, on_stream = STREAMS[stream]
    launch = f"<<<{blocks}, {threads}{on_stream}>>>"
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
                                                 stream="aten" if j % 3 == 1 else ""))
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
                                           i % 2 == 0, ["-O3", "--use_fast_math"][: i % 3], stream=cfg.cold_stream))
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
        record(cfg, "cold", {"pch_build_s": pch_s, "parallel_builds": cfg.parallel_builds, "stream": cfg.cold_stream,
                             "median_plain_s": med["plain"], "median_fast_s": med["fast"],
                             "ratio": med["fast"] / med["plain"], "builds": results})
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
        with eval_harness.Evaluator(backend=backend, timing_budget_s=cfg.timing_budget_s,
                                    gpu_workers=cfg.gpu_workers) as ev:
            results = ev.map([(r, c) for r, c, _ in pairs])
        harness_s = time.perf_counter() - t0
        got = [coarse(r.error_kind) for r in results]
        agree = sum(g == label for g, (_, _, label) in zip(got, pairs))
        kinds = [r.error_kind for r in results]
        # seconds per stage inside the phases (ref_inputs_s, trials_s, coverage_s, timing_s, gpu_wait_s, ...)
        stages = [{k: v for k, v in r.details.items() if k.endswith("_s") and isinstance(v, (int, float))}
                  for r in results]
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
                            "compile_s": [r.compile_s for r in results],
                            "phase_s": [r.details.get("phase_s") for r in results],
                            "gpu_wait_s": [r.details.get("gpu_wait_s") for r in results],
                            "stage_s": stages}
        # where a verdict's time goes (summed over candidates; the GPU ones overlap up to gpu_workers at a time):
        # the phases, then the stages inside them and the wait for the GPU turn
        spent = collections.Counter()
        for r, stage in zip(results, stages):
            spent.update(r.details.get("phase_s", {}))
            spent.update(stage)
        print(f"{backend}: seconds summed over candidates: " + ", ".join(f"{k} {v:.1f}" for k, v in spent.items()))
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


# ---------------------------------------------------------------------------------------------------------------------
# (e) a round-shaped batch: 16 tasks x 8 samples of Triton candidates, new harness against an older one

ROUND_TASKS = [("level1", n) for n in ("001_Relu", "002_Gelu", "003_Silu", "004_Tanh", "005_Sigmoid", "006_LeakyRelu",
                                       "007_Softplus", "008_SumDim", "009_MaxDim", "010_Softmax", "011_LogSoftmax",
                                       "012_LayerNorm", "013_RMSNorm", "014_SquareMatmul", "015_CumSum")] + \
    [("level2", n) for n in ("003_AddMulTanh", "005_SiluMulSum", "004_ResidualRMSNorm")]

_KZ_SCALE = '''

@triton.jit
def _kz_scale(p, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(p + offs, tl.load(p + offs, mask=mask) * 1.01 + 0.01, mask=mask)
'''   # (Triton candidates' wrong and failing variants launch it after the real forward)


def model_failures(paths: str) -> dict[str, list[tuple[str, str]]]:
    """{task name: [(answer, recorded verdict)]} of the answers that were not correct, from eval JSONs (every sample's
    answer where the file has them, else each task's first one). Answers without a code block (format) are kept:
    they are part of a real round's mix, and cost the harness nothing."""
    failures = collections.defaultdict(list)
    for path in filter(None, paths.split(",")):
        with open(path) as f:
            tasks = json.load(f)["tasks"]
        for name, t in tasks.items():
            answers, kinds = t.get("answers") or [t["first_answer"]], t.get("sample_kind") or [t["first_kind"]]
            failures[name] += [(a, k) for a, k in zip(answers, kinds) if k != "ok"]
    return dict(failures)


def _tag_kernel(src: str, tag: str) -> str:
    """The tag as a string statement opening the first @triton.jit function's body (Triton's cache key is the
    function's source from `def`) and as a comment before the first __global__ of a CUDA source, which is a string
    (the build cache's key is the sources): no run and no candidate is served another's compiled kernel, and the
    harness's deduplication, which ignores comments but not strings, sees every candidate as a program of its own."""
    src = re.sub(r"(@triton\.jit\n(?:.*\n)*?.*\):\n)", rf'\1    "kz-bench {tag}"\n', src, count=1)
    return src.replace("__global__", f"// kz-bench {tag}\n__global__", 1)


# a candidate's forward, then `body` on its output (its wrong and failing variants)
_ROUND_WRAP = '''

_kz_forward = ModelNew.forward


def _kz_{kind}(self, *args):
    out = _kz_forward(self, *args)
    {body}
    return out


ModelNew.forward = _kz_{kind}
'''


def round_candidates(tag: str, tasks: int, samples: int, failures: dict | None = None,
                     backend: str = "triton") -> list[tuple[str, str, str]]:
    """(ref_src, cand_src, label) for `tasks` x `samples` candidates in `backend`: per task, samples 0-4 are the golden
    solution (correct; each with its own tag in the kernel source, so no compile cache ever serves one), 5 changes
    the output after the real kernel (Triton: a kernel scales it; CUDA: one element set: a mismatch), 6 is cut off
    mid-file (a syntax error: an answer that hit the token limit), 7 fails at run time (Triton: a kernel launched
    with a null pointer; CUDA: an exception after the kernel). Labels: ok / wrong / fail. `failures`
    (model_failures): samples 5-7 of a task that has any are a model's failing answers instead, labelled by their
    recorded verdict."""
    from eval_harness import extract_code
    root = os.path.join(HERE, "kernelbench_tasks")
    out = []
    for level, name in ROUND_TASKS[:tasks]:
        with open(os.path.join(root, level, name + ".py")) as f:
            ref = f.read()
        with open(os.path.join(root, "solutions", level, f"{name}_{backend}.py")) as f:
            gold = f.read()
        real, used = (failures or {}).get(name, []), 0
        for i in range(samples):
            src = _tag_kernel(gold, f"{tag}-{name}-{i}")
            kind = ["ok"] * 5 + ["wrong", "fail", "raise"]
            k = kind[i % len(kind)]
            if k != "ok" and real:   # a model's answer, as the trainer hands it over (None: no code block)
                answer, verdict = real[used % len(real)]
                used += 1
                code = extract_code(answer)
                out.append((ref, code and _tag_kernel(code, f"{tag}-{name}-{i}"), coarse(verdict)))
                continue
            if k == "wrong" and backend == "triton":
                src += _KZ_SCALE + _ROUND_WRAP.format(kind="wrong", body="_kz_scale[(triton.cdiv(out.numel(), "
                                                                        "1024),)](out, out.numel(), BLOCK=1024)")
            elif k == "raise" and backend == "triton":
                src += _KZ_SCALE + _ROUND_WRAP.format(kind="raise", body="_kz_scale[(1,)](None, 1, BLOCK=1024)")
            elif k == "wrong":   # (an element set by indexing: glue, not a PyTorch fallback)
                src += _ROUND_WRAP.format(kind="wrong", body="out[(0,) * out.dim()] = 0.5")
            elif k == "raise":
                src += _ROUND_WRAP.format(kind="raise", body="raise RuntimeError('kz-bench: fails at run time')")
            elif k == "fail":
                src = src[: int(len(src) * 0.8)]
            out.append((ref, src, {"raise": "fail"}.get(k, k)))
    return out


def _harness_module(directory: str):
    """eval_harness from `directory`, under its own module name, with the directory's harness/processes.py where it
    has one (a harness split into a package): the baseline's pools, GPU gate and time limits are its own. Its workers
    boot from `directory` (BOOT puts it first on their sys.path), so the worker side (harness/worker.py, which imports
    eval_harness) comes from there too; the parent side never imports the worker side, so nothing of this checkout's
    worker mixes in. (A baseline's parent-side `from harness import static_checks` gets this checkout's: the rules a
    source is rejected by, not the timing path. An older harness of flat top-level files finds them in `directory`,
    which is first on sys.path while it loads: none of their names is one of this checkout's modules.)"""
    import importlib.util

    def load(name: str, path: str):
        spec = importlib.util.spec_from_file_location(name + "_baseline", os.path.join(directory, path))
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    ours = sys.modules.get("harness.processes")
    sys.path.insert(0, directory)
    try:
        if os.path.exists(os.path.join(directory, "harness", "processes.py")):
            # the baseline's `from harness.processes import` binds the directory's, then this checkout's is put back
            sys.modules["harness.processes"] = load("harness.processes", os.path.join("harness", "processes.py"))
        return load("eval_harness", "eval_harness.py")
    finally:
        sys.path.remove(directory)
        if ours is not None:
            sys.modules["harness.processes"] = ours
        else:
            sys.modules.pop("harness.processes", None)


def _peak_rss_gb() -> float:
    """Peak resident memory of this process and its (waited-for) children, GB."""
    import resource
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) / 2**20


def _round_opts(text: str) -> dict:
    """Evaluator options from "key=value,...": true/false/none, numbers, else strings (gpu_workers=16 too)."""
    words = {"true": True, "false": False, "none": None}
    return {k: words[v.lower()] if v.lower() in words else int(v) if v.isdigit() else float(v) if "." in v else v
            for k, v in (kv.split("=") for kv in text.split(",") if kv)}


def _round_agreement(a: dict, b: dict) -> dict:
    """How far run b's verdicts and speedups are from run a's (per candidate)."""
    ratios = sorted(y / x for x, y in zip(a["speedups"], b["speedups"]) if x and y)
    return {"same_verdicts": sum(x == y for x, y in zip(a["kinds"], b["kinds"])), "timed": len(ratios),
            "speedup_ratio_median": ratios[len(ratios) // 2] if ratios else None,
            "speedup_ratio_min": ratios[0] if ratios else None, "speedup_ratio_max": ratios[-1] if ratios else None,
            "within_5pct": sum(abs(r - 1) <= 0.05 for r in ratios), "wall_ratio": a["wall_s"] / b["wall_s"]}


def print_profile(directory: str, name: str, top: int = 30) -> None:
    """The workers' cProfile files of one run merged: the functions with the most own time and their callers, then
    the harness's own functions (and imports) by the time below them (waits for the GPU turn: gpu_turn,
    pass_turn)."""
    import pstats
    files = sorted(glob.glob(os.path.join(directory, "*.prof")))
    if not files:
        print(f"{name}: no worker profiles in {directory}")
        return
    merged = os.path.join(directory, "merged.pstats")   # (kept: pstats.Stats(merged).print_callers(...) later)
    pstats.Stats(*files).dump_stats(merged)
    stats = pstats.Stats(merged, stream=sys.stdout)   # (one file name in the headers, not one per job)
    print(f"\n{name}: {len(files)} worker jobs profiled, merged into {merged}")
    stats.sort_stats("tottime").print_stats(top)
    stats.print_callers(12)   # who calls the top ones (a C builtin's own time is often a host sync or an import)
    stats.sort_stats("cumulative").print_stats(r"harness/\w+\.py|eval_harness\.py|_bootstrap>.*_find_and_load\b",
                                               top)


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) clock ticks of all the host's cores since boot (Linux /proc/stat: user nice system idle iowait
    irq softirq steal; idle and iowait are not busy)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def sample_host_cpu(samples: list, stop: threading.Event, period_s: float = 1.0) -> None:
    """Append the host's busy fraction (0..1, all cores) over each `period_s` to `samples` until `stop` is set: whether
    a harness run is bound by the machine's cores (a fraction near 1 throughout) or waits on something else."""
    last = _cpu_jiffies()
    while not stop.wait(period_s):
        now = _cpu_jiffies()
        samples.append((now[0] - last[0]) / max(now[1] - last[1], 1))
        last = now


def sample_gpu_busy(samples: list, stop: threading.Event, period_s: float = 0.5, smi: str = "nvidia-smi") -> None:
    """Append GPU 0's busy fraction (0..1: the share of the last period in which any kernel of any process ran, as
    nvidia-smi's utilization.gpu reports it) every `period_s` to `samples` until `stop` is set: whether a harness run
    is bound by the GPU itself or by waits around it. Nothing without nvidia-smi. GPU 0 is torch's first visible
    device, named to nvidia-smi by its UUID (CUDA_VISIBLE_DEVICES may reorder the machine's indices)."""
    import shutil
    import subprocess
    if not shutil.which(smi):
        return
    gpu = "0"
    if torch.cuda.is_available():
        uuid = str(torch.cuda.get_device_properties(0).uuid)
        gpu = uuid if uuid.startswith("GPU-") else "GPU-" + uuid
    proc = subprocess.Popen([smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                             f"--loop-ms={round(period_s * 1000)}", "-i", gpu],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # stopped from outside: killing it ends the loop below at once, even if nvidia-smi itself hangs
    threading.Thread(target=lambda: (stop.wait(), proc.kill()), daemon=True).start()
    for line in proc.stdout:
        with contextlib.suppress(ValueError):   # ("[N/A]" on GPUs that do not report it)
            samples.append(float(line.strip()) / 100)
    proc.wait()


def busy_summary(samples: list, what: str) -> dict:
    """Mean busy fraction and the share of periods above 90% busy (None without samples), as {what}_busy_mean and
    {what}_busy_over_90pct."""
    if not samples:
        return {f"{what}_busy_mean": None, f"{what}_busy_over_90pct": None}
    return {f"{what}_busy_mean": round(sum(samples) / len(samples), 3),
            f"{what}_busy_over_90pct": round(sum(x > 0.9 for x in samples) / len(samples), 3)}


def slot_occupancy(details: list[dict], slots: int, seconds: float) -> float | None:
    """The share of the GPU slots' time (slots x seconds of `map`) that the candidates held them: each one's phases
    plus its waits for the GPU and for memory (run_job's details), summed. Near 1: the wall time follows the time a
    candidate holds a slot, so only cutting that helps; well below: slots sat idle (boot, dispatch, the tail).
    E.g. phases 0.5 + 0.3 s and a 0.2 s wait, twice, in 2 slots over 1.25 s: 2.0 / 2.5 = 0.8."""
    if not details or slots < 1 or seconds <= 0:
        return None
    held = sum(sum((d.get("phase_s") or {}).values()) + (d.get("gpu_wait_s") or 0) + (d.get("mem_wait_s") or 0)
               for d in details)
    return round(held / (slots * seconds), 3)


def gate_closed_s(ev) -> float | None:
    """Seconds the Evaluator's GPU gates have let no new correctness check in (a timer waiting or timing:
    harness.processes.Gate.closed_s), summed over its GPUs; None before its pools start, or for an older harness
    whose gates do not count them. Over map's seconds: the share of the round that fair timing closes the GPU."""
    gates = list((getattr(ev, "gates", None) or {}).values())
    if not gates or not all(hasattr(gate, "closed_s") for gate in gates):
        return None
    return sum(gate.closed_s for gate in gates)


def stretches(longest: list) -> str:
    """The candidates' longest stretches holding the shared GPU turn, by what they were doing: how many, median and
    largest seconds (a timer waits for the slowest holder's stretch; "timing" is the one before a turn alone)."""
    by = collections.defaultdict(list)
    for seconds, phase in longest:
        if seconds is not None:
            by[phase].append(seconds)
    return "longest shared stretches " + (", ".join(
        f"{phase} {len(xs)} x median {statistics.median(xs):.3f} max {max(xs):.3f} s" for phase, xs in sorted(by.items()))
        or "not reported")


def spent_seconds(results: list) -> collections.Counter:
    """Seconds summed over a run's candidates, by phase (details["phase_s"]) and by every other *_s detail."""
    spent = collections.Counter()
    for r in results:
        spent.update(r.details.get("phase_s", {}))
        spent.update({k: v for k, v in r.details.items() if k.endswith("_s") and isinstance(v, (int, float))})
    return spent


def bench_round(cfg: Config, tag: str) -> None:
    """The round-shaped batch through each --round-timing variant of the current harness (first, so that their
    numbers stand if a call is cut short), then through the baseline; each variant's verdicts and speedups are
    compared with the first variant's as soon as it ends, and with the baseline's at the end."""
    import eval_harness
    failures = model_failures(cfg.round_answers)
    pairs = round_candidates(f"{tag}-round", cfg.round_tasks, cfg.round_samples, failures, cfg.round_backend)
    runs = {variant or "new": (eval_harness, _round_opts(variant)) for variant in cfg.round_timing.split(";")}
    if cfg.round_baseline == "none":   # (the variants alone, e.g. to profile them)
        pass
    elif cfg.round_baseline:
        runs["baseline"] = (_harness_module(cfg.round_baseline), {})
    else:
        runs["baseline"] = (eval_harness, {"inputs_on_device": False,   # (host inputs: the old harness)
                                           **eval_harness.FIXED_TIMING})
    if cfg.round_baseline_first and "baseline" in runs:
        runs = {"baseline": runs.pop("baseline"), **runs}
    summary, rows = {"n": len(pairs), "labels": [p[2] for p in pairs]}, []
    for run, (name, (module, opts)) in enumerate(runs.items()):
        # the same candidates, tagged anew per run: no run gets the Triton cache's kernels of the one before it
        pairs = round_candidates(f"{tag}-round{run}", cfg.round_tasks, cfg.round_samples, failures,
                                 cfg.round_backend)
        if cfg.round_profile:   # (workers inherit the environment the Evaluator starts with)
            os.environ["KZ_WORKER_PROFILE"] = os.path.join(cfg.round_profile, f"run{run}")
            os.makedirs(os.environ["KZ_WORKER_PROFILE"], exist_ok=True)
        cpu, gpu, stop = [], [], threading.Event()   # the host's and the GPU's busy fractions during the run
        samplers = [threading.Thread(target=sample_host_cpu, args=(cpu, stop), daemon=True),
                    threading.Thread(target=sample_gpu_busy, args=(gpu, stop), daemon=True)]
        for sampler in samplers:
            sampler.start()
        t0 = time.perf_counter()
        with module.Evaluator(backend=cfg.round_backend, progress=False,
                              **{"gpu_workers": cfg.gpu_workers, **opts}) as ev:
            warm_s = 0.0
            if cfg.round_warm:   # a round before this one: other candidates (their own tags), not timed
                warm = round_candidates(f"{tag}-warm{run}", cfg.round_tasks, cfg.round_samples, failures,
                                        cfg.round_backend)[:cfg.round_warm]
                ev.map([(r, c) for r, c, _ in warm])
                warm_s = time.perf_counter() - t0
                t0 = time.perf_counter()   # the Evaluator's start and the warm-up are not this round's time
            t1 = time.perf_counter()   # (a cold Evaluator boots its workers from here on, in the background)
            closed0 = gate_closed_s(ev) or 0.0   # (None: a cold Evaluator's gates do not exist yet)
            results = ev.map([(r, c) for r, c, _ in pairs])
            map_s = time.perf_counter() - t1
            closed = gate_closed_s(ev)
        wall = time.perf_counter() - t0
        stop.set()
        for sampler in samplers:
            sampler.join()
        spent = spent_seconds(results)
        summary[name] = {"wall_s": wall, "map_s": map_s, "warm_s": warm_s, "warm": cfg.round_warm, "opts": opts,
                         "kinds": [r.error_kind for r in results],
                         "speedups": [r.speedup for r in results], "runtime_ms": [r.runtime_ms for r in results],
                         "ref_ms": [r.ref_runtime_ms for r in results], "reps": [r.details.get("reps") for r in results],
                         "trials_on": collections.Counter(r.details.get("trials_on") for r in results),
                         "timing_method": collections.Counter(r.details.get("timing_method") for r in results),
                         "spent_s": dict(spent), "peak_rss_gb": _peak_rss_gb(), **busy_summary(cpu, "cpu"),
                         **busy_summary(gpu, "gpu"),
                         "gpu_turns": sum(r.details.get("gpu_turns") or 0 for r in results),
                         "gpu_peak_mb": [gpu_peak_mb(r.details) for r in results],   # measured, and the estimate
                         "mem_need_mb": [(r.details.get("mem_need_mb") or [None, None])[1] for r in results],
                         # what a waiting timer waits for: each candidate's longest stretch holding the shared turn
                         "longest_shared": [[r.details.get("longest_shared_s"), r.details.get("longest_shared_phase")]
                                            for r in results],
                         "exclusive_wait_s": [r.details.get("exclusive_wait_s") for r in results],
                         "reruns_alone": sum(bool(r.details.get("rerun_alone")) for r in results),   # (out of memory)
                         "slot_occupancy": slot_occupancy([r.details for r in results],
                                                          opts.get("gpu_workers", cfg.gpu_workers), map_s),
                         "gate_closed_frac": None if closed is None else round((closed - closed0) / map_s, 3)}
        agree = sum(coarse(r.error_kind) == label for r, (_, _, label) in zip(results, pairs))
        first = next(iter(runs))
        if name != first:
            summary[name]["vs_first"] = _round_agreement(summary[first], summary[name])
        rows.append([name, wall, f"{agree}/{len(pairs)}", sum(r.error_kind == "ok" for r in results)])
        print(f"{name}: {wall:.1f} s for {len(pairs)} candidates (map {map_s:.1f} s; {agree}/{len(pairs)} as labelled, "
              f"{rows[-1][-1]} ok, peak RSS {summary[name]['peak_rss_gb']:.1f} GB, host CPU busy "
              f"{summary[name]['cpu_busy_mean']} on average, over 90% in {summary[name]['cpu_busy_over_90pct']} "
              f"of its seconds; GPU busy {summary[name]['gpu_busy_mean']}, over 90% in "
              f"{summary[name]['gpu_busy_over_90pct']} of its half-seconds; GPU slots held "
              f"{summary[name]['slot_occupancy']} of map's time; GPU closed to new checks (a timer waiting or "
              f"timing) {summary[name]['gate_closed_frac']} of it; largest GPU peak of a candidate "
              f"{max(filter(None, summary[name]['gpu_peak_mb']), default=0) / 1024:.1f} GiB, admitted for "
              f"{max(filter(None, summary[name]['mem_need_mb']), default=0) / 1024:.1f}); "
              "seconds summed over candidates: "
              + ", ".join(f"{k} {v:.1f}" for k, v in spent.items())
              + f"; {stretches(summary[name]['longest_shared'])}"
              + (f"; against {first}: {summary[name]['vs_first']}" if name != first else ""), flush=True)
        record(cfg, f"round_{name}", summary[name])
        if cfg.round_profile:
            os.environ.pop("KZ_WORKER_PROFILE")
            print_profile(os.path.join(cfg.round_profile, f"run{run}"), name)
        for i, ((_, _, label), r) in enumerate(zip(pairs, results)):
            if coarse(r.error_kind) != label:
                print(f"{name} #{i} ({ROUND_TASKS[i // cfg.round_samples][1]}): labelled {label}, "
                      f"harness says {r.error_kind}: {r.error[:200]!r}")
    header = ["harness", "seconds", "coarse=label", "ok"]
    if "baseline" in summary:   # every run against it: verdicts equal, speedup ratio (run / baseline), wall ratio
        header += ["verdicts = baseline", "speedup / baseline (median)", "within 5%", "faster"]
        for row in rows:
            c = _round_agreement(summary["baseline"], summary[row[0]])
            row += [f"{c['same_verdicts']}/{len(pairs)}",
                    c["speedup_ratio_median"] and round(c["speedup_ratio_median"], 3),
                    f"{c['within_5pct']}/{c['timed']}", round(c["wall_ratio"], 2)]
            summary[row[0]]["vs_baseline"] = c
    table(f"(e) a round-shaped batch: {cfg.round_tasks} tasks x {cfg.round_samples} {cfg.round_backend} candidates"
          + (", each run against the baseline" if "baseline" in summary else ""), header, rows)
    record(cfg, "round", summary)


# ---------------------------------------------------------------------------------------------------------------------
# (f) processes: the cost of one fresh CUDA process per candidate, and of processes sharing a GPU

def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def process_lifecycles(device: str, children: int, at_once: int, results) -> None:
    """Run in a spawned process that imported torch and never touched CUDA, as the harness's zygote: fork `children`
    children, at most `at_once` alive; each creates its context, runs one tiny op, synchronizes and exits. Puts
    (wall s, children that failed) on `results`."""
    start, alive, failed = time.perf_counter(), set(), 0

    def reap() -> None:
        nonlocal failed
        pid, status = os.wait()
        alive.discard(pid)
        failed += os.waitstatus_to_exitcode(status) != 0

    for _ in range(children):
        if len(alive) >= at_once:
            reap()
        pid = os.fork()
        if pid == 0:   # the child: os._exit in any case, so it never returns into the parent's code
            code = 1
            try:
                torch.ones(1, device=device).add_(1)
                _sync(device)
                code = 0
            finally:
                os._exit(code)
        alive.add(pid)
    while alive:
        reap()
    results.put((time.perf_counter() - start, failed))


def sync_latency(device: str, reps: int, ready, go, results) -> None:
    """One process: a tiny kernel then a host sync, `reps` times once `go` is set; puts the median ms of one."""
    x = torch.zeros(1024, device=device)
    _sync(device)
    ready.put(True)
    go.wait()
    ms = []
    for _ in range(reps):
        t = time.perf_counter()
        x.add_(1)
        _sync(device)
        ms.append((time.perf_counter() - t) * 1e3)
    results.put(statistics.median(ms))


@contextlib.contextmanager
def environment(variant: str):
    """os.environ with a variant's "KEY=VALUE,KEY=VALUE" set (spawned processes inherit it), restored after."""
    pairs = [item.split("=", 1) for item in variant.split(",") if item]
    saved = {key: os.environ.get(key) for key, _ in pairs}
    os.environ.update(dict(pairs))
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def bench_processes(cfg: Config, device: str = "cuda") -> None:
    ctx = multiprocessing.get_context("spawn")   # (fresh interpreters: this process may hold a CUDA context)
    for variant in cfg.processes_env.split(";"):
        env = variant or "as is"
        rows = []
        for at_once in (int(x) for x in cfg.processes_at_once.split(",")):
            results = ctx.Queue()
            proc = ctx.Process(target=process_lifecycles, args=(device, cfg.processes_children, at_once, results))
            with environment(variant):
                proc.start()
            wall, failed = results.get()
            proc.join()
            res = dict(device=device, env=env, children=cfg.processes_children, at_once=at_once, wall_s=wall,
                       ms_per_child=wall / cfg.processes_children * 1e3, failed=failed)
            record(cfg, "processes_lifecycle", res)
            rows.append([at_once, wall, res["ms_per_child"], failed])
        table(f"(f) {cfg.processes_children} forked children, each a context, one tiny op and exit (environment: "
              f"{env})", ["at once", "s", "ms per child", "failed"], rows)
        rows = []
        for n in (int(x) for x in cfg.processes_syncing.split(",")):
            ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
            procs = [ctx.Process(target=sync_latency, args=(device, cfg.processes_sync_reps, ready, go, results))
                     for _ in range(n)]
            with environment(variant):
                for proc in procs:
                    proc.start()
            for _ in procs:   # every process past its imports and context before any starts
                ready.get()
            go.set()
            ms = sorted(results.get() for _ in procs)
            for proc in procs:
                proc.join()
            record(cfg, "processes_sync", dict(device=device, env=env, processes=n, reps=cfg.processes_sync_reps,
                                               median_ms=ms[len(ms) // 2], per_process_ms=ms))
            rows.append([n, ms[len(ms) // 2]])
        table(f"(f) processes launching a tiny kernel and synchronizing at once (environment: {env})",
              ["processes", "ms per launch + sync"], rows)


# ---------------------------------------------------------------------------------------------------------------------
# (g) official KernelBench: each candidate's own trials against a reference server per task

KB_COPY = """
import triton
import triton.language as tl


@triton.jit
def _kz_copy(src, dst, n, add, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask) + add, mask=mask)


class ModelNew(Model):
    def forward(self, *args):
        out = super().forward(*args)   # (the reference's own ops: a PyTorch fallback, once it is found correct)
        {raise_line}
        y = torch.empty_like(out).contiguous()
        _kz_copy[(triton.cdiv(out.numel(), 1024),)](out.contiguous(), y, out.numel(), {add}, BLOCK=1024)
        return y
"""


# Official level-1 tasks that one of our Triton solutions (kernelbench_tasks/solutions/level1) computes exactly,
# at any shape: elementwise ops. Their copies in (g) are correct kernels, so those candidates are also timed.
KB_GOLDEN = {"19_ReLU": "001_Relu", "21_Sigmoid": "005_Sigmoid", "22_Tanh": "004_Tanh", "25_Swish": "003_Silu"}


def kb_golden(name: str, level: int) -> str | None:
    """Our Triton solution of an official task (KB_GOLDEN), or None."""
    ours = KB_GOLDEN.get(name) if level == 1 else None
    if ours is None:
        return None
    with open(os.path.join(HERE, "kernelbench_tasks", "solutions", "level1", f"{ours}_triton.py")) as f:
        return f.read()


def kb_candidates(ref_src: str, samples: int, tag: str, golden: str | None = None) -> list[tuple[str, str]]:
    """`samples` candidates for one official task, made from its reference (bench (g)): (source, label) for a
    correct-then-fallback copy, an off-by-one copy, one raising in forward, then our solution of the task where
    there is one (`golden`, correct: it is timed), then more fallback copies (each with its own constant: no two are
    the same program, so none is a duplicate)."""
    kinds = [("fallback", 0, ""), ("wrong", 1, ""), ("runtime", 0, "raise RuntimeError('kz: raises')")]
    out = []
    for i in range(samples):
        if i == len(kinds) and golden:   # (the tag in its kernel's first line: a new program to Triton's cache)
            out.append((golden.replace("pid = tl.program_id(0)", f"pid = tl.program_id(0)  # {tag}", 1), "ok"))
            continue
        label, add, raise_line = kinds[i] if i < len(kinds) else ("fallback", 0, "")
        src = ref_src + KB_COPY.format(add=add, raise_line=raise_line or "pass") + f"\n_KZ_TAG = '{tag}-{i}'\n"
        out.append((src, label))
    return out


def bench_kernelbench(cfg: Config, tag: str) -> None:
    import eval_harness
    from plumbing.evaluation import load_tasks
    if not cfg.kb_dir:
        sys.exit("bench.py harness --sections kernelbench needs --kb-dir (an official KernelBench checkout)")
    tasks = load_tasks(cfg.kb_level, cfg.kb_dir, cfg.kb_tasks)
    summary, rows = {"tasks": [name for name, _ in tasks], "samples": cfg.kb_samples}, []
    for run, kind in enumerate(cfg.kb_runs.split(",")):
        cands = [(src, c) for name, src in tasks
                 for c in kb_candidates(src, cfg.kb_samples, f"{tag}-{run}", kb_golden(name, cfg.kb_level))]
        gpu, stop = [], threading.Event()
        sampler = threading.Thread(target=sample_gpu_busy, args=(gpu, stop), daemon=True)
        sampler.start()
        t0 = time.perf_counter()
        with eval_harness.Evaluator(backend="triton", progress=False, gpu_workers=cfg.gpu_workers,
                                    reference_server=kind == "server") as ev:
            results = ev.map([(ref, src) for ref, (src, _) in cands])
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        spent = spent_seconds(results)
        name = f"{kind}{run}"
        summary[name] = {"wall_s": wall, "kinds": [r.error_kind for r in results],
                         "checks": [r.details.get("check") for r in results], "spent_s": dict(spent),
                         "served": sum(bool(r.details.get("reference_server")) for r in results),
                         "rerun_private": sum(bool(r.details.get("rerun_private")) for r in results),
                         # run after the rest, task by task: their memory fitted only with fewer servers beside them
                         "ran_deferred": sum(bool(r.details.get("ran_deferred")) for r in results),
                         # why a task's candidates went without its server (its reference failed, it died, ...)
                         "no_server": dict(collections.Counter(r.details["no_server"] for r in results
                                                               if r.details.get("no_server"))),
                         # each candidate's measured GPU peak against what memory admission granted it
                         "gpu_peak_mb": [gpu_peak_mb(r.details) for r in results],
                         "mem_need_mb": [(r.details.get("mem_need_mb") or [None, None])[1] for r in results],
                         "speedups": [r.speedup for r in results], **busy_summary(gpu, "gpu")}
        expected = [{"fallback": "reward_hack", "wrong": "mismatch"}.get(label, label) for _, (_, label) in cands]
        # a verdict other than its candidate's label, with why (an out-of-memory, a server that could not serve ...)
        summary[name]["unexpected"] = {i: f"{r.error_kind}: {r.error[:300]}" for i, (r, kind)
                                       in enumerate(zip(results, expected)) if r.error_kind != kind}
        as_labelled = len(cands) - len(summary[name]["unexpected"])
        rows.append([name, round(wall, 1), round(len(cands) / wall * 60, 1), f"{as_labelled}/{len(cands)}"])
        ratios = [peak / need for peak, need in zip(summary[name]["gpu_peak_mb"], summary[name]["mem_need_mb"])
                  if peak and need]
        print(f"{name}: {wall:.1f} s for {len(cands)} candidates of {len(tasks)} official level-{cfg.kb_level} tasks; "
              f"{as_labelled} as labelled; GPU peak / admitted: median "
              f"{statistics.median(ratios) if ratios else float('nan'):.2f}, max {max(ratios, default=float('nan')):.2f}; "
              "seconds summed over candidates: " + ", ".join(f"{k} {v:.1f}" for k, v in spent.most_common(8)),
              flush=True)
        record(cfg, f"kernelbench_{name}", summary[name])
    names = [row[0] for row in rows]
    for row in rows:   # each run against the first private one: the same verdicts, and the wall-time ratio
        base = next((n for n in names if n.startswith("private")), names[0])
        same = sum(a == b for a, b in zip(zip(summary[base]["kinds"], summary[base]["checks"]),
                                          zip(summary[row[0]]["kinds"], summary[row[0]]["checks"])))
        row += [f"{same}/{len(summary[base]['kinds'])}", round(summary[base]["wall_s"] / summary[row[0]]["wall_s"], 2)]
    table(f"(g) official KernelBench level {cfg.kb_level}: {len(tasks)} tasks x {cfg.kb_samples} candidates",
          ["run", "seconds", "candidates/min", "as labelled", "verdicts = first private", "faster than it"], rows)
    record(cfg, "kernelbench", summary)


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
    if "round" in sections:
        bench_round(cfg, tag)
    if "processes" in sections:
        bench_processes(cfg)
    if "kernelbench" in sections:
        bench_kernelbench(cfg, tag)
    print(f"\nbench.py harness: {time.perf_counter() - t0:.0f} s; results appended to {cfg.out}/bench.jsonl")


# ---------------------------------------------------------------------------------------------------------------------
# rollout and train benchmarks: the trainer's own code paths (kernelzero.rollout, kernelzero.policy_update)

SHAPES = {  # random Qwen2 models built from a config (no download): the paper's Coder size, and a CPU-sized twin
    "qwen1.5b-shape": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                           intermediate_size=8960, vocab_size=151936, tokenizer="real"),  # Qwen2.5-Coder-1.5B
    "qwen-tiny-shape": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            intermediate_size=128, vocab_size=0, tokenizer="bytes"),
}


def clocked(device, fn, *args):
    """(fn(*args), seconds, peak GB allocated during the call or None on a CPU). GPU work is asynchronous: the device
    is synchronised before both readings of the clock."""
    gpu = device.type == "cuda"
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    out = fn(*args)
    if gpu:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return out, seconds, torch.cuda.max_memory_allocated() / 2**30 if gpu else None


def free_memory(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch._dynamo.reset()   # drops compiled decode steps and their CUDA graph memory with the model
        torch.cuda.empty_cache()


def trainer_config(device):
    """The trainer's Config: its defaults on a GPU, the tiny preset (short prompts, no static cache) on a CPU."""
    import kernelzero as kz
    return kz.Config(**kz.PRESETS["tiny" if device.type == "cpu" else "default"])


def bench_policy(name: str, kcfg, device):
    """A kernelzero Policy (fp32 model + AdamW + bf16 sampler on a GPU). make_policy loads models by name only, so a
    random Qwen2 shape is built here and wrapped the way make_policy wraps a loaded model."""
    import kernelzero as kz
    from plumbing import models
    from plumbing.policy import wrap_policy
    if name not in SHAPES:
        return kz.make_policy(name, kcfg, kcfg.lr, device)
    from transformers import Qwen2Config, Qwen2ForCausalLM
    shape = dict(SHAPES[name])
    tok = None
    if shape.pop("tokenizer") == "real":   # any tokenizer will do for random weights; a real one gives prompts a
        from transformers import AutoTokenizer   # realistic length (bytes: ~3x longer)
        named = [n for n in ("qwen-coder-0.5b", "smollm2") if models.model_problem(n) is None]
        tok = named and AutoTokenizer.from_pretrained(models.dense_copy(named[0]))
    tok = tok or models.build_byte_tokenizer()
    config = Qwen2Config(**{**shape, "vocab_size": max(shape["vocab_size"], len(tok))}, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1e6, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    with torch.device(device), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(kcfg.seed)
        model = Qwen2ForCausalLM(config)   # initialised in place on the GPU: seconds instead of a minute on the CPU
    return wrap_policy(*models.prepare(model, tok), kcfg, kcfg.lr, device)


def encode(tok, prompts: list, kcfg):
    """The prompts exactly as kernelzero.rollout tokenises them (chat template, left padding, bucketed length)."""
    import kernelzero as kz
    return tok([kz.chat(tok, p) for p in prompts], return_tensors="pt", padding=True, truncation=True,
               max_length=kcfg.max_prompt_tokens, pad_to_multiple_of=kcfg.prompt_bucket)


@contextlib.contextmanager
def forced_generate(model, **extra):
    """Inside the block model.generate decodes exactly max_new_tokens (EOS is masked until then, so every call does
    the same work). kernelzero.rollout stops at EOS; shadowing the sampler's generate is the smallest way to run
    that path otherwise unchanged. `extra`: more generate kwargs (the profiler's stopping criterion)."""
    plain = model.generate

    def generate(*args, **kwargs):
        kwargs["min_new_tokens"] = kwargs["max_new_tokens"]
        merged = dict(extra)
        if "stopping_criteria" in kwargs and "stopping_criteria" in extra:   # (rollout's own: its progress bar)
            from transformers import StoppingCriteriaList
            merged["stopping_criteria"] = StoppingCriteriaList([*kwargs.pop("stopping_criteria"),
                                                                *extra["stopping_criteria"]])
        return plain(*args, **kwargs, **merged)
    model.generate = generate   # an instance attribute shadows the method until the block ends
    try:
        yield
    finally:
        del model.generate


def time_plain(policy, prompts: list, kcfg, steps: int, device) -> dict:
    """Plain sampler.generate (dynamic cache, nothing compiled) with the rollout's sampling settings. A 1-token call
    is the prefill; (steps-token call - 1-token call) / (steps - 1) is one decode step."""
    import kernelzero as kz
    enc = encode(policy.tok, prompts, kcfg).to(device)
    kw = dict(input_ids=enc.input_ids, attention_mask=enc.attention_mask, do_sample=True, top_p=1.0, top_k=0,
              temperature=kcfg.temperature, eos_token_id=kz.stop_ids(policy.tok), pad_token_id=policy.tok.pad_token_id)

    def generate(n):
        return policy.sampler.generate(**kw, max_new_tokens=n, min_new_tokens=n)
    steps = max(steps, 2)
    # warm up with every decode shape: on the H200 a first call at new shapes ran up to 6x slower per step (seen
    # 176 vs 27 ms at batch 64), probably fresh device allocations as the dynamic cache grows
    clocked(device, generate, steps)
    prefill_s = clocked(device, generate, 1)[1]
    _, full_s, peak = clocked(device, generate, steps)
    # (a tiny model on a busy CPU can time the longer call faster than the prefill alone: no decode time, not less)
    decode_ms = max(0.0, (full_s - prefill_s) / (steps - 1) * 1e3)
    return dict(prompt_len=enc.input_ids.shape[1], prefill_s=prefill_s, decode_ms=decode_ms, peak_gb=peak)


def time_rollout(policy, prompts: list, kcfg, reps: int, device) -> dict:
    """kernelzero.rollout as the trainer calls it (static cache + compiled decode on a GPU, then the fp32 model's
    log-probs). The first call compiles; `reps` more are timed. gen_s is rollout's own clock (generate synchronises
    every step); total_s also holds the log-prob forward and decoding."""
    import kernelzero as kz

    def call():
        return kz.rollout(policy.model, policy.tok, prompts, kcfg, policy.sampler)
    with forced_generate(policy.sampler):
        first_s = clocked(device, call)[1]
        runs = [clocked(device, call) for _ in range(max(reps, 1))]
    total_s = statistics.median(seconds for _, seconds, _ in runs)
    gen_s = statistics.median(batch["timing"]["gen_s"] for batch, _, _ in runs)
    return dict(first_s=first_s, compile_s=max(first_s - total_s, 0.0), total_s=total_s, gen_s=gen_s,
                new_tokens=runs[-1][0]["timing"]["new_tokens"], peak_gb=runs[-1][2])


def profile_decode(policy, prompts: list, kcfg, steps: int, warm: int = 8, top: int = 12):
    """`steps` decode steps of kernelzero.rollout's own sampler path under torch.profiler (CPU + CUDA activities),
    after `warm` unprofiled ones: run it after a timed rollout of the same shape, so nothing compiles in it. A
    stopping criterion sees every step: it starts the profiler, then stops it and ends generate (the rest of the
    rollout, the log-prob pass, stays out). Device time is summed per kernel name (memcpy/memset included); kernel
    ms / wall ms per step is the GPU-busy share: well below 1, the step waits on the host (launches, syncs, Python).
    Returns (result dict, the profiler: its CPU events let the CPU test count the steps)."""
    import kernelzero as kz
    from transformers import StoppingCriteria, StoppingCriteriaList
    gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]
                                  + [torch.profiler.ProfilerActivity.CUDA] * gpu)
    clock = []

    class Window(StoppingCriteria):   # called once per generated token, the first right after the prefill
        def __init__(self):
            self.n = 0

        def __call__(self, input_ids, scores, **kwargs):
            self.n += 1
            if self.n in (warm, warm + steps):
                sync()   # the window holds exactly the GPU work queued between these two calls
                if self.n == warm:
                    prof.start()
                clock.append(time.perf_counter())
                if self.n == warm + steps:
                    prof.stop()
            return torch.full((input_ids.shape[0],), self.n >= warm + steps, dtype=torch.bool, device=input_ids.device)
    if kcfg.max_new_tokens <= warm + steps:
        raise SystemExit(f"profiling {steps} decode steps after {warm} needs more than {warm + steps} new tokens")
    with forced_generate(policy.sampler, stopping_criteria=StoppingCriteriaList([Window()])):
        kz.rollout(policy.model, policy.tok, prompts, kcfg, policy.sampler)
    kernels = collections.defaultdict(lambda: [0.0, 0])   # name: [ms per step, launches]
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            kernels[e.name][0] += e.time_range.elapsed_us() / 1e3 / steps
            kernels[e.name][1] += 1
    kernel_ms, wall_ms = sum(ms for ms, _ in kernels.values()), (clock[1] - clock[0]) / steps * 1e3
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(steps=steps, wall_ms_per_step=wall_ms, kernel_ms_per_step=kernel_ms, gpu_busy=kernel_ms / wall_ms,
                launches_per_step=sum(n for _, n in kernels.values()) / steps,
                top=[dict(name=k, ms_per_step=ms, share=ms / kernel_ms, calls_per_step=n / steps)
                     for k, (ms, n) in ranked]), prof


def greedy_check(policy, prompts: list, kcfg, cfg: Config, device) -> dict:
    """Greedy token ids of the rollout path against plain generate on the same sampler, before and after one
    policy_update (an AdamW step, then refresh_sampler copies the weights into the bf16 sampler in place)."""
    import kernelzero as kz
    kcfg = dataclasses.replace(kcfg, max_new_tokens=cfg.greedy_new_tokens, gen_batch_size=len(prompts),
                               temperature=0.0)   # the trainer's greedy decoding
    enc = encode(policy.tok, prompts, kcfg)
    T, P = kcfg.max_new_tokens, enc.input_ids.shape[1]

    def both():
        with forced_generate(policy.sampler):
            batch = kz.rollout(policy.model, policy.tok, prompts, kcfg, policy.sampler)
            plain = policy.sampler.generate(input_ids=enc.input_ids.to(device), max_new_tokens=T, do_sample=False,
                                            attention_mask=enc.attention_mask.to(device),
                                            eos_token_id=kz.stop_ids(policy.tok), pad_token_id=policy.tok.pad_token_id)
        assert torch.equal(batch["input_ids"][:, :P].cpu(), enc.input_ids), "the two paths saw different prompts"
        return batch, batch["input_ids"][:, P:].cpu(), plain[:, P:].cpu()
    batch, ours0, plain0 = both()
    advantages = torch.tensor([1.0, -1.0] * len(prompts))[:len(prompts)]   # any signal: the weights must move
    for group in policy.opt.param_groups:   # (a policy's learning rate is set where it is made: here, the check's)
        group["lr"] = cfg.greedy_update_lr
    kz.policy_update(policy, batch, advantages, kcfg)
    _, ours1, plain1 = both()
    return dict(match_before=torch.equal(ours0, plain0), match_after=torch.equal(ours1, plain1),
                agree_before=float((ours0 == plain0).float().mean()), agree_after=float((ours1 == plain1).float().mean()),
                weights_changed_output=not torch.equal(plain0, plain1),
                stale=torch.equal(ours1, plain0) and not torch.equal(plain0, plain1))   # old weights reproduced


def record_rollout(cfg: Config, name: str, B: int, T: int, plain: dict, ours: dict, attention: str) -> list:
    """One rollout record (ours against the plain baseline at batch B); returns its table row."""
    plain_gen_s = plain["prefill_s"] + (T - 1) * plain["decode_ms"] / 1e3   # one T-token call, extrapolated
    calls = math.ceil(cfg.phase_prompts / B)   # a Coder phase's generate calls; the compile happens once
    res = dict(model=name, batch=B, new_tokens=T, attention=attention, plain=plain, ours=ours,
               plain_steps=cfg.baseline_new_tokens, plain_ms_per_step=plain_gen_s / T * 1e3,
               ours_ms_per_step=ours["gen_s"] / T * 1e3, plain_tok_s=B * T / plain_gen_s,
               ours_tok_s=ours["new_tokens"] / ours["gen_s"],
               phase_speedup=calls * plain_gen_s / (ours["compile_s"] + calls * ours["gen_s"]))
    res["speedup"] = res["ours_tok_s"] / res["plain_tok_s"]
    record(cfg, "rollout", res)
    print(f"{name} batch {B} ({attention}): plain {res['plain_tok_s']:.0f} tok/s, ours {res['ours_tok_s']:.0f} tok/s "
          f"(compile {ours['compile_s']:.0f} s)", flush=True)
    return [name, B, attention, plain["prompt_len"], plain["decode_ms"], res["plain_ms_per_step"], res["plain_tok_s"],
            res["ours_ms_per_step"], res["ours_tok_s"], res["speedup"], ours["compile_s"], res["phase_speedup"],
            ours["total_s"] - ours["gen_s"], ours["peak_gb"] or "-"]


def bench_rollout(cfg: Config) -> None:
    import kernelzero as kz
    from plumbing import evaluation, models
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = [int(b) for b in cfg.rollout_batches.split(",")]
    attentions = cfg.rollout_attention.split(",")
    if not set(attentions) <= set(models.ATTENTIONS):
        raise SystemExit(f"--rollout-attention: a comma-separated subset of {sorted(models.ATTENTIONS)}, "
                         f"not {cfg.rollout_attention!r}")
    T, rows, greedy_rows, attention_rows = cfg.rollout_new_tokens, [], [], []
    tasks = evaluation.load_tasks(1)   # real Coder prompts: held-out level 1 modules, cycled
    if cfg.rollout_profile and device.type != "cuda":
        print("rollout profile: skipped (it profiles CUDA kernels; no GPU here)")
    for name in cfg.rollout_models.split(","):
        kcfg = trainer_config(device)
        try:
            policy = bench_policy(name, kcfg, device)
        except SystemExit as e:   # SmolLM2 not installed: time the other models
            print(f"{name}: skipped ({e})")
            continue
        prompts = [kz.coder_prompt(tasks[i % len(tasks)][1], kcfg.backend, kcfg.one_shot)
                   for i in range(max(batches + [cfg.greedy_batch]))]
        for B in batches:
            models.set_attention(policy.sampler, "sdpa")   # the baseline is plain transformers: stock "sdpa"
            plain = time_plain(policy, prompts[:B], kcfg, cfg.baseline_new_tokens, device)
            ms = {}
            for attention in attentions:   # switching the attention recompiles: the first call's compile_s has it
                models.set_attention(policy.sampler, attention)
                rcfg = dataclasses.replace(kcfg, max_new_tokens=T, gen_batch_size=B)
                ours = time_rollout(policy, prompts[:B], rcfg, cfg.rollout_reps, device)
                rows.append(record_rollout(cfg, name, B, T, plain, ours, attention))
                ms[attention] = ours["gen_s"] / T * 1e3
                if cfg.rollout_profile and device.type == "cuda":   # now, while this attention's compile is warm
                    prof = profile_decode(policy, prompts[:B], rcfg, cfg.profile_steps)[0]
                    record(cfg, "rollout_profile", dict(model=name, batch=B, attention=attention,
                                                        unprofiled_ms_per_step=ms[attention], **prof))
                    table(f"{name} batch {B} ({attention}): top CUDA kernels over {cfg.profile_steps} profiled decode "
                          f"steps: {prof['kernel_ms_per_step']:.2f} ms of kernels per "
                          f"{prof['wall_ms_per_step']:.2f} ms step (GPU busy {prof['gpu_busy']:.0%}; "
                          f"{prof['launches_per_step']:.0f} kernels per step; unprofiled {ms[attention]:.2f} ms/step, "
                          f"prefill included)",
                          ["kernel", "ms/step", "share", "calls/step"],
                          [[k["name"][:100], k["ms_per_step"], k["share"], k["calls_per_step"]] for k in prof["top"]])
            for attention in [a for a in ms if a != "sdpa" and "sdpa" in ms]:   # stock / ours: > 1, ours is faster
                record(cfg, "attention", dict(model=name, batch=B, new_tokens=T, attention=attention,
                                              sdpa_ms_per_step=ms["sdpa"], ms_per_step=ms[attention],
                                              ratio=ms["sdpa"] / ms[attention]))
                attention_rows.append([name, B, attention, ms["sdpa"], ms[attention], ms["sdpa"] / ms[attention]])
        models.set_attention(policy.sampler, attentions[0])   # the greedy check runs the first attention timed
        if cfg.greedy_batch:
            greedy = greedy_check(policy, prompts[:cfg.greedy_batch], kcfg, cfg, device)
            record(cfg, "greedy", dict(model=name, batch=cfg.greedy_batch, new_tokens=cfg.greedy_new_tokens, **greedy))
            greedy_rows.append([name, *greedy.values()])
        del policy
        free_memory(device)
    table(f"rollout on {device.type}: {T} new tokens per completion, EOS masked. ms/step = generate time / {T} "
          f"(prefill included; plain generate, stock sdpa, is timed over {cfg.baseline_new_tokens} steps and "
          f"extrapolated: decode ms = one step without the prefill). phase x = speedup over {cfg.phase_prompts} "
          f"prompts with the compile counted once; score s = the fp32 log-prob pass after generating",
          ["model", "batch", "attention", "prompt", "plain decode ms", "plain ms/step", "plain tok/s", "ours ms/step",
           "ours tok/s", "speedup", "compile s", "phase x", "score s", "peak GB"], rows)
    if attention_rows:
        table("the rollout's attention: transformers' sdpa (repeat_kv copies K/V) against kernelzero's, "
              "generate ms per step; ratio > 1: kernelzero's is faster",
              ["model", "batch", "attention", "sdpa ms/step", "its ms/step", "ratio"], attention_rows)
    table(f"greedy identity, rollout path vs plain generate ({cfg.greedy_batch} prompts x {cfg.greedy_new_tokens} "
          f"tokens), before and after one policy_update (lr {cfg.greedy_update_lr})",
          ["model", "equal before", "equal after", "agree before", "agree after", "update changed output",
           "stale weights"], greedy_rows)


def event_ms(fn) -> float:
    """Milliseconds of the GPU work fn() queues, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def matmul_tflops(n: int, device):
    """The bf16 matrix rate of this GPU: median of 20 timed n x n x n torch.matmul on random data (None on a CPU)."""
    if device.type != "cuda":
        return None
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    times = [event_ms(lambda: a @ b) for _ in range(25)]   # the first 5 are warm-ups
    return 2 * n**3 / (statistics.median(times[5:]) / 1e3) / 1e12


def copy_tb_s(device) -> float | None:
    """Device memory bandwidth in TB/s (bytes read + written) of a 1 GiB bf16 copy, median of 10 (None on a CPU)."""
    if device.type != "cuda":
        return None
    x = torch.randn(1 << 29, device=device, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    return 2 * x.numel() * 2 / statistics.median(event_ms(lambda: y.copy_(x)) for _ in range(10)) / 1e9


def train_batch(policy, kcfg, cfg: Config, device):
    """A generation batch as rollout returns it, of random tokens: every completion token counts in the mask, and the
    old log-probs come from the model itself (ratio 1 on the first update, as in the trainer)."""
    import kernelzero as kz
    N, L, T = cfg.train_seqs, cfg.train_seq_len, cfg.train_seq_len - cfg.train_prompt_len
    g = torch.Generator().manual_seed(cfg.seed)
    ids = torch.randint(0, policy.model.config.vocab_size, (N, L), generator=g).to(device)
    mask = torch.ones_like(ids)
    with torch.no_grad(), kz.autocast(device):
        old = torch.cat([kz.sequence_logprobs(policy.model, ids[i:i + kcfg.micro_batch], mask[i:i + kcfg.micro_batch],
                                              T, kcfg.temperature) for i in range(0, N, kcfg.micro_batch)])
    batch = dict(input_ids=ids, attention_mask=mask, completion_mask=torch.ones(N, T, device=device), old_logprobs=old)
    return batch, torch.randn(N, generator=g)


def bench_train(cfg: Config) -> None:
    import kernelzero as kz
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rate = matmul_tflops(cfg.matmul_size, device)
    record(cfg, "matmul", dict(size=cfg.matmul_size, tflops=rate))
    tokens, rows = cfg.train_seqs * cfg.train_seq_len, []
    for name, lora in [(n, int(r)) for n in cfg.train_models.split(",") for r in cfg.train_lora.split(",")]:
        kcfg = trainer_config(device)
        kcfg = dataclasses.replace(kcfg, micro_batch=cfg.train_micro_batch or kcfg.micro_batch, lora_rank=lora)
        try:
            policy = bench_policy(name, kcfg, device)
        except SystemExit as e:
            print(f"{name}: skipped ({e})")
            continue
        params = sum(p.numel() for p in policy.model.parameters())   # tied embeddings count once
        # the 6N rule: forward 2N + backward 4N per token; with LoRA the backward skips the frozen weights' gradients
        # (2N), and the adapters add under 1%
        flops_per_token = (4 if lora else 6) * params
        batch, advantages = train_batch(policy, kcfg, cfg, device)
        chunks = [int(k) for k in cfg.train_logprob_chunk.split(",")]
        for ckpt, chunk in [(c, k) for c in cfg.train_grad_ckpt.split(",") for k in chunks]:
            ucfg = dataclasses.replace(kcfg, logprob_chunk=chunk)
            if ckpt == "on":
                policy.model.gradient_checkpointing_enable()   # what make_policy does for gradient_checkpointing
            else:
                policy.model.gradient_checkpointing_disable()
            res = dict(model=name, lora_rank=lora, grad_ckpt=ckpt, logprob_chunk=chunk, micro_batch=kcfg.micro_batch,
                       seqs=cfg.train_seqs, seq_len=cfg.train_seq_len, prompt_len=cfg.train_prompt_len, params=params,
                       matmul_tflops=rate)
            free_memory(device)   # the allocator's cache from the previous setting would count as reserved here
            try:   # the first update allocates AdamW's state: a warm-up
                steps = [clocked(device, kz.policy_update, policy, batch, advantages, ucfg)[1:]
                         for _ in range(1 + cfg.train_steps)][1:]
            except torch.cuda.OutOfMemoryError as e:
                res["error"] = f"out of memory: {str(e)[:200]}"
            if "error" in res:   # outside the except block, so the failed step's tensors are released
                policy.opt.zero_grad(set_to_none=True)
                free_memory(device)
                rows.append([name, lora, ckpt, chunk, kcfg.micro_batch, params / 1e6, "OOM", "-", "-", "-", "-", "-"])
                record(cfg, "train", res)
                continue
            step_s = statistics.median(s for s, _ in steps)
            tflops = flops_per_token * tokens / step_s / 1e12
            res.update(step_s=step_s, step_times=[s for s, _ in steps], tokens_per_s=tokens / step_s, tflops=tflops,
                       frac_of_matmul=tflops / rate if rate else None, peak_gb=steps[-1][1],
                       reserved_gb=torch.cuda.max_memory_reserved() / 2**30 if device.type == "cuda" else None)
            record(cfg, "train", res)
            print(f"{name} lora {lora} grad ckpt {ckpt}, logprob chunk {chunk}: {step_s:.2f} s/update", flush=True)
            rows.append([name, lora, ckpt, chunk, kcfg.micro_batch, params / 1e6, step_s, res["tokens_per_s"], tflops,
                         res["frac_of_matmul"] or "-", res["peak_gb"] or "-", res["reserved_gb"] or "-"])
        del policy, batch
        free_memory(device)
    table(f"train on {device.type}: one kernelzero.policy_update on {cfg.train_seqs} x {cfg.train_seq_len} tokens "
          f"(prompt {cfg.train_prompt_len}), median of {cfg.train_steps} after a warm-up; TFLOP/s = 6 x params x "
          f"tokens / step (4 x with LoRA); bf16 matmul {rate and f'{rate:.0f}'} TFLOP/s",
          ["model", "lora", "grad ckpt", "logprob chunk", "micro", "params M", "step s", "tokens/s", "TFLOP/s", "of matmul",
           "peak GB", "reserved GB"], rows)


# ---------------------------------------------------------------------------------------------------------------------
# attention: one decode step's attention alone, per implementation

ATTENTION_SHAPES = {  # query heads, K/V heads, head dim, layers: the named models' configs, and the random shapes'
    "smollm2": (9, 3, 64, 30), "qwen-coder-0.5b": (14, 2, 64, 24), **{name: (s["num_attention_heads"], s["num_key_value_heads"],
                                        s["hidden_size"] // s["num_attention_heads"], s["num_hidden_layers"])
                                  for name, s in SHAPES.items()}}


def decode_attentions() -> dict:
    """name -> f(q (B, H, 1, D), k and v (B, Hkv, L, D), mask (B, 1, 1, L) bool) -> (B, 1, H, D)."""
    from torch.nn.attention.flex_attention import flex_attention

    from plumbing import models

    def sdpa_gqa(q, k, v, mask):
        return models.sdpa_gqa_attention(None, q, k, v, mask)[0]

    def flex(q, k, v, mask):
        keep = mask[:, 0, 0]
        return flex_attention(q, k, v, score_mod=lambda s, b, h, i, j: torch.where(keep[b, j], s, -float("inf")),
                              enable_gqa=True).transpose(1, 2)
    return {"sdpa_gqa": sdpa_gqa, "sdpa_gqa_compiled": torch.compile(sdpa_gqa, dynamic=False),
            "flex_compiled": torch.compile(flex, dynamic=False)}


def attention_step(f, qkv: list, mask) -> list:
    """One decode step's attention: f on every layer's (q, k, v), as the model's layers would call it in turn."""
    return [f(q, k, v, mask) for q, k, v in qkv]


def bench_attention(cfg: Config) -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gpu, dtype = device.type == "cuda", torch.bfloat16 if device.type == "cuda" else torch.float32
    variants, bandwidth = decode_attentions(), copy_tb_s(device)
    unknown = set(cfg.attention_variants.split(",")) - set(variants)
    if unknown:
        raise SystemExit(f"--attention-variants: {sorted(unknown)} unknown; choose from {sorted(variants)}")
    rows, L, filled = [], cfg.attention_cache, cfg.attention_filled
    for name in cfg.attention_models.split(","):
        H, Hkv, D, layers = ATTENTION_SHAPES[name]
        for B in [int(b) for b in cfg.attention_batches.split(",")]:
            gen = torch.Generator().manual_seed(cfg.seed)
            start = torch.randint(0, filled // 2, (B,), generator=gen)   # left padding
            slots = torch.arange(L)
            mask = ((slots >= start[:, None]) & (slots < filled))[:, None, None, :].to(device)   # (B, 1, 1, L)
            qkv = [[torch.randn(B, h, n, D, generator=gen).to(device, dtype) for h, n in ((H, 1), (Hkv, L), (Hkv, L))]
                   for _ in range(layers)]   # a fresh K/V per layer, as in a real step (no cache reuse)
            q64, k64, v64 = (t.double().cpu() for t in qkv[0])   # float64 reference for layer 0
            scores = (q64 @ k64.repeat_interleave(H // Hkv, 1).transpose(-1, -2)) / math.sqrt(D)
            ref = scores.masked_fill(~mask.cpu(), float("-inf")).softmax(-1) @ v64.repeat_interleave(H // Hkv, 1)
            ref = ref.transpose(1, 2)   # (B, 1, H, D)
            floor_ms = layers * 2 * B * Hkv * L * D * 2 / (bandwidth * 1e9) if bandwidth else None   # bf16 K and V
            for variant in cfg.attention_variants.split(","):
                f = variants[variant]
                err = float((f(*qkv[0], mask).double().cpu() - ref).norm() / ref.norm())
                step = functools.partial(attention_step, f, qkv, mask)
                for _ in range(3):   # compiles (once per variant and shape), then warm
                    step()
                if gpu:
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step()
                    times = [event_ms(graph.replay) for _ in range(cfg.attention_reps)]
                    del graph
                else:
                    times = [clocked(device, step)[1] * 1e3 for _ in range(cfg.attention_reps)]
                ms = statistics.median(times)
                record(cfg, "attention_step", dict(model=name, batch=B, cache=L, filled=filled, layers=layers,
                                                   variant=variant, ms_per_step=ms, min_ms=min(times),
                                                   max_ms=max(times), floor_ms=floor_ms, copy_tb_s=bandwidth,
                                                   rel_err=err))
                rows.append([name, B, variant, ms, floor_ms or "-", err])
                print(f"{name} batch {B} {variant}: {ms:.3f} ms per step", flush=True)
            del qkv
            free_memory(device)
    table(f"one decode step's attention on {device.type} ({L} cache slots, {filled} filled; all layers; "
          f"floor = reading K and V once at {bandwidth and f'{bandwidth:.2f}'} TB/s)",
          ["model", "batch", "variant", "ms/step", "floor ms", "rel err vs fp64"], rows)


# ---------------------------------------------------------------------------------------------------------------------
# models: what a named model can do before any training (load time, the Coder on the held-out levels, the Proposer)

def proposer_validity(policy, kcfg, ev, n: int, seed: int = 0) -> dict:
    """The Proposer's validity rate on n proposals (uniform API sets, the trainer's prompt and validation, an empty
    pool): the share of modules that pass kernelzero.validate_modules, the reasons for the rest, one example each."""
    import kernelzero as kz
    from eval_harness import extract_code
    from kernelbench_tasks import catalog
    rng = random.Random(seed)
    api_sets = [catalog.sample_api_set(rng, kcfg.apis_per_set, {}) for _ in range(n)]
    batch = kz.rollout(policy.model, policy.tok, [kz.proposer_prompt(catalog.render_api_set(a)) for a in api_sets],
                       kcfg, policy.sampler, desc="proposals")
    codes = [extract_code(c) for c in batch["completions"]]
    valid, _, why, examples, _ = kz.validate_modules(codes, api_sets, set(), ev)
    return dict(proposals=n, valid_frac=sum(valid) / n, invalid=dict(collections.Counter(w for w in why if w)),
                lint_examples=examples, first_answer=batch["completions"][0][:2000])


def bench_models(cfg: Config) -> None:
    """Per named model: load time (first: join + hash + dequantise when no dense copy exists; then cached), the Coder's
    pass@1/pass@k, error kinds, fast_1 on the held-out levels at each temperature (0 = greedy, one sample), and the
    Proposer's validity. Each eval is also written as OUT/eval_{model}_t{T}_level{L}.json in the format of
    `kernelzero.py eval`, so that `kernelzero.py compare` reads it."""
    import kernelzero as kz
    from eval_harness import Evaluator
    from plumbing import evaluation, models
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    harness_device = device.type
    rows = []
    for name in cfg.models.split(","):
        fresh = models.model_problem(name) is None and not os.path.exists(os.path.join(models.model_cache_dir(name),
                                                                                      "dense"))
        _, first_s, _ = clocked(torch.device("cpu"), models.load_model, name)
        _, cached_s, _ = clocked(torch.device("cpu"), models.load_model, name)
        record(cfg, "load", dict(model=name, first_s=first_s, first_was_fresh=fresh, cached_s=cached_s))
        rows.append([name, "load", f"first {first_s:.1f} s ({'dequantised' if fresh else 'cached'}), "
                     f"then {cached_s:.1f} s", "", "", ""])
        kcfg = dataclasses.replace(trainer_config(device), backend=cfg.models_backend, coder_model=name,
                                   proposer_model=name, eval_max_tasks=cfg.models_max_tasks)
        policy = kz.make_policy(name, kcfg, kcfg.lr, device)
        with Evaluator(backend=kcfg.backend, device=harness_device, progress=False) as ev:
            for t in (float(x) for x in cfg.models_temperatures.split(",")):
                tcfg = dataclasses.replace(kcfg, temperature=t, samples=1 if t == 0 else cfg.models_samples)
                for level in (int(x) for x in cfg.models_levels.split(",")):
                    torch.manual_seed(cfg.seed)
                    res, wall_s, _ = clocked(device, evaluation.evaluate_coder, policy, tcfg, ev, level, tcfg.samples,
                                             kz.coder_attempts, "", cfg.models_max_tasks)
                    path = os.path.join(cfg.out, f"eval_{name}_t{t:g}_level{level}.json")
                    with open(path, "w") as f:
                        json.dump({"config": dataclasses.asdict(tcfg), "model": name, "temperature": t, **res}, f)
                    summary = {k: v for k, v in res.items() if k != "tasks"}
                    record(cfg, "eval", dict(model=name, temperature=t, level=level, samples=tcfg.samples,
                                             tasks=len(res["tasks"]), wall_s=wall_s, **summary))
                    rows.append([name, f"T={t:g} level {level}", f"{res['pass@1']:.3f} "
                                 f"[{res['pass@1_ci'][0]:.3f}, {res['pass@1_ci'][1]:.3f}]",
                                 f"{res.get(f'pass@{tcfg.samples}', res['pass@1']):.3f}", f"{res['fast_1']:.3f}",
                                 json.dumps(res["errors"])])
            torch.manual_seed(cfg.seed)
            pv = proposer_validity(policy, kcfg, ev, cfg.models_proposals, cfg.seed)
            record(cfg, "proposer", dict(model=name, temperature=kcfg.temperature, **pv))
            rows.append([name, f"Proposer, {pv['proposals']} at T={kcfg.temperature:g}", f"valid {pv['valid_frac']:.2f}",
                         "", "", json.dumps(pv["invalid"])])
        del policy
        free_memory(device)
    table(f"models ({cfg.models_backend}; pass@k with k = samples; greedy = 1 sample)",
          ["model", "what", "pass@1 [95% CI] / result", "pass@k", "fast_1", "error kinds"], rows)


# ---------------------------------------------------------------------------------------------------------------------
# main

COMMANDS = {"harness": bench_harness, "rollout": bench_rollout, "train": bench_train, "attention": bench_attention,
            "models": bench_models}


def parse_args(argv=None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=sorted(COMMANDS))
    for f in dataclasses.fields(Config):
        if isinstance(f.default, bool):   # type=bool would read "--flag False" as True
            p.add_argument(f"--{f.name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=f.default)
        elif f.name != "command":
            p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    cfg = Config(**vars(p.parse_args(argv)))
    if cfg.cold_stream not in STREAMS:   # (at once, not after minutes of building the precompiled header)
        p.error(f"--cold-stream must be one of {', '.join(map(repr, STREAMS))}, not {cfg.cold_stream!r}")
    return cfg


def main(cfg: Config) -> None:
    print("config:", json.dumps(dataclasses.asdict(cfg)))
    COMMANDS[cfg.command](cfg)


if __name__ == "__main__":
    main(parse_args())
