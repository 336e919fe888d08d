"""Synthetic (module, kernel) pairs for KernelZero's SFT warm start.

What it is. A random generator of small KernelBench-format tasks (a `Model`, `get_inputs`, `get_init_inputs`) and,
for each, a matching candidate (`ModelNew`) in Triton or CUDA, written from templates. Every pair is checked by the
harness (eval_harness.Evaluator) before it is written, so the SFT corpus holds only kernels that pass. Two SFT
directions use the same pairs: the Coder learns module -> kernel, the Proposer learns API set -> module (`apis`
holds the catalog names of the operations a module uses, kernelbench_tasks/catalog.py).

Module families ("kind"), composed at random with random shapes (rank 1-3, small enough that the Triton interpreter
verifies a pair on the CPU in seconds):
    elementwise  a chain of 1-4 ops: unary activations, and binary ops with a second input of the same shape, a
                 row vector broadcast over the last dimension, or a scalar
    reduction    an elementwise chain (0-2 ops), then sum / mean / amax / amin over the last dimension
    softmax      softmax or log-softmax over the last dimension, with optional elementwise ops before and after
    norm         nn.LayerNorm (with or without affine) or nn.RMSNorm, with optional elementwise ops before and after
    gemm         x @ W^T + b (nn.Linear) or torch.addmm with W and b as inputs, then an activation (+ an optional op)
Every elementwise op has a torch spelling, a Triton expression and a CUDA expression (e.g. gelu ->
`0.5 * v * (1.0 + tl.math.erf(v * 0.7071067811865476))` / `0.5f * v * (1.0f + erff(v * 0.70710678118654752f))`).

How it departs from KernelZero.
    1. The paper warm-starts from an SFT model whose data is not public; this corpus is our own construction: template
       kernels for simple fusions, correct by construction and verified, not distilled from a stronger model.
    2. The kernels are deliberately plain (one kernel per module, one program / block per row for row ops, a
       textbook tiled GEMM): the SFT stage teaches the format and correctness, RL is left to find speed.
    3. No pair equals a held-out level1/level2 task: a module whose normalised AST (catalog.normalized_source_hash,
       numeric constants ignored) matches a task is re-drawn, and so is an exact duplicate of an earlier pair.
    4. CUDA kernels launch on PyTorch's current stream (c10::cuda::getCurrentCUDAStream()), as the one-shot example
       does: a launch on the legacy default stream cannot be captured in a CUDA graph, and the harness then times
       it eagerly, with the host's launch latency inside the timed window.

Run it (deterministic from --seed; failures are dropped and counted in DIR/stats.json):
    python -m kernelbench_tasks.synth --n 2000 --backend triton --out runs/synth_triton --seed 0    # CPU: interpreter
    python -m kernelbench_tasks.synth --n 2000 --backend cuda --out runs/synth_cuda --device cuda   # on the GPU node
    python -m kernelbench_tasks.synth --n 50 --backend cuda --out /tmp/s --no-verify                # sources only
Python: `pairs, stats = generate_pairs(n, "triton", seed=0)`; each pair is a dict with the JSONL fields
{"module", "solution", "apis", "backend", "seed", "kind"}.
"""
import argparse
import dataclasses
import glob
import json
import math
import os
import random
import re
import time
from dataclasses import dataclass

import torch
from tqdm import tqdm

from kernelbench_tasks import catalog

HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------------------------------------------------------------
# Elementwise op templates: (catalog API, torch call, Triton expression, CUDA expression). {x} is the torch operand,
# {v} the kernel's running fp32 value, {p} a sampled constant. Only ops that are finite for every real input and
# whose GPU formulas meet the fp32 tolerance (1e-4) are listed: no exp/log chains, no tl.sin (an approximation).

UNARY = {
    "relu": ("torch.nn.functional.relu", "F.relu({x})", "tl.maximum({v}, 0.0)", "fmaxf({v}, 0.0f)"),
    "gelu": ("torch.nn.functional.gelu", "F.gelu({x})", "0.5 * {v} * (1.0 + tl.math.erf({v} * 0.7071067811865476))",
             "0.5f * {v} * (1.0f + erff({v} * 0.70710678118654752f))"),
    "silu": ("torch.nn.functional.silu", "F.silu({x})", "{v} / (1.0 + tl.exp(-{v}))", "{v} / (1.0f + expf(-{v}))"),
    "sigmoid": ("torch.sigmoid", "torch.sigmoid({x})", "1.0 / (1.0 + tl.exp(-{v}))", "1.0f / (1.0f + expf(-{v}))"),
    # 2 / (1 + exp(-2v)) - 1: exp overflows to inf for v < -44 and the result is then -1, the right limit.
    "tanh": ("torch.tanh", "torch.tanh({x})", "2.0 / (1.0 + tl.exp(-2.0 * {v})) - 1.0", "tanhf({v})"),
    "abs": ("torch.abs", "torch.abs({x})", "tl.abs({v})", "fabsf({v})"),
    "square": ("torch.square", "torch.square({x})", "{v} * {v}", "{v} * {v}"),
    "leaky_relu": ("torch.nn.functional.leaky_relu", "F.leaky_relu({x}, negative_slope={p})",
                   "tl.where({v} > 0, {v}, {v} * {p})", "({v} > 0.0f ? {v} : {v} * {p}f)"),
    # log(1 + exp(v)) = max(v, 0) + log(1 + exp(-|v|)) never overflows; torch returns v itself above threshold 20.
    "softplus": ("torch.nn.functional.softplus", "F.softplus({x})",
                 "tl.where({v} > 20.0, {v}, tl.maximum({v}, 0.0) + tl.log(1.0 + tl.exp(-tl.abs({v}))))",
                 "({v} > 20.0f ? {v} : log1pf(expf({v})))"),
    "elu": ("torch.nn.functional.elu", "F.elu({x})", "tl.where({v} > 0, {v}, tl.exp({v}) - 1.0)",
            "({v} > 0.0f ? {v} : expm1f({v}))"),
    "hardtanh": ("torch.nn.functional.hardtanh", "F.hardtanh({x})", "tl.minimum(tl.maximum({v}, -1.0), 1.0)",
                 "fminf(fmaxf({v}, -1.0f), 1.0f)"),
    "relu6": ("torch.nn.functional.relu6", "F.relu6({x})", "tl.minimum(tl.maximum({v}, 0.0), 6.0)",
              "fminf(fmaxf({v}, 0.0f), 6.0f)"),
    "hardsigmoid": ("torch.nn.functional.hardsigmoid", "F.hardsigmoid({x})",
                    "tl.minimum(tl.maximum({v} + 3.0, 0.0), 6.0) / 6.0", "fminf(fmaxf({v} + 3.0f, 0.0f), 6.0f) / 6.0f"),
    "hardswish": ("torch.nn.functional.hardswish", "F.hardswish({x})",
                  "{v} * tl.minimum(tl.maximum({v} + 3.0, 0.0), 6.0) / 6.0",
                  "{v} * fminf(fmaxf({v} + 3.0f, 0.0f), 6.0f) / 6.0f"),
    "erf": ("torch.erf", "torch.erf({x})", "tl.math.erf({v})", "erff({v})"),
    "softsign": ("torch.nn.functional.softsign", "F.softsign({x})", "{v} / (1.0 + tl.abs({v}))",
                 "{v} / (1.0f + fabsf({v}))"),
    "logsigmoid": ("torch.nn.functional.logsigmoid", "F.logsigmoid({x})",
                   "tl.minimum({v}, 0.0) - tl.log(1.0 + tl.exp(-tl.abs({v})))",
                   "(fminf({v}, 0.0f) - log1pf(expf(-fabsf({v}))))"),
}

# Binary ops: {y} is the second operand (a loaded tensor value or a scalar literal).
BINARY = {
    "add": ("torch.add", "torch.add({x}, {y})", "{v} + {y}", "{v} + {y}"),
    "sub": ("torch.sub", "torch.sub({x}, {y})", "{v} - {y}", "{v} - {y}"),
    "mul": ("torch.mul", "torch.mul({x}, {y})", "{v} * {y}", "{v} * {y}"),
    "div": ("torch.div", "torch.div({x}, {y})", "{v} / {y}", "{v} / {y}"),
    "maximum": ("torch.maximum", "torch.maximum({x}, {y})", "tl.maximum({v}, {y})", "fmaxf({v}, {y})"),
    "minimum": ("torch.minimum", "torch.minimum({x}, {y})", "tl.minimum({v}, {y})", "fminf({v}, {y})"),
}
SCALAR_OPS = ("add", "sub", "mul", "div")       # torch.maximum/minimum take tensors only
SCALARS = (0.5, 2.0, -1.5, 0.25, 3.0, 1.5, -0.75)
SLOPES = (0.01, 0.05, 0.1, 0.2)
EXTRA_NAMES = ("y", "z", "u", "t")              # names of extra tensor inputs, in order of use

REDUCERS = {"sum": "torch.sum", "mean": "torch.mean", "amax": "torch.amax", "amin": "torch.amin"}
SOFTMAXES = {"softmax": "torch.nn.functional.softmax", "log_softmax": "torch.nn.functional.log_softmax"}
NORMS = {"layernorm": "torch.nn.LayerNorm", "layernorm_noaffine": "torch.nn.LayerNorm", "rmsnorm": "torch.nn.RMSNorm"}
KIND_WEIGHTS = {"elementwise": 0.3, "reduction": 0.2, "softmax": 0.15, "norm": 0.15, "gemm": 0.2}
ROW_DIMS = (32, 48, 64, 96, 100, 128, 160, 256, 384, 512, 640, 768, 1024)
MAX_ELEMENTS = 1 << 17   # per input: the interpreter verifies a pair in seconds on one core

# ---------------------------------------------------------------------------------------------------------------------
# Random specs: plain dicts, so a spec can be logged and re-rendered


def _sample_step(rng, rank, n_extra, allow_binary=True):
    """One elementwise op. Binary operands: a same-shape input, a row vector (rank >= 2) or a scalar."""
    if not allow_binary or n_extra >= len(EXTRA_NAMES) or rng.random() < 0.55:
        op = rng.choice(sorted(UNARY))
        return {"op": op, "p": rng.choice(SLOPES) if op == "leaky_relu" else None}
    operand = rng.choice(["tensor", "tensor", "row", "scalar"] if rank >= 2 else ["tensor", "scalar"])
    op = rng.choice(SCALAR_OPS if operand == "scalar" else sorted(BINARY))
    if operand == "scalar":
        return {"op": op, "operand": "scalar", "value": rng.choice(SCALARS)}
    return {"op": op, "operand": operand, "name": EXTRA_NAMES[n_extra]}


def _sample_chain(rng, rank, lo, hi, n_extra=0, allow_binary=True):
    chain = []
    for _ in range(rng.randint(lo, hi)):
        step = _sample_step(rng, rank, n_extra, allow_binary)
        n_extra += step.get("operand") in ("tensor", "row")
        chain.append(step)
    return chain


def _sample_shape(rng, rank):
    if rank == 1:
        return [rng.choice([1000, 4096, 10000, 32768, 65536, 100000])]
    dim = rng.choice(ROW_DIMS)
    if rank == 2:
        shape = [rng.choice([4, 8, 16, 32, 50, 64, 128, 256]), dim]
    else:
        shape = [rng.choice([2, 3, 4, 8]), rng.choice([8, 16, 24, 32, 64]), dim]
    while math.prod(shape) > MAX_ELEMENTS:
        shape[0] = max(1, shape[0] // 2)
    return shape


def sample_spec(rng):
    """A random module description: {"kind", "shape", "pre", "core", "post", ...}."""
    kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    if kind == "elementwise":
        rank = rng.choice([1, 2, 2, 3])
        return {"kind": kind, "shape": _sample_shape(rng, rank), "pre": _sample_chain(rng, rank, 1, 4), "core": None,
                "post": []}
    if kind == "gemm":
        rank = rng.choice([2, 2, 3])
        variant = "linear" if rank == 3 else rng.choice(["linear", "addmm"])
        lead = [rng.choice([16, 32, 64, 100, 128, 256])] if rank == 2 else [rng.choice([2, 4]), rng.choice([16, 32])]
        return {"kind": kind, "shape": lead + [rng.choice([32, 64, 96, 128, 256])],
                "out_features": rng.choice([32, 64, 128, 200, 256]), "pre": [],
                "core": {"op": variant, "act": _sample_step(rng, 2, 0, allow_binary=False)},
                "post": _sample_chain(rng, 2, 0, 1, allow_binary=False)}
    rank = rng.choice([2, 2, 3])
    pre = _sample_chain(rng, rank, 0, 2)
    post = _sample_chain(rng, rank, 0, 1, allow_binary=False)
    if kind == "reduction":
        core = {"op": rng.choice(sorted(REDUCERS)), "keepdim": rng.random() < 0.3}
    elif kind == "softmax":
        core = {"op": rng.choice(sorted(SOFTMAXES))}
    else:
        core = {"op": rng.choice(sorted(NORMS))}
    return {"kind": kind, "shape": _sample_shape(rng, rank), "pre": pre, "core": core, "post": post}


def spec_apis(spec):
    """Catalog names of every op the module uses, in order, without repeats."""
    names = [(UNARY if s["op"] in UNARY else BINARY)[s["op"]][0] for s in spec["pre"]]
    core = spec["core"]
    if spec["kind"] == "gemm":
        names += ["torch.nn.Linear" if core["op"] == "linear" else "torch.addmm", UNARY[core["act"]["op"]][0]]
    elif core:
        names.append({**REDUCERS, **SOFTMAXES, **NORMS}[core["op"]])
    names += [(UNARY if s["op"] in UNARY else BINARY)[s["op"]][0] for s in spec["post"]]
    return list(dict.fromkeys(names))


def _extras(spec):
    """Extra tensor inputs of the chains: [(name, "tensor" | "row", is_divisor)]."""
    return [(s["name"], s["operand"], s["op"] == "div") for s in spec["pre"] + spec["post"]
            if s.get("operand") in ("tensor", "row")]


# ---------------------------------------------------------------------------------------------------------------------
# Rendering the module (the task). Model and ModelNew share their constructor: the same parameters under one seed.

SIZE_NAMES = {1: ["dim"], 2: ["batch_size", "dim"], 3: ["batch_size", "seq_len", "dim"]}
NORM_MODULES = {"layernorm": "nn.LayerNorm(dim)", "layernorm_noaffine": "nn.LayerNorm(dim, elementwise_affine=False)",
                "rmsnorm": "nn.RMSNorm(dim, eps=1e-6)"}
NORM_PARAMS = {"layernorm": ["self.norm.weight", "self.norm.bias"], "rmsnorm": ["self.norm.weight"]}


def _op(spec):
    return (spec["core"] or {}).get("op")


def _constructor(spec):
    """(__init__ parameters, __init__ statement or None, get_init_inputs names)."""
    if _op(spec) == "linear":
        return (", in_features: int, out_features: int", "self.linear = nn.Linear(in_features, out_features)",
                ["in_features", "out_features"])
    if spec["kind"] == "norm":
        return ", dim: int", f"self.norm = {NORM_MODULES[_op(spec)]}", ["dim"]
    return "", None, []


def _inputs(spec):
    """forward()'s tensor arguments: x, torch.addmm's weight and bias, then the chains' extra inputs."""
    return ["x"] + (["weight", "bias"] if _op(spec) == "addmm" else []) + [name for name, _, _ in _extras(spec)]


def _class(name, spec, body):
    params, stmt, _ = _constructor(spec)
    args = ", ".join(f"{a}: torch.Tensor" for a in _inputs(spec))
    return [f"class {name}(nn.Module):", f"    def __init__(self{params}):", "        super().__init__()",
            *([f"        {stmt}"] if stmt else []), "", f"    def forward(self, {args}) -> torch.Tensor:", *body]


def _torch_step(step):
    if step["op"] in UNARY:
        return UNARY[step["op"]][1].format(x="x", p=step["p"])
    y = repr(step["value"]) if step["operand"] == "scalar" else step["name"]
    return BINARY[step["op"]][1].format(x="x", y=y)


def render_module(spec):
    kind, shape, core = spec["kind"], spec["shape"], spec["core"]
    names = SIZE_NAMES[len(shape)][:-1] + (["in_features"] if kind == "gemm" else ["dim"])
    sizes = [f"{n} = {s}" for n, s in zip(names, shape)]
    body = [_torch_step(s) for s in spec["pre"]]
    if kind == "gemm":
        sizes.append(f"out_features = {spec['out_features']}")
        body.append("self.linear(x)" if core["op"] == "linear" else "torch.addmm(bias, x, weight)")
        body.append(_torch_step(core["act"]))
    elif kind == "reduction":
        body.append(f"{REDUCERS[core['op']]}(x, dim=-1{', keepdim=True' if core['keepdim'] else ''})")
    elif kind == "softmax":
        body.append(f"F.{core['op']}(x, dim=-1)")
    elif kind == "norm":
        body.append("self.norm(x)")
    body += [_torch_step(s) for s in spec["post"]]
    gen = [f"torch.randn({', '.join(names)})"]
    if _op(spec) == "addmm":   # scaled like nn.Linear's init so that the activations do not saturate
        gen += ["torch.randn(in_features, out_features) / in_features ** 0.5", "torch.randn(out_features)"]
    for _, operand, divisor in _extras(spec):
        size = ", ".join(names) if operand == "tensor" else names[-1]
        gen.append(f"torch.rand({size}) + 0.5" if divisor else f"torch.randn({size})")   # divisors stay away from 0
    lines = [f'"""Synthetic {kind} task: {" -> ".join(spec_apis(spec))}."""', "import torch", "import torch.nn as nn",
             "import torch.nn.functional as F", "", *sizes, "", "",
             *_class("Model", spec, [f"        x = {b}" for b in body] + ["        return x"]), "", "",
             "def get_inputs():", f"    return [{', '.join(gen)}]", "", "",
             "def get_init_inputs():", f"    return [{', '.join(_constructor(spec)[2])}]", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Rendering the Triton solution: one @triton.jit kernel per module, fp32 math, masks for ragged edges


def _triton_steps(chain, load=None):
    """Kernel lines applying `chain` to `v`; load(name, operand) is the expression that loads an extra input."""
    out = []
    for s in chain:
        if s["op"] in UNARY:
            out.append(f"    v = {UNARY[s['op']][2].format(v='v', p=s['p'])}  # {UNARY[s['op']][0]}")
        else:
            y = repr(s["value"]) if s["operand"] == "scalar" else load(s["name"], s["operand"])
            out.append(f"    v = {BINARY[s['op']][2].format(v='v', y=y)}  # {BINARY[s['op']][0]}")
    return out


def render_triton(spec):
    render = {"elementwise": _triton_elementwise, "gemm": _triton_gemm}.get(spec["kind"], _triton_rows)
    kernel, forward = render(spec, _inputs(spec))
    contiguous = [f"        {a} = {a}.contiguous()" for a in _inputs(spec)]
    return "\n".join(["import torch", "import torch.nn as nn", "import triton", "import triton.language as tl", "",
                      "", "@triton.jit", *kernel, "", "", *_class("ModelNew", spec, contiguous + forward), ""])


def _triton_elementwise(spec, inputs):
    def load(a, operand):   # a row vector pairs element i of x with element i % dim
        return f"tl.load({a}_ptr + offs{' % dim' if operand == 'row' else ''}, mask=mask)"
    ptrs = "".join(a + "_ptr, " for a in inputs)
    kernel = [f"def fused_kernel({ptrs}out_ptr, n_elements, dim, BLOCK: tl.constexpr):",
              "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "    mask = offs < n_elements",
              "    v = tl.load(x_ptr + offs, mask=mask)", *_triton_steps(spec["pre"], load),
              "    tl.store(out_ptr + offs, v, mask=mask)"]
    forward = ["        out = torch.empty_like(x)", "        n = x.numel()",
               "        # Few large programs under the CPU interpreter (its cost grows with the program count).",
               "        BLOCK = 1024 if x.is_cuda else 16384",
               f"        fused_kernel[(triton.cdiv(n, BLOCK),)]({', '.join(inputs)}, out, n, x.shape[-1], BLOCK=BLOCK)",
               "        return out"]
    return kernel, forward


def _triton_rows(spec, inputs):
    """ROWS whole rows per program, as a (ROWS, BLOCK_N) tile in registers."""
    kind, op = spec["kind"], _op(spec)
    params = inputs + {"layernorm": ["w", "b"], "rmsnorm": ["w"]}.get(op, [])
    eps = ", eps" if kind == "norm" else ""

    def load(a, operand):   # padding lanes load 1.0: never a division by 0
        if operand == "row":
            return f"tl.load({a}_ptr + cols, mask=cols < n_cols, other=1.0)[None, :]"
        return f"tl.load({a}_ptr + offs, mask=mask, other=1.0)"
    kernel = [f"def fused_rows_kernel({''.join(p + '_ptr, ' for p in params)}out_ptr, n_rows, n_cols{eps},",
              "                      ROWS: tl.constexpr, BLOCK_N: tl.constexpr):",
              "    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)", "    cols = tl.arange(0, BLOCK_N)",
              "    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)",
              "    offs = rows[:, None] * n_cols + cols[None, :]",
              "    v = tl.load(x_ptr + offs, mask=mask, other=0.0)", *_triton_steps(spec["pre"], load)]
    vec = "tl.load({}_ptr + cols, mask=cols < n_cols, other=0.0)[None, :]"
    if kind == "reduction":
        # After the chain, padding lanes hold op(0), not 0: mask them with the reduction's identity.
        ident = {"sum": "0.0", "mean": "0.0", "amax": '-float("inf")', "amin": 'float("inf")'}[op]
        fn = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}[op]
        kernel.append(f"    v = {fn}(tl.where(mask, v, {ident}), axis=1){' / n_cols' if op == 'mean' else ''}"
                      f"  # {REDUCERS[op]}")
    elif kind == "softmax":
        kernel += ['    v = tl.where(mask, v, -float("inf"))', "    # Subtract the row max first: exp never overflows.",
                   "    v = v - tl.max(v, axis=1)[:, None]", "    e = tl.exp(v)",
                   "    v = e / tl.sum(e, axis=1)[:, None]" if op == "softmax"
                   else "    v = v - tl.log(tl.sum(e, axis=1))[:, None]"]
    elif op.startswith("layernorm"):
        kernel += ["    # Two-pass statistics: the mean, then the biased variance of v - mean.",
                   "    v = tl.where(mask, v, 0.0)", "    mean = tl.sum(v, axis=1) / n_cols",
                   "    d = tl.where(mask, v - mean[:, None], 0.0)", "    var = tl.sum(d * d, axis=1) / n_cols",
                   "    v = d / tl.sqrt(var + eps)[:, None]"]
        kernel += [f"    v = v * {vec.format('w')} + {vec.format('b')}"] if op == "layernorm" else []
    else:
        kernel += ["    v = tl.where(mask, v, 0.0)", "    ms = tl.sum(v * v, axis=1) / n_cols",
                   f"    v = v / tl.sqrt(ms + eps)[:, None] * {vec.format('w')}"]
    kernel += _triton_steps(spec["post"])
    if kind == "reduction":
        kernel.append("    tl.store(out_ptr + rows, v, mask=rows < n_rows)")
        shape = "x.shape[:-1] + (1,)" if spec["core"]["keepdim"] else "x.shape[:-1]"
        out = f"torch.empty({shape}, device=x.device, dtype=x.dtype)"
    else:
        kernel.append("    tl.store(out_ptr + offs, v, mask=mask)")
        out = "torch.empty_like(x)"
    call = inputs + NORM_PARAMS.get(op, []) + ["out", "n_rows", "n_cols"] + (["self.norm.eps"] if eps else [])
    forward = ["        n_cols = x.shape[-1]", "        n_rows = x.numel() // n_cols", f"        out = {out}",
               "        # One row per program on the GPU; 16 rows per program under the CPU interpreter.",
               "        ROWS = 1 if x.is_cuda else 16", "        fused_rows_kernel[(triton.cdiv(n_rows, ROWS),)](",
               f"            {', '.join(call)},", "            ROWS=ROWS, BLOCK_N=triton.next_power_of_2(n_cols))",
               "        return out"]
    return kernel, forward


def _triton_gemm(spec, inputs):
    """A tiled GEMM with the bias, the activation and the post ops in its epilogue (Triton tutorial 03)."""
    kernel = [
        "def gemm_epilogue_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_wk, stride_wn,",
        "                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):",
        "    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
        "    offs_k = tl.arange(0, BLOCK_K)", "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "    for k0 in range(0, K, BLOCK_K):",
        "        a = tl.load(x_ptr + offs_m[:, None] * K + (k0 + offs_k[None, :]),",
        "                    mask=(offs_m[:, None] < M) & (k0 + offs_k[None, :] < K), other=0.0)",
        "        w = tl.load(w_ptr + (k0 + offs_k[:, None]) * stride_wk + offs_n[None, :] * stride_wn,",
        "                    mask=(k0 + offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)",
        "        # ieee: the default TF32 would miss the fp32 tolerance (1e-4) on the GPU.",
        '        acc += tl.dot(a, w, input_precision="ieee")',
        "    v = acc + tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]",
        *_triton_steps([spec["core"]["act"]] + spec["post"]),
        "    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)",
        "    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], v, mask=mask)"]
    if _op(spec) == "linear":   # nn.Linear's weight is (N, K): W^T is read through its strides, no transposed copy
        forward = ["        w, b = self.linear.weight, self.linear.bias", "        N = w.shape[0]",
                   "        stride_wk, stride_wn = w.stride(1), w.stride(0)"]
    else:
        forward = ["        w, b = weight, bias", "        N = w.shape[1]",
                   "        stride_wk, stride_wn = w.stride(0), w.stride(1)"]
    forward += ["        M, K = x.numel() // x.shape[-1], x.shape[-1]",
                "        y = torch.empty((*x.shape[:-1], N), device=x.device, dtype=x.dtype)",
                "        # 64 x 64 x 32 tiles on the GPU; one big tile under the CPU interpreter.",
                "        if x.is_cuda:", "            BM, BN, BK = 64, 64, 32", "        else:",
                "            BM, BN, BK = (max(16, min(128, triton.next_power_of_2(s))) for s in (M, N, K))",
                "        grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))",
                "        gemm_epilogue_kernel[grid](x, w, b, y, M, N, K, stride_wk, stride_wn,",
                "                                   BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK)", "        return y"]
    return kernel, forward


# ---------------------------------------------------------------------------------------------------------------------
# Rendering the CUDA solution (load_inline; `#include <torch/extension.h>` first: the harness rewrites that line)

CUDA_REDUCE = {"sum": ("0.0f", "v += __shfl_xor_sync(0xffffffff, v, offset)"),
               "max": ("-INFINITY", "v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset))"),
               "min": ("INFINITY", "v = fminf(v, __shfl_xor_sync(0xffffffff, v, offset))")}


def _cuda_block_reduce(kind):
    """block_<kind>(v): warp shuffles, then one shared-memory step across warps; every thread gets the result."""
    ident, shuffle = CUDA_REDUCE[kind]
    return f"""__device__ float block_{kind}(float v) {{
    __shared__ float partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int offset = 16; offset > 0; offset >>= 1) {shuffle};
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = (lane < blockDim.x / 32) ? partial[lane] : {ident};
    for (int offset = 16; offset > 0; offset >>= 1) {shuffle};
    __syncthreads();  // partial[] is reused by the next call
    return v;
}}
"""


def _cuda_steps(chain, load=None, indent="    "):
    out = []
    for s in chain:
        if s["op"] in UNARY:
            out.append(f"{indent}v = {UNARY[s['op']][3].format(v='v', p=s['p'])};  // {UNARY[s['op']][0]}")
        else:
            y = f"{s['value']!r}f" if s["operand"] == "scalar" else load(s["name"], s["operand"])
            out.append(f"{indent}v = {BINARY[s['op']][3].format(v='v', y=y)};  // {BINARY[s['op']][0]}")
    return out


def render_cuda(spec, name):
    """A ModelNew whose forward calls one load_inline extension function, fused_forward(tensors..., [eps])."""
    render = {"elementwise": _cuda_elementwise, "gemm": _cuda_gemm}.get(spec["kind"], _cuda_rows)
    kernel, params, py_args, host = render(spec, _inputs(spec))
    sig = f"fused_forward({', '.join(params)})"
    tensors = [p.split()[-1] for p in params if p.startswith("torch::Tensor")]
    cuda = "\n".join([
        "#include <torch/extension.h>", "#include <c10/cuda/CUDAStream.h>", "", kernel, f"torch::Tensor {sig} {{",
        '    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");',
        *[f"    {t} = {t}.contiguous();" for t in tensors],
        # launched on PyTorch's current stream, as the one-shot example teaches: the harness can then time the
        # kernel as a CUDA graph replay (the legacy default stream cannot be captured: timed eagerly, noisier)
        "    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();   // PyTorch's current stream", *host,
        "    cudaError_t err = cudaGetLastError();",
        '    TORCH_CHECK(err == cudaSuccess, "kernel launch failed: ", cudaGetErrorString(err));', "    return out;",
        "}", ""])
    return "\n".join(["import torch", "import torch.nn as nn", "from torch.utils.cpp_extension import load_inline", "",
                      f'cuda_source = r"""\n{cuda}"""', f'cpp_source = "torch::Tensor {sig};"', "",
                      f'ext = load_inline(name="{name}", cpp_sources=cpp_source, cuda_sources=cuda_source,',
                      '                  functions=["fused_forward"], verbose=False)', "", "",
                      *_class("ModelNew", spec, [f"        return ext.fused_forward({', '.join(py_args)})"]), ""])


def _pointers(names):
    return "".join(f"const float* __restrict__ {a}, " for a in names)


def _cuda_elementwise(spec, inputs):
    """One thread per element."""
    steps = _cuda_steps(spec["pre"], lambda a, operand: f"{a}[i % dim]" if operand == "row" else f"{a}[i]")
    kernel = "\n".join([f"__global__ void fused_kernel({_pointers(inputs)}float* __restrict__ out, int64_t n, "
                        "int64_t dim) {", "    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;",
                        "    if (i >= n) return;", "    float v = x[i];", *steps, "    out[i] = v;", "}", ""])
    host = ["    auto out = torch::empty_like(x);", "    int64_t n = x.numel();",
            "    fused_kernel<<<(n + 255) / 256, 256, 0, stream>>>("
            f"{''.join(a + '.data_ptr<float>(), ' for a in inputs)}out.data_ptr<float>(), n, x.size(-1));"]
    return kernel, [f"torch::Tensor {a}" for a in inputs], inputs, host


def _cuda_rows(spec, inputs):
    """One block of 256 threads per row; the elementwise prelude is recomputed in each sweep (reads hit L1/L2)."""
    kind, op = spec["kind"], _op(spec)
    norm_params = {"layernorm": ["w", "b"], "rmsnorm": ["w"]}.get(op, [])
    pre = _cuda_steps(spec["pre"], lambda a, operand: f"{a}[c]" if operand == "row" else f"{a}[i]")
    if kind == "reduction":
        reducers = [{"sum": "sum", "mean": "sum", "amax": "max", "amin": "min"}[op]]
    else:
        reducers = ["max", "sum"] if kind == "softmax" else ["sum"]
    eps = ", float eps" if kind == "norm" else ""
    loop = "    for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x)"
    item = f"pre_ops({', '.join(inputs)}, base + c, c)"
    post = _cuda_steps(spec["post"], indent="        ")
    body = ["    int64_t base = (int64_t)blockIdx.x * n_cols;"]
    if kind == "reduction":
        red = reducers[0]
        update = {"sum": f"acc += {item}", "max": f"acc = fmaxf(acc, {item})", "min": f"acc = fminf(acc, {item})"}
        body += [f"    float acc = {CUDA_REDUCE[red][0]};", f"{loop} {update[red]};",
                 f"    float v = block_{red}(acc){' / n_cols' if op == 'mean' else ''};  // {REDUCERS[op]}",
                 "    if (threadIdx.x == 0) {", *post, "        out[blockIdx.x] = v;", "    }"]
    else:
        if kind == "softmax":   # subtract the row max first: expf never overflows
            body += ["    float m = -INFINITY;", f"{loop} m = fmaxf(m, {item});", "    m = block_max(m);",
                     "    float s = 0.0f;", f"{loop} s += expf({item} - m);", "    s = block_sum(s);"]
            value = f"expf({item} - m) / s" if op == "softmax" else f"({item} - m) - logf(s)"
        elif op.startswith("layernorm"):   # two-pass statistics: the mean, then the variance of v - mean
            body += ["    float s = 0.0f;", f"{loop} s += {item};", "    float mean = block_sum(s) / n_cols;",
                     "    float ss = 0.0f;", f"{loop} {{", f"        float d = {item} - mean;", "        ss += d * d;",
                     "    }", "    float rstd = 1.0f / sqrtf(block_sum(ss) / n_cols + eps);"]
            value = f"({item} - mean) * rstd" + (" * w[c] + b[c]" if op == "layernorm" else "")
        else:
            body += ["    float ss = 0.0f;", f"{loop} {{", f"        float h = {item};", "        ss += h * h;",
                     "    }",
                     "    float rms = sqrtf(block_sum(ss) / n_cols + eps);"]
            value = f"{item} / rms * w[c]"
        body += [f"{loop} {{", f"        float v = {value};", *post, "        out[base + c] = v;", "    }"]
    kernel = "\n".join([f"__device__ __forceinline__ float pre_ops({_pointers(inputs)}int64_t i, int64_t c) {{",
                        "    float v = x[i];", *pre, "    return v;", "}", "",
                        *[_cuda_block_reduce(r) for r in reducers],
                        f"__global__ void fused_rows_kernel({_pointers(inputs + norm_params)}float* __restrict__ out,"
                        f" int64_t n_cols{eps}) {{", *body, "}", ""])
    if kind == "reduction":
        out = ["    auto sizes = x.sizes().vec();", "    sizes.back() = 1;" if spec["core"]["keepdim"]
               else "    sizes.pop_back();", "    auto out = torch::empty(sizes, x.options());"]
    else:
        out = ["    auto out = torch::empty_like(x);"]
    ptrs = "".join(f"{a}.data_ptr<float>(), " for a in inputs + norm_params)
    host = out + ["    int64_t n_cols = x.size(-1);", "    int64_t n_rows = x.numel() / n_cols;",
                  f"    fused_rows_kernel<<<(unsigned)n_rows, 256, 0, stream>>>({ptrs}out.data_ptr<float>(), n_cols"
                  f"{', (float)eps' if eps else ''});"]
    params = [f"torch::Tensor {a}" for a in inputs + norm_params] + (["double eps"] if eps else [])
    return kernel, params, inputs + NORM_PARAMS.get(op, []) + (["self.norm.eps"] if eps else []), host


def _cuda_gemm(spec, inputs):
    """Textbook shared-memory tiling: a 16 x 16 block computes a 16 x 16 tile of Y, one output per thread, staging
    16 x 16 tiles of X and of W^T (nn.Linear's W is (N, K): loaded along K, stored transposed) or W (addmm)."""
    linear = _op(spec) == "linear"
    w_load = ("    Ws[threadIdx.x][threadIdx.y] = (n0 + threadIdx.y < N && k0 + threadIdx.x < K)\n"
              "        ? W[(int64_t)(n0 + threadIdx.y) * K + k0 + threadIdx.x] : 0.0f;" if linear else
              "    Ws[threadIdx.y][threadIdx.x] = (k0 + threadIdx.y < K && col < N)\n"
              "        ? W[(int64_t)(k0 + threadIdx.y) * N + col] : 0.0f;")
    kernel = "\n".join([
        "constexpr int TILE = 16;", "",
        "__global__ void gemm_epilogue_kernel(const float* __restrict__ X, const float* __restrict__ W,",
        "                                     const float* __restrict__ bias, float* __restrict__ Y, int M, int N,",
        "                                     int K) {",
        "    __shared__ float Xs[TILE][TILE];", "    __shared__ float Ws[TILE][TILE + 1];  // +1: no bank conflicts",
        "    int n0 = blockIdx.x * TILE, row = blockIdx.y * TILE + threadIdx.y, col = n0 + threadIdx.x;",
        "    float acc = 0.0f;", "    for (int k0 = 0; k0 < K; k0 += TILE) {",
        "        Xs[threadIdx.y][threadIdx.x] = (row < M && k0 + threadIdx.x < K)",
        "            ? X[(int64_t)row * K + k0 + threadIdx.x] : 0.0f;",
        "    " + w_load.replace("\n", "\n    "), "        __syncthreads();",
        "        for (int k = 0; k < TILE; ++k) acc = fmaf(Xs[threadIdx.y][k], Ws[k][threadIdx.x], acc);",
        "        __syncthreads();", "    }", "    if (row < M && col < N) {", "        float v = acc + bias[col];",
        *_cuda_steps([spec["core"]["act"]] + spec["post"], indent="        "),
        "        Y[(int64_t)row * N + col] = v;", "    }", "}", ""])
    host = [f"    int K = x.size(-1), M = x.numel() / K, N = w.size({0 if linear else 1});",
            "    auto sizes = x.sizes().vec();", "    sizes.back() = N;",
            "    auto out = torch::empty(sizes, x.options());",
            "    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);",
            "    gemm_epilogue_kernel<<<grid, dim3(TILE, TILE), 0, stream>>>(x.data_ptr<float>(), w.data_ptr<float>(),",
            " " * 63 + "b.data_ptr<float>(), out.data_ptr<float>(), M, N, K);"]
    py_args = ["x", "self.linear.weight", "self.linear.bias"] if linear else ["x", "weight", "bias"]
    return kernel, ["torch::Tensor x", "torch::Tensor w", "torch::Tensor b"], py_args, host


# ---------------------------------------------------------------------------------------------------------------------
# GPU sizes for the Proposer's SFT targets


def gpu_sized(module_src, elements):
    """A corpus module with its size constants grown for GPU timing, as the Proposer's prompt asks for them (the
    corpus keeps CPU sizes, so that the interpreter verifies a pair in seconds; a Proposer trained on those writes
    modules that a GPU runs in under 50 us, which the linter rejects). A gemm's in_features and out_features are
    doubled to 1024 at least and its batch to 2048 rows; otherwise the batch (alone, the dim) is doubled until the
    largest input holds at least elements / 2 values. Sizes are measured by running get_inputs on the meta device.

    batch_size = 256, dim = 48 (12,288 values), elements 2**25 -> batch_size = 524288 (25,165,824 values)"""
    if not elements:
        return module_src
    consts = {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+) = (\d+)$", module_src, re.M)}

    def render():
        return re.sub(r"^(\w+) = (\d+)$", lambda m: f"{m.group(1)} = {consts.get(m.group(1), m.group(2))}",
                      module_src, flags=re.M)

    def largest():
        return max(x.numel() for x in catalog.on_meta(render())[1])

    gemm = "in_features" in consts
    for name in ("in_features", "out_features"):
        while name in consts and consts[name] < 1024:
            consts[name] *= 2
    grow = "batch_size" if "batch_size" in consts else "dim"
    target = 2048 * consts["in_features"] if gemm else elements // 2
    while grow in consts and largest() < target:
        consts[grow] *= 2
    return render()


# ---------------------------------------------------------------------------------------------------------------------
# Generation: draw, de-duplicate, keep away from the held-out tasks, verify


def level_task_hashes():
    """Constant-blind normalised hashes of every level1/level2 task (the held-out evaluation set)."""
    hashes = set()
    for path in glob.glob(os.path.join(HERE, "level[12]", "*.py")):
        with open(path) as f:
            hashes.add(catalog.normalized_source_hash(f.read(), ignore_constants=True))
    return hashes


def draw_pairs(n, backend, seed):
    """n unverified pairs, deterministic from seed; skipped draws (duplicates, held-out collisions) are counted."""
    master = random.Random(seed)
    held_out, seen = level_task_hashes(), set()
    pairs, skipped = [], {"duplicate": 0, "held_out_collision": 0}
    while len(pairs) < n:
        pair_seed = master.getrandbits(31)
        spec = sample_spec(random.Random(pair_seed))
        module = render_module(spec)
        if catalog.normalized_source_hash(module, ignore_constants=True) in held_out:
            skipped["held_out_collision"] += 1
            continue
        key = catalog.normalized_source_hash(module)
        if key in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(key)
        if backend == "triton":
            solution = render_triton(spec)
        else:
            solution = render_cuda(spec, name=f"kz_synth_{seed}_{pair_seed}")
        pairs.append({"module": module, "solution": solution, "apis": spec_apis(spec), "backend": backend,
                      "seed": pair_seed, "kind": spec["kind"]})
    return pairs, skipped


def generate_pairs(n, backend, seed, verify=True, device=None, workers=None, trials=2, progress=True):
    """(pairs that verified, stats). verify=False returns every drawn pair unchecked."""
    assert backend in ("triton", "cuda"), backend
    if verify and backend == "cuda" and (device or ("cuda" if torch.cuda.is_available() else "cpu")) != "cuda":
        raise ValueError("verifying CUDA pairs needs a GPU: run with --device cuda on the GPU node, or --no-verify")
    t0 = time.time()
    drawn, skipped = draw_pairs(n, backend, seed)
    stats = {"n": n, "backend": backend, "seed": seed, "skipped_draws": skipped, "verified": verify,
             "by_kind": {}, "failures": {}, "failure_examples": []}
    if not verify:
        stats.update(ok=len(drawn), seconds=round(time.time() - t0, 1))
        return drawn, stats
    import eval_harness   # imported here: the generator itself needs neither the harness nor a GPU

    # No timing here, so nothing needs the GPU alone: 8 candidates share it (the harness default of 4 left an H200
    # mostly idle: 64 pairs took 121 s, ~7 s of start-up, reference and profiling per pair)
    with eval_harness.Evaluator(backend=backend, device=device, cpu_workers=workers, progress=progress,
                                trials=trials, timing=False, gpu_workers=8) as ev:
        results = ev.map([(p["module"], p["solution"]) for p in drawn])
    kept = []
    for pair, res in zip(drawn, results):
        ok_total = stats["by_kind"].setdefault(pair["kind"], [0, 0])
        ok_total[1] += 1
        if res.error_kind == "ok":
            ok_total[0] += 1
            kept.append(pair)
            continue
        stats["failures"][res.error_kind] = stats["failures"].get(res.error_kind, 0) + 1
        if len(stats["failure_examples"]) < 20:
            stats["failure_examples"].append({"seed": pair["seed"], "kind": pair["kind"], "apis": pair["apis"],
                                              "error_kind": res.error_kind, "error": res.error[:500]})
    stats.update(ok=len(kept), seconds=round(time.time() - t0, 1))
    return kept, stats


# ---------------------------------------------------------------------------------------------------------------------
# CLI


@dataclass
class Config:
    n: int = 2000                 # pairs to draw (the corpus holds those that verify)
    backend: str = "triton"       # "triton" or "cuda"
    out: str = "runs/synth"       # output directory: pairs.jsonl and stats.json
    seed: int = 0                 # master seed: the same seed gives the same pairs
    verify: bool = True           # check every pair with the harness (--no-verify: write sources unchecked)
    device: str = ""              # "cpu" or "cuda"; empty: cuda if available, else cpu (Triton interpreter)
    workers: int = 0              # CPU worker processes for the harness; 0: one per core
    trials: int = 2               # harness correctness trials per pair (plus one heavy-tailed trial)


def main(cfg):
    print(f"synth config: {json.dumps(dataclasses.asdict(cfg))}")
    pairs, stats = generate_pairs(cfg.n, cfg.backend, cfg.seed, verify=cfg.verify, device=cfg.device or None,
                                  workers=cfg.workers or None, trials=cfg.trials)
    os.makedirs(cfg.out, exist_ok=True)
    with open(os.path.join(cfg.out, "pairs.jsonl"), "w") as f:
        for p in tqdm(pairs, desc="writing", disable=len(pairs) < 1000):
            f.write(json.dumps(p) + "\n")
    with open(os.path.join(cfg.out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(f"{stats['ok']}/{cfg.n} pairs ok in {stats['seconds']} s; failures {stats['failures']}; "
          f"by kind {stats['by_kind']}; wrote {cfg.out}/pairs.jsonl")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for fld in dataclasses.fields(Config):
        if fld.type is bool or fld.type == "bool":
            parser.add_argument(f"--no-{fld.name}", dest=fld.name, action="store_false")
        else:
            parser.add_argument(f"--{fld.name}", type=type(fld.default), default=fld.default)
    main(Config(**vars(parser.parse_args())))
