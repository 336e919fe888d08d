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
import os
import random
import time
from dataclasses import dataclass

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
    while _numel(shape) > MAX_ELEMENTS:
        shape[0] = max(1, shape[0] // 2)
    return shape


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


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
# Rendering the module (the task)

SIZE_NAMES = {1: ["dim"], 2: ["batch_size", "dim"], 3: ["batch_size", "seq_len", "dim"]}


def _torch_step(step, x="x"):
    if step["op"] in UNARY:
        return UNARY[step["op"]][1].format(x=x, p=step["p"])
    y = repr(step["value"]) if step["operand"] == "scalar" else step["name"]
    return BINARY[step["op"]][1].format(x=x, y=y)


def _describe(spec):
    return " -> ".join(spec_apis(spec))


def render_module(spec):
    kind, shape, core = spec["kind"], spec["shape"], spec["core"]
    gemm = kind == "gemm"
    names = SIZE_NAMES[len(shape)][:-1] + (["in_features"] if gemm else ["dim"])
    shape_src = ", ".join(names)
    extras = _extras(spec)
    lines = [f'"""Synthetic {kind} task: {_describe(spec)}."""', "import torch", "import torch.nn as nn",
             "import torch.nn.functional as F", ""]
    lines += [f"{n} = {s}" for n, s in zip(names, shape)]
    init_args, init_body, init_inputs, inputs = "", [], [], ["x"]
    if gemm:
        lines.append(f"out_features = {spec['out_features']}")
        if core["op"] == "linear":
            init_args, init_inputs = ", in_features: int, out_features: int", ["in_features", "out_features"]
            init_body = ["        self.linear = nn.Linear(in_features, out_features)"]
        else:
            inputs += ["weight", "bias"]
    elif kind == "norm":
        init_args, init_inputs = ", dim: int", ["dim"]
        init_body = [{"layernorm": "        self.norm = nn.LayerNorm(dim)",
                      "layernorm_noaffine": "        self.norm = nn.LayerNorm(dim, elementwise_affine=False)",
                      "rmsnorm": "        self.norm = nn.RMSNorm(dim, eps=1e-6)"}[core["op"]]]
    inputs += [name for name, _, _ in extras]
    args = ", ".join(f"{a}: torch.Tensor" for a in inputs)
    lines += ["", "", "class Model(nn.Module):", f"    def __init__(self{init_args}):", "        super().__init__()"]
    lines += init_body + ["", f"    def forward(self, {args}) -> torch.Tensor:"]
    body = [_torch_step(s) for s in spec["pre"]]
    if gemm:
        body.append("self.linear(x)" if core["op"] == "linear" else "torch.addmm(bias, x, weight)")
        body.append(_torch_step(core["act"]))
    elif kind == "reduction":
        keep = ", keepdim=True" if core["keepdim"] else ""
        body.append(f"{REDUCERS[core['op']]}(x, dim=-1{keep})")
    elif kind == "softmax":
        body.append(f"F.{core['op']}(x, dim=-1)")
    elif kind == "norm":
        body.append("self.norm(x)")
    body += [_torch_step(s) for s in spec["post"]]
    lines += [f"        x = {b}" for b in body] + ["        return x", "", ""]
    gen = [f"torch.randn({shape_src})"]
    if gemm and core["op"] == "addmm":   # scaled like nn.Linear's init so that activations do not saturate
        gen += ["torch.randn(in_features, out_features) / in_features ** 0.5", "torch.randn(out_features)"]
    for name, operand, divisor in extras:
        s = shape_src if operand == "tensor" else names[-1]
        gen.append(f"torch.rand({s}) + 0.5" if divisor else f"torch.randn({s})")   # divisors stay away from 0
    lines += ["def get_inputs():", f"    return [{', '.join(gen)}]", "", "",
              "def get_init_inputs():", f"    return [{', '.join(init_inputs)}]", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Rendering the Triton solution

TRITON_HEADER = ["import torch", "import torch.nn as nn", "import triton", "import triton.language as tl", "", ""]


def _triton_steps(chain, load):
    """Kernel lines applying `chain` to `v`; load(name, operand) is the expression loading an extra input."""
    out = []
    for s in chain:
        if s["op"] in UNARY:
            api, _, expr, _ = UNARY[s["op"]]
            out.append(f"    v = {expr.format(v='v', p=s['p'])}  # {api}")
        else:
            y = repr(s["value"]) if s["operand"] == "scalar" else load(s["name"], s["operand"])
            out.append(f"    v = {BINARY[s['op']][2].format(v='v', y=y)}  # {BINARY[s['op']][0]}")
    return out


def _forward_lines(inputs):
    return [f"        {a} = {a}.contiguous()" for a in inputs]


def render_triton(spec):
    kind, core = spec["kind"], spec["core"]
    extras = [name for name, _, _ in _extras(spec)]
    if kind == "elementwise":
        return _triton_elementwise(spec, extras)
    if kind == "gemm":
        return _triton_gemm(spec, extras)
    return _triton_rows(spec, extras, core)


def _triton_elementwise(spec, extras):
    ptrs = "".join(f"{a}_ptr, " for a in ["x"] + extras)
    lines = TRITON_HEADER + ["@triton.jit", f"def fused_kernel({ptrs}out_ptr, n_elements, dim, BLOCK: tl.constexpr):",
                             "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
                             "    mask = offs < n_elements", "    v = tl.load(x_ptr + offs, mask=mask)"]
    # A row vector broadcasts over the last dimension: element i of x pairs with element i % dim of the vector.
    lines += _triton_steps(spec["pre"], lambda a, operand: f"tl.load({a}_ptr + offs{' % dim' if operand == 'row' else ''}"
                                                           f", mask=mask)")
    lines += ["    tl.store(out_ptr + offs, v, mask=mask)", ""]
    args = ", ".join(f"{a}: torch.Tensor" for a in ["x"] + extras)
    lines += _model_new_head("", args) + _forward_lines(["x"] + extras) + [
        "        out = torch.empty_like(x)",
        "        n = x.numel()",
        "        # Few large programs under the CPU interpreter (its cost grows with the program count).",
        "        BLOCK = 1024 if x.is_cuda else 16384",
        f"        fused_kernel[(triton.cdiv(n, BLOCK),)]({', '.join(['x'] + extras)}, out, n, x.shape[-1], BLOCK=BLOCK)",
        "        return out", ""]
    return "\n".join(lines)


def _model_new_head(init_args, args, init_body=()):
    return ["", "class ModelNew(nn.Module):", f"    def __init__(self{init_args}):", "        super().__init__()",
            *init_body, "", f"    def forward(self, {args}) -> torch.Tensor:"]


def _norm_init(op):
    return {"layernorm": ["        self.norm = nn.LayerNorm(dim)"],
            "layernorm_noaffine": ["        self.norm = nn.LayerNorm(dim, elementwise_affine=False)"],
            "rmsnorm": ["        self.norm = nn.RMSNorm(dim, eps=1e-6)"]}[op]


def _triton_rows(spec, extras, core):
    """One program per ROWS rows, each row whole in registers as a (ROWS, BLOCK_N) tile."""
    kind, op = spec["kind"], core["op"]
    params = ["x"] + extras + (["w", "b"] if op == "layernorm" else ["w"] if op == "rmsnorm" else [])
    eps = ", eps" if kind == "norm" else ""
    lines = TRITON_HEADER + [
        "@triton.jit",
        f"def fused_rows_kernel({''.join(p + '_ptr, ' for p in params)}out_ptr, n_rows, n_cols{eps},",
        "                      ROWS: tl.constexpr, BLOCK_N: tl.constexpr):",
        "    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)",
        "    cols = tl.arange(0, BLOCK_N)",
        "    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)",
        "    offs = rows[:, None] * n_cols + cols[None, :]",
        "    v = tl.load(x_ptr + offs, mask=mask, other=0.0)"]

    def load(a, operand):
        if operand == "row":
            return f"tl.load({a}_ptr + cols, mask=cols < n_cols, other=1.0)[None, :]"
        return f"tl.load({a}_ptr + offs, mask=mask, other=1.0)"   # 1.0: padding lanes never divide by 0
    lines += _triton_steps(spec["pre"], load)
    wload = "tl.load({}_ptr + cols, mask=cols < n_cols, other=0.0)[None, :]"
    if kind == "reduction":
        # Padding lanes hold op(0), not 0, after the elementwise chain: mask them with the reduction's identity.
        ident = {"sum": "0.0", "mean": "0.0", "amax": '-float("inf")', "amin": 'float("inf")'}[op]
        fn = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}[op]
        lines.append(f"    v = {fn}(tl.where(mask, v, {ident}), axis=1){' / n_cols' if op == 'mean' else ''}"
                     f"  # {REDUCERS[op]}")
    elif kind == "softmax":
        lines += ["    # Subtract the row max first: exp never overflows.",
                  '    v = tl.where(mask, v, -float("inf"))',
                  "    v = v - tl.max(v, axis=1)[:, None]", "    e = tl.exp(v)",
                  "    v = e / tl.sum(e, axis=1)[:, None]" if op == "softmax"
                  else "    v = v - tl.log(tl.sum(e, axis=1))[:, None]"]
    elif op.startswith("layernorm"):
        lines += ["    # Two-pass statistics (mean, then the biased variance of v - mean).",
                  "    v = tl.where(mask, v, 0.0)", "    mean = tl.sum(v, axis=1) / n_cols",
                  "    d = tl.where(mask, v - mean[:, None], 0.0)", "    var = tl.sum(d * d, axis=1) / n_cols",
                  "    v = d / tl.sqrt(var + eps)[:, None]"]
        if op == "layernorm":
            lines.append(f"    v = v * {wload.format('w')} + {wload.format('b')}")
    else:
        lines += ["    v = tl.where(mask, v, 0.0)", "    ms = tl.sum(v * v, axis=1) / n_cols",
                  f"    v = v / tl.sqrt(ms + eps)[:, None] * {wload.format('w')}"]
    lines += _triton_steps(spec["post"], None)
    if kind == "reduction":
        lines.append("    tl.store(out_ptr + rows, v, mask=rows < n_rows)")
    else:
        lines.append("    tl.store(out_ptr + offs, v, mask=mask)")
    init_args, init_body = (", dim: int", _norm_init(op)) if kind == "norm" else ("", [])
    args = ", ".join(f"{a}: torch.Tensor" for a in ["x"] + extras)
    if kind == "reduction":
        shape = "x.shape[:-1] + (1,)" if core["keepdim"] else "x.shape[:-1]"
        out = f"torch.empty({shape}, device=x.device, dtype=x.dtype)"
    else:
        out = "torch.empty_like(x)"
    call_args = ["x"] + extras + {"layernorm": ["self.norm.weight", "self.norm.bias"],
                                  "rmsnorm": ["self.norm.weight"]}.get(op, [])
    call_args += ["out", "n_rows", "n_cols"] + (["self.norm.eps"] if kind == "norm" else [])
    lines += ["", *_model_new_head(init_args, args, init_body), *_forward_lines(["x"] + extras),
              "        n_cols = x.shape[-1]", "        n_rows = x.numel() // n_cols", f"        out = {out}",
              "        # One row per program on the GPU; 16 rows per program under the CPU interpreter.",
              "        ROWS = 1 if x.is_cuda else 16",
              "        fused_rows_kernel[(triton.cdiv(n_rows, ROWS),)](",
              f"            {', '.join(call_args)},",
              "            ROWS=ROWS, BLOCK_N=triton.next_power_of_2(n_cols))", "        return out", ""]
    return "\n".join(lines)


def _triton_gemm(spec, extras):
    """Tiled GEMM with the bias, activation and post ops in the epilogue (Triton tutorial 03, fp32 'ieee' dot)."""
    linear = spec["core"]["op"] == "linear"
    lines = TRITON_HEADER + [
        "@triton.jit",
        "def gemm_epilogue_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_xk, stride_wk, stride_wn,",
        "                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):",
        "    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)",
        "    offs_k = tl.arange(0, BLOCK_K)",
        "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "    for k0 in range(0, K, BLOCK_K):",
        "        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + (k0 + offs_k[None, :]) * stride_xk,",
        "                    mask=(offs_m[:, None] < M) & (k0 + offs_k[None, :] < K), other=0.0)",
        "        w = tl.load(w_ptr + (k0 + offs_k[:, None]) * stride_wk + offs_n[None, :] * stride_wn,",
        "                    mask=(k0 + offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)",
        "        # ieee: the default TF32 would miss the fp32 tolerance (1e-4) on the GPU.",
        "        acc += tl.dot(a, w, input_precision=\"ieee\")",
        "    v = acc + tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)[None, :]"]
    lines += _triton_steps([spec["core"]["act"]] + spec["post"], None)
    lines += ["    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)",
              "    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], v, mask=mask)", ""]
    if linear:
        head = _model_new_head(", in_features: int, out_features: int", "x: torch.Tensor",
                               ["        self.linear = nn.Linear(in_features, out_features)"])
        # nn.Linear's weight is (N, K): W^T is read through its strides, no transposed copy.
        fwd = ["        w, b = self.linear.weight, self.linear.bias", "        x2 = x.reshape(-1, x.shape[-1])",
               "        M, K = x2.shape", "        N = w.shape[0]", "        stride_wk, stride_wn = w.stride(1), w.stride(0)"]
    else:
        head = _model_new_head("", "x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor")
        fwd = ["        w, b = weight.contiguous(), bias.contiguous()", "        x2 = x.contiguous()",
               "        M, K = x2.shape", "        N = w.shape[1]", "        stride_wk, stride_wn = w.stride(0), w.stride(1)"]
    lines += head + fwd + [
        "        y = torch.empty((M, N), device=x.device, dtype=x.dtype)",
        "        # 64 x 64 x 32 tiles on the GPU; a single big tile under the CPU interpreter.",
        "        if x.is_cuda:",
        "            BM, BN, BK = 64, 64, 32",
        "        else:",
        "            BM, BN, BK = (max(16, min(128, triton.next_power_of_2(s))) for s in (M, N, K))",
        "        grid = (triton.cdiv(M, BM), triton.cdiv(N, BN))",
        "        gemm_epilogue_kernel[grid](x2, w, b, y, M, N, K, x2.stride(0), x2.stride(1), stride_wk, stride_wn,",
        "                                   BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK)",
        "        return y.view(*x.shape[:-1], N)", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------------
# Rendering the CUDA solution (load_inline; `#include <torch/extension.h>` first, the harness rewrites it)

CUDA_REDUCE = {
    "sum": ("0.0f", "v += __shfl_xor_sync(0xffffffff, v, offset)", "+="),
    "max": ("-INFINITY", "v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset))", None),
    "min": ("INFINITY", "v = fminf(v, __shfl_xor_sync(0xffffffff, v, offset))", None),
}


def _cuda_block_reduce(kind):
    """block_<kind>(v): warp shuffles, then one shared-memory step across warps; every thread gets the result."""
    ident, shuffle, _ = CUDA_REDUCE[kind]
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


def _cuda_steps(chain, load, indent="    "):
    out = []
    for s in chain:
        if s["op"] in UNARY:
            api, _, _, expr = UNARY[s["op"]]
            out.append(f"{indent}v = {expr.format(v='v', p=s['p'])};  // {api}")
        else:
            y = f"{s['value']!r}f" if s["operand"] == "scalar" else load(s["name"], s["operand"])
            out.append(f"{indent}v = {BINARY[s['op']][3].format(v='v', y=y)};  // {BINARY[s['op']][0]}")
    return out


def _cuda_wrap(name, kernel_src, fn_sig, fn_body, init_args, args, call, init_body=()):
    cpp = f"torch::Tensor {fn_sig};"
    cuda = "#include <torch/extension.h>\n\n" + kernel_src + f"\ntorch::Tensor {fn_sig} {{\n" + "\n".join(fn_body) + \
        "\n    cudaError_t err = cudaGetLastError();\n" \
        "    TORCH_CHECK(err == cudaSuccess, \"kernel launch failed: \", cudaGetErrorString(err));\n    return out;\n}\n"
    lines = ["import torch", "import torch.nn as nn", "from torch.utils.cpp_extension import load_inline", "",
             f'cuda_source = r"""\n{cuda}"""', f'cpp_source = "{cpp}"', "",
             f'ext = load_inline(name="{name}", cpp_sources=cpp_source, cuda_sources=cuda_source,',
             f'                  functions=["fused_forward"], verbose=False)', "",
             *_model_new_head(init_args, args, init_body), f"        return ext.fused_forward({call})", ""]
    return "\n".join(lines)


def render_cuda(spec, name):
    kind, core = spec["kind"], spec["core"]
    extras = [n for n, _, _ in _extras(spec)]
    tensors = ["x"] + extras
    ptr_params = "".join(f"const float* __restrict__ {a}, " for a in tensors)
    check = "    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, \"x must be a float32 CUDA tensor\");"
    contig = [f"    {a} = {a}.contiguous();" for a in tensors]
    sig_args = ", ".join(f"torch::Tensor {a}" for a in tensors)
    ptrs = "".join(f"{a}.data_ptr<float>(), " for a in tensors)
    args = ", ".join(f"{a}: torch.Tensor" for a in tensors)
    if kind == "elementwise":
        body = _cuda_steps(spec["pre"], lambda a, operand: f"{a}[i % dim]" if operand == "row" else f"{a}[i]")
        kernel = (f"__global__ void fused_kernel({ptr_params}float* __restrict__ out, int64_t n, int64_t dim) {{\n"
                  "    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;\n    if (i >= n) return;\n"
                  "    float v = x[i];\n" + "\n".join(body) + "\n    out[i] = v;\n}\n")
        fn = [check, *contig, "    auto out = torch::empty_like(x);", "    int64_t n = x.numel();",
              f"    fused_kernel<<<(n + 255) / 256, 256>>>({ptrs}out.data_ptr<float>(), n, x.size(-1));"]
        return _cuda_wrap(name, kernel, f"fused_forward({sig_args})", fn, "", args, ", ".join(tensors))
    if kind == "gemm":
        return _cuda_gemm(spec, name)
    return _cuda_rows(spec, name, core, extras, tensors, ptr_params, check, contig, sig_args, ptrs, args)


def _cuda_rows(spec, name, core, extras, tensors, ptr_params, check, contig, sig_args, ptrs, args):
    """One block of 256 threads per row; the elementwise prelude is recomputed in each sweep (reads hit L1/L2)."""
    kind, op = spec["kind"], core["op"]
    pre = _cuda_steps(spec["pre"], lambda a, operand: f"{a}[c]" if operand == "row" else f"{a}[i]")
    plist = ", ".join(tensors)
    src = f"__device__ __forceinline__ float pre_ops({ptr_params}int64_t i, int64_t c) {{\n    float v = x[i];\n" + \
        "\n".join(pre) + ("\n" if pre else "") + "    return v;\n}\n\n"
    if kind == "reduction":
        reducers = [{"sum": "sum", "mean": "sum", "amax": "max", "amin": "min"}[op]]
    else:
        reducers = ["max", "sum"] if kind == "softmax" else ["sum"]
    src += "\n".join(_cuda_block_reduce(r) for r in reducers) + "\n"
    wparams = {"layernorm": "const float* __restrict__ w, const float* __restrict__ b, ",
               "rmsnorm": "const float* __restrict__ w, "}.get(op, "")
    eps = ", float eps" if kind == "norm" else ""
    loop = "    for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x)"
    item = f"pre_ops({plist}, base + c, c)"
    post = _cuda_steps(spec["post"], None, indent="        ")
    body = ["    int64_t base = (int64_t)blockIdx.x * n_cols;"]
    if kind == "reduction":
        red = reducers[0]
        ident = CUDA_REDUCE[red][0]
        update = {"sum": f"acc += {item}", "max": f"acc = fmaxf(acc, {item})", "min": f"acc = fminf(acc, {item})"}
        body += [f"    float acc = {ident};", f"{loop} {update[red]};",
                 f"    float v = block_{red}(acc){' / n_cols' if op == 'mean' else ''};  // {REDUCERS[op]}",
                 "    if (threadIdx.x == 0) {", *post, "        out[blockIdx.x] = v;", "    }"]
    else:
        if kind == "softmax":   # subtract the row max first: expf never overflows
            body += ["    float m = -INFINITY;", f"{loop} m = fmaxf(m, {item});", "    m = block_max(m);",
                     "    float s = 0.0f;", f"{loop} s += expf({item} - m);", "    s = block_sum(s);"]
            value = f"expf({item} - m) / s" if op == "softmax" else f"({item} - m) - logf(s)"
        elif op.startswith("layernorm"):   # two-pass statistics: mean, then the variance of v - mean
            body += ["    float s = 0.0f;", f"{loop} s += {item};", "    float mean = block_sum(s) / n_cols;",
                     "    float ss = 0.0f;", f"{loop} {{", f"        float d = {item} - mean;", "        ss += d * d;",
                     "    }", "    float rstd = 1.0f / sqrtf(block_sum(ss) / n_cols + eps);"]
            value = f"({item} - mean) * rstd" + (" * w[c] + b[c]" if op == "layernorm" else "")
        else:
            body += ["    float ss = 0.0f;", f"{loop} {{", f"        float h = {item};", "        ss += h * h;", "    }",
                     "    float rms = sqrtf(block_sum(ss) / n_cols + eps);"]
            value = f"{item} / rms * w[c]"
        body += [f"{loop} {{", f"        float v = {value};", *post, "        out[base + c] = v;", "    }"]
    src += (f"__global__ void fused_rows_kernel({ptr_params}{wparams}float* __restrict__ out, int64_t n_cols{eps}) "
            "{\n" + "\n".join(body) + "\n}\n")
    w_args = {"layernorm": ["w", "b"], "rmsnorm": ["w"]}.get(op, [])
    sig = f"fused_forward({sig_args}{''.join(f', torch::Tensor {a}' for a in w_args)}{', double eps' if eps else ''})"
    if kind == "reduction":
        shape = ["    auto sizes = x.sizes().vec();",
                 "    sizes.back() = 1;" if core["keepdim"] else "    sizes.pop_back();",
                 "    auto out = torch::empty(sizes, x.options());"]
    else:
        shape = ["    auto out = torch::empty_like(x);"]
    wptrs = "".join(f"{a}.contiguous().data_ptr<float>(), " for a in w_args)
    fn = [check, *contig, *shape, "    int64_t n_cols = x.size(-1);", "    int64_t n_rows = x.numel() / n_cols;",
          f"    fused_rows_kernel<<<(unsigned)n_rows, 256>>>({ptrs}{wptrs}out.data_ptr<float>(), n_cols"
          f"{', (float)eps' if eps else ''});"]
    call = ", ".join(tensors + {"layernorm": ["self.norm.weight", "self.norm.bias"],
                                "rmsnorm": ["self.norm.weight"]}.get(op, []) + (["self.norm.eps"] if eps else []))
    init_args, init_body = (", dim: int", _norm_init(op)) if kind == "norm" else ("", [])
    return _cuda_wrap(name, src, sig, fn, init_args, args, call, init_body)


# The golden solutions' tiled SGEMM (kernelbench_tasks/solutions/level1/014_SquareMatmul_cuda.py), with an epilogue.
CUDA_GEMM_TILE = r"""constexpr int TILE = 64, TK = 16, THREADS = 16;

// Each 16 x 16 block computes a 64 x 64 tile of C, each thread 4 x 4 outputs at rows ty + 16 i, columns tx + 16 j.
// TRANS_B: B is (N, K) row-major (an nn.Linear weight) and is read as its transpose.
template <bool TRANS_B>
__device__ void gemm_tile(const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K,
                          float acc[4][4]) {
    __shared__ float As[TILE][TK + 1];
    __shared__ float Bs[TK][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * THREADS + tx;
    const int m0 = blockIdx.y * TILE, n0 = blockIdx.x * TILE;
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int e = tid; e < TILE * TK; e += THREADS * THREADS) {
            int r = e / TK, c = e % TK;
            As[r][c] = (m0 + r < M && k0 + c < K) ? A[(int64_t)(m0 + r) * K + k0 + c] : 0.0f;
            if (TRANS_B) Bs[c][r] = (n0 + r < N && k0 + c < K) ? B[(int64_t)(n0 + r) * K + k0 + c] : 0.0f;
        }
        if (!TRANS_B) {
            for (int e = tid; e < TILE * TK; e += THREADS * THREADS) {
                int r = e / TILE, c = e % TILE;
                Bs[r][c] = (k0 + r < K && n0 + c < N) ? B[(int64_t)(k0 + r) * N + n0 + c] : 0.0f;
            }
        }
        __syncthreads();
        for (int kk = 0; kk < TK; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = As[ty + THREADS * i][kk];
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + THREADS * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
}
"""


def _cuda_gemm(spec, name):
    linear = spec["core"]["op"] == "linear"
    epilogue = _cuda_steps([spec["core"]["act"]] + spec["post"], None, indent="                ")
    kernel = CUDA_GEMM_TILE + f"""
__global__ void gemm_epilogue_kernel(const float* __restrict__ X, const float* __restrict__ W,
                                     const float* __restrict__ bias, float* __restrict__ Y, int M, int N, int K) {{
    float acc[4][4] = {{}};
    gemm_tile<{'true' if linear else 'false'}>(X, W, M, N, K, acc);
    for (int i = 0; i < 4; ++i) {{
        int m = blockIdx.y * TILE + threadIdx.y + THREADS * i;
        for (int j = 0; j < 4; ++j) {{
            int n = blockIdx.x * TILE + threadIdx.x + THREADS * j;
            if (m < M && n < N) {{
                float v = acc[i][j] + bias[n];
{chr(10).join(epilogue)}
                Y[(int64_t)m * N + n] = v;
            }}
        }}
    }}
}}
"""
    fn = ["    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, \"x must be a float32 CUDA tensor\");",
          "    auto x2 = x.reshape({-1, x.size(-1)}).contiguous();", "    w = w.contiguous();", "    b = b.contiguous();",
          f"    int M = x2.size(0), K = x2.size(1), N = w.size({0 if linear else 1});",
          "    auto sizes = x.sizes().vec();", "    sizes.back() = N;", "    auto out = torch::empty(sizes, x.options());",
          "    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);",
          "    gemm_epilogue_kernel<<<grid, dim3(THREADS, THREADS)>>>(x2.data_ptr<float>(), w.data_ptr<float>(),",
          "                                                          b.data_ptr<float>(), out.data_ptr<float>(), M, N, K);"]
    sig = "fused_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b)"
    if linear:
        return _cuda_wrap(name, kernel, sig, fn, ", in_features: int, out_features: int", "x: torch.Tensor",
                          "x, self.linear.weight, self.linear.bias",
                          ["        self.linear = nn.Linear(in_features, out_features)"])
    return _cuda_wrap(name, kernel, sig, fn, "", "x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor",
                      "x, weight, bias")


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
    t0 = time.time()
    drawn, skipped = draw_pairs(n, backend, seed)
    stats = {"n": n, "backend": backend, "seed": seed, "skipped_draws": skipped, "verified": verify,
             "by_kind": {}, "failures": {}, "failure_examples": []}
    if not verify:
        stats.update(ok=len(drawn), seconds=round(time.time() - t0, 1))
        return drawn, stats
    import eval_harness   # imported here: the generator itself needs neither the harness nor a GPU

    with eval_harness.Evaluator(backend=backend, device=device, cpu_workers=workers, progress=progress,
                                trials=trials, timing=False) as ev:
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
