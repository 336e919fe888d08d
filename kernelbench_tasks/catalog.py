"""The PyTorch API catalog the Proposer samples from, and the source-level checks built on it.

What it is. `CATALOG` lists ~110 torch APIs (torch.*, torch.nn.functional.*, nn modules, tensor methods), each with
its kind (one of `KINDS`), a call template with example arguments (how a forward uses it), a signature, the input
ranks and dtypes it is meant for, and small example shapes. KernelZero's Proposer phase (kernelzero.py) does:

    apis = catalog.sample_api_set(rng, k=2, weights=api_weights)    # weighted toward the Coder's frontier
    prompt = proposer_prompt(catalog.render_api_set(apis))          # "use every one of these operations: ..."
    ...                                                             # the Proposer writes a module
    catalog.module_uses_apis(module_src, apis) == []                # it really uses every API of the set
    catalog.normalized_source_hash(module_src)                      # de-duplication, and "not a held-out task"

How it departs from KernelZero (the paper samples "API sets" from PyTorch; its catalog is not public):
1. Hand-written, ~110 entries; equivalent spellings (F.relu / torch.relu / nn.ReLU / x.relu()) are one API.
2. Sets are drawn to compose into one module: at most one matmul or conv, one loss, one norm, one pooling, one scan,
   one shape op, two reductions, and a rank that every API of the set accepts (KIND_CAPS, _compatible).
3. "Uses the API" is a static AST check (module_uses_apis); operators count for their functions (x @ y is
   torch.matmul), operators inside __init__ do not. A module could still call an API on a dead branch.
4. De-duplication is by exact normalised-AST hash (normalized_source_hash), not by embedding similarity.

Entry fields (all plain data, JSON-serialisable):
    name            canonical dotted name, unique ("torch.nn.functional.gelu", "torch.nn.Conv2d", "torch.Tensor.permute")
    kind            one of KINDS
    call            forward expression with example arguments; inputs are named as in `inputs`, modules are self.op
    init            statement for __init__ ("" if none), e.g. "self.op = nn.Conv2d(8, 16, kernel_size=3, padding=1)"
    signature       the documented signature, for the prompt
    inputs          input names used by `call`; arity = len(inputs)
    arity           number of tensor inputs
    ranks           ranks of the first input the call template accepts
    dtypes          floating dtypes the op supports ("float32", "float16", "bfloat16")
    example_shapes  {rank: [shape of each input]}, small, for tests and the synthetic generator
    domains         {input name: "normal" | "positive" | "unit" | "prob" | "logprob" | "int:N"} (default "normal":
                    torch.randn; "int:N" is torch.randint(0, N); "unit" is torch.rand)
    aliases         other dotted names that count as using this API (functional / module / torch.* spellings)
    methods         tensor-method names that count (x.sum(...))
    operators       AST operator names that count (ast.Add -> "Add" for torch.add, "MatMult" for torch.matmul)
    attrs           tensor attributes that count (x.T, x.mT)
    notes           what a module author must know (e.g. a fresh BatchNorm in eval mode is nearly the identity)

Run `python -m kernelbench_tasks.catalog` to print the catalog grouped by kind.
"""
import ast
import hashlib
import math
import random

import torch

from harness.static_checks import import_aliases, name_chain

KINDS = ("elementwise_unary", "elementwise_binary", "reduction", "matmul", "conv", "norm", "pooling", "scan", "loss",
         "shape")
FLOATS = ["float32", "float16", "bfloat16"]

# Example shapes per rank for ops that accept any rank; every one ends with 32 so that norms over the last
# dimension can use a fixed normalized_shape.
_ANY_RANK = {1: (256,), 2: (16, 32), 3: (4, 16, 32), 4: (2, 4, 16, 32), 5: (2, 2, 4, 8, 32)}
_PREFIXES = {"F.": "torch.nn.functional.", "nn.": "torch.nn."}


def _full(name):
    """'F.gelu' -> 'torch.nn.functional.gelu', 'nn.Conv2d' -> 'torch.nn.Conv2d'; dotted torch names unchanged."""
    for short, long in _PREFIXES.items():
        if name.startswith(short):
            return long + name[len(short):]
    return name


def _entry(name, kind, call, signature, inputs=("x",), ranks=(1, 2, 3, 4, 5), dtypes=FLOATS, shapes=None, init="",
           domains=None, aliases=(), methods=None, operators=(), attrs=(), notes="", fanout=1):
    """One catalog entry. Equivalent spellings are derived: F.x <-> torch.x and tensor methods when torch has them."""
    name = _full(name)
    short = name.rsplit(".", 1)[1]
    aliases = [_full(a) for a in aliases]
    if name.startswith(("torch.nn.functional.", "torch.Tensor.")) and hasattr(torch, short) and short[0].islower():
        aliases.append("torch." + short)
    if name.count(".") == 1 and hasattr(torch.nn.functional, short):  # torch.sigmoid <-> F.sigmoid
        aliases.append("torch.nn.functional." + short)
    if methods is None:  # x.relu(), x.sum(dim=-1), their in-place forms
        methods = [m for m in (short, short + "_") if short[0].islower() and hasattr(torch.Tensor, m)]
    if short[0].islower() and hasattr(torch.Tensor, short):
        aliases.append("torch.Tensor." + short)
    if shapes is None:
        shapes = {r: [_ANY_RANK[r]] * len(inputs) for r in ranks}
    return {"name": name, "kind": kind, "call": call, "init": init, "signature": signature, "inputs": list(inputs),
            "arity": len(inputs), "ranks": list(ranks), "dtypes": list(dtypes),
            "example_shapes": {r: [list(s) for s in v] for r, v in shapes.items()}, "domains": dict(domains or {}),
            "aliases": sorted(set(aliases) - {name}), "methods": list(methods), "operators": list(operators),
            "attrs": list(attrs), "notes": notes, "fanout": fanout}


def _unary(name, call, signature, module=None, **kw):
    """An elementwise activation-style op: one input, any rank, optional nn module form (nn.GELU)."""
    aliases = list(kw.pop("aliases", ())) + ([module] if module else [])
    return _entry(name, "elementwise_unary", call, signature, aliases=aliases, **kw)


def _binary(name, call, signature, inputs=("x", "y"), **kw):
    return _entry(name, "elementwise_binary", call, signature, inputs=inputs, **kw)


def _reduction(name, call, signature, **kw):
    return _entry(name, "reduction", call, signature, **kw)


def _module(name, kind, init, call, signature, ranks, shapes, aliases=(), **kw):
    """An nn module used as self.op; its functional form counts as the same API."""
    return _entry(name, kind, call, signature, ranks=ranks, shapes=shapes, init=init, aliases=aliases, methods=[],
                  **kw)


def _loss(name, call, signature, domains=None, module=None, **kw):
    shapes = kw.pop("shapes", {2: [(16, 32), (16, 32)], 3: [(4, 16, 32), (4, 16, 32)]})
    return _entry(name, "loss", call, signature, inputs=("x", "y"), ranks=tuple(shapes), shapes=shapes,
                  domains=domains, aliases=[module] if module else (), methods=[], **kw)


def _scan(name, call, signature, **kw):
    return _entry(name, "scan", call, signature, **kw)


def _shape(name, call, signature, **kw):
    return _entry(name, "shape", call, signature, **kw)


# -----------------------------------------------------------------------------
# The catalog

CATALOG = [
    # elementwise_unary: activations (functional form canonical; nn module and torch.* spellings count too)
    _unary("F.relu", "F.relu(x)", "F.relu(input, inplace=False) -> Tensor", "nn.ReLU",
           notes="identity on non-negative inputs: feed torch.randn, not torch.rand"),
    _unary("F.gelu", "F.gelu(x)", "F.gelu(input, approximate='none'|'tanh') -> Tensor", "nn.GELU"),
    _unary("F.silu", "F.silu(x)", "F.silu(input, inplace=False) -> Tensor", "nn.SiLU"),
    _unary("F.leaky_relu", "F.leaky_relu(x, negative_slope=0.1)",
           "F.leaky_relu(input, negative_slope=0.01, inplace=False) -> Tensor", "nn.LeakyReLU"),
    _unary("F.softplus", "F.softplus(x, beta=1.0, threshold=20.0)", "F.softplus(input, beta=1.0, threshold=20.0)",
           "nn.Softplus"),
    _unary("F.elu", "F.elu(x, alpha=1.0)", "F.elu(input, alpha=1.0, inplace=False) -> Tensor", "nn.ELU"),
    _unary("F.selu", "F.selu(x)", "F.selu(input, inplace=False) -> Tensor", "nn.SELU"),
    _unary("F.celu", "F.celu(x, alpha=1.0)", "F.celu(input, alpha=1.0, inplace=False) -> Tensor", "nn.CELU"),
    _unary("F.hardswish", "F.hardswish(x)", "F.hardswish(input, inplace=False) -> Tensor", "nn.Hardswish",
           notes="x * relu6(x + 3) / 6: scale inputs (e.g. 4 * randn) so both kinks are hit"),
    _unary("F.hardsigmoid", "F.hardsigmoid(x)", "F.hardsigmoid(input, inplace=False) -> Tensor", "nn.Hardsigmoid"),
    _unary("F.hardtanh", "F.hardtanh(x, min_val=-1.0, max_val=1.0)",
           "F.hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False) -> Tensor", "nn.Hardtanh"),
    _unary("F.relu6", "F.relu6(x)", "F.relu6(input, inplace=False) -> Tensor", "nn.ReLU6"),
    _unary("F.mish", "F.mish(x)", "F.mish(input, inplace=False) -> Tensor", "nn.Mish"),
    _unary("F.softsign", "F.softsign(x)", "F.softsign(input) -> Tensor", "nn.Softsign"),
    _unary("F.logsigmoid", "F.logsigmoid(x)", "F.logsigmoid(input) -> Tensor", "nn.LogSigmoid"),
    _unary("F.glu", "F.glu(x, dim=-1)", "F.glu(input, dim=-1) -> Tensor (halves dim: a * sigmoid(b))", "nn.GLU"),
    _unary("torch.sigmoid", "torch.sigmoid(x)", "torch.sigmoid(input) -> Tensor", "nn.Sigmoid"),
    _unary("torch.tanh", "torch.tanh(x)", "torch.tanh(input) -> Tensor", "nn.Tanh"),
    # elementwise_unary: math
    _unary("torch.exp", "torch.exp(x)", "torch.exp(input) -> Tensor"),
    _unary("torch.log", "torch.log(x)", "torch.log(input) -> Tensor", domains={"x": "positive"},
           notes="needs positive inputs, e.g. x.abs() + 1 or torch.rand(...) + 0.5"),
    _unary("torch.sqrt", "torch.sqrt(x)", "torch.sqrt(input) -> Tensor", domains={"x": "positive"}),
    _unary("torch.rsqrt", "torch.rsqrt(x)", "torch.rsqrt(input) -> Tensor", domains={"x": "positive"}),
    _unary("torch.reciprocal", "torch.reciprocal(x)", "torch.reciprocal(input) -> Tensor", domains={"x": "positive"}),
    _unary("torch.abs", "torch.abs(x)", "torch.abs(input) -> Tensor"),
    _unary("torch.sin", "torch.sin(x)", "torch.sin(input) -> Tensor"),
    _unary("torch.cos", "torch.cos(x)", "torch.cos(input) -> Tensor"),
    _unary("torch.erf", "torch.erf(x)", "torch.erf(input) -> Tensor"),
    _unary("torch.square", "torch.square(x)", "torch.square(input) -> Tensor"),
    _unary("torch.pow", "torch.pow(x, 3)", "torch.pow(input, exponent) -> Tensor", operators=["Pow"]),
    _unary("torch.clamp", "torch.clamp(x, min=-0.5, max=0.5)", "torch.clamp(input, min=None, max=None) -> Tensor",
           aliases=["torch.clip"], methods=["clamp", "clamp_", "clip", "clip_"]),
    # elementwise_binary
    _binary("torch.add", "torch.add(x, y)", "torch.add(input, other, alpha=1) -> Tensor (also x + y)",
            operators=["Add"]),
    _binary("torch.sub", "torch.sub(x, y)", "torch.sub(input, other, alpha=1) -> Tensor (also x - y)",
            operators=["Sub"]),
    _binary("torch.mul", "torch.mul(x, y)", "torch.mul(input, other) -> Tensor (also x * y)", operators=["Mult"]),
    _binary("torch.div", "torch.div(x, y)", "torch.div(input, other, rounding_mode=None) -> Tensor (also x / y)",
            operators=["Div"], domains={"y": "positive"}),
    _binary("torch.maximum", "torch.maximum(x, y)", "torch.maximum(input, other) -> Tensor"),
    _binary("torch.minimum", "torch.minimum(x, y)", "torch.minimum(input, other) -> Tensor"),
    _binary("torch.atan2", "torch.atan2(x, y)", "torch.atan2(input, other) -> Tensor"),
    _binary("torch.where", "torch.where(x > 0, x, y)", "torch.where(condition, input, other) -> Tensor", methods=[]),
    _binary("torch.lerp", "torch.lerp(x, y, 0.25)", "torch.lerp(input, end, weight) -> Tensor"),
    _binary("torch.Tensor.masked_fill", "x.masked_fill(y > 0, 0.0)", "Tensor.masked_fill(mask, value) -> Tensor"),
    _binary("torch.addcmul", "torch.addcmul(x, y, z, value=0.5)",
            "torch.addcmul(input, tensor1, tensor2, value=1) -> Tensor: input + value * tensor1 * tensor2",
            inputs=("x", "y", "z")),
    # reduction (dim=-1 keeps the templates rank-agnostic)
    _reduction("torch.sum", "torch.sum(x, dim=-1)", "torch.sum(input, dim, keepdim=False) -> Tensor"),
    _reduction("torch.mean", "torch.mean(x, dim=-1)", "torch.mean(input, dim, keepdim=False) -> Tensor"),
    _reduction("torch.amax", "torch.amax(x, dim=-1)", "torch.amax(input, dim, keepdim=False) -> Tensor"),
    _reduction("torch.amin", "torch.amin(x, dim=-1)", "torch.amin(input, dim, keepdim=False) -> Tensor"),
    _reduction("torch.max", "torch.max(x, dim=-1).values", "torch.max(input, dim, keepdim=False) -> (values, indices)"),
    _reduction("torch.min", "torch.min(x, dim=-1).values", "torch.min(input, dim, keepdim=False) -> (values, indices)"),
    _reduction("torch.argmax", "torch.argmax(x, dim=-1)", "torch.argmax(input, dim, keepdim=False) -> LongTensor"),
    _reduction("torch.argmin", "torch.argmin(x, dim=-1)", "torch.argmin(input, dim, keepdim=False) -> LongTensor"),
    _reduction("torch.logsumexp", "torch.logsumexp(x, dim=-1)", "torch.logsumexp(input, dim, keepdim=False)"),
    _reduction("torch.prod", "torch.prod(x, dim=-1)", "torch.prod(input, dim, keepdim=False) -> Tensor",
               notes="products of many standard normals underflow: reduce few elements or use inputs near 1"),
    _reduction("torch.var", "torch.var(x, dim=-1, correction=0)", "torch.var(input, dim, correction=1, keepdim=False)"),
    _reduction("torch.std", "torch.std(x, dim=-1, correction=0)", "torch.std(input, dim, correction=1, keepdim=False)"),
    _reduction("torch.linalg.vector_norm", "torch.linalg.vector_norm(x, ord=2, dim=-1)",
               "torch.linalg.vector_norm(x, ord=2, dim=None, keepdim=False) -> Tensor",
               aliases=["torch.norm", "torch.linalg.norm", "torch.Tensor.norm"], methods=["norm"]),
    _reduction("torch.topk", "torch.topk(x, k=4, dim=-1).values", "torch.topk(input, k, dim=-1) -> (values, indices)"),
    _reduction("F.softmax", "F.softmax(x, dim=-1)", "F.softmax(input, dim) -> Tensor", aliases=["nn.Softmax"]),
    _reduction("F.log_softmax", "F.log_softmax(x, dim=-1)", "F.log_softmax(input, dim) -> Tensor",
               aliases=["nn.LogSoftmax"]),
    _reduction("F.cosine_similarity", "F.cosine_similarity(x, y, dim=-1)",
               "F.cosine_similarity(x1, x2, dim=1, eps=1e-8) -> Tensor", inputs=("x", "y"), ranks=(2, 3),
               aliases=["nn.CosineSimilarity"]),
    # matmul
    _entry("torch.matmul", "matmul", "torch.matmul(x, y)", "torch.matmul(input, other) -> Tensor (also x @ y)",
           inputs=("x", "y"), ranks=(2, 3), shapes={2: [(32, 64), (64, 48)], 3: [(4, 32, 64), (4, 64, 48)]},
           operators=["MatMult"]),
    _entry("torch.mm", "matmul", "torch.mm(x, y)", "torch.mm(input, mat2) -> Tensor", inputs=("x", "y"), ranks=(2,),
           shapes={2: [(32, 64), (64, 48)]}),
    _entry("torch.bmm", "matmul", "torch.bmm(x, y)", "torch.bmm(input, mat2) -> Tensor", inputs=("x", "y"),
           ranks=(3,), shapes={3: [(4, 32, 64), (4, 64, 48)]}),
    _entry("torch.mv", "matmul", "torch.mv(x, y)", "torch.mv(input, vec) -> Tensor", inputs=("x", "y"), ranks=(2,),
           shapes={2: [(64, 128), (128,)]}),
    _entry("torch.outer", "matmul", "torch.outer(x, y)", "torch.outer(input, vec2) -> Tensor", inputs=("x", "y"),
           ranks=(1,), shapes={1: [(64,), (48,)]}, aliases=["torch.ger"]),
    _entry("torch.addmm", "matmul", "torch.addmm(z, x, y)", "torch.addmm(input, mat1, mat2, beta=1, alpha=1)",
           inputs=("x", "y", "z"), ranks=(2,), shapes={2: [(32, 64), (64, 48), (48,)]}),
    _entry("torch.einsum", "matmul", "torch.einsum('bij,bjk->bik', x, y)", "torch.einsum(equation, *operands)",
           inputs=("x", "y"), ranks=(3,), shapes={3: [(4, 32, 64), (4, 64, 48)]}, methods=[]),
    _module("nn.Linear", "matmul", "self.op = nn.Linear(32, 64)", "self.op(x)",
            "nn.Linear(in_features, out_features, bias=True); forward: x @ W^T + b", ranks=(2, 3),
            shapes={2: [(16, 32)], 3: [(4, 16, 32)]}, aliases=["F.linear"]),
    _entry("F.scaled_dot_product_attention", "matmul", "F.scaled_dot_product_attention(x, y, z)",
           "F.scaled_dot_product_attention(query, key, value, attn_mask=None, is_causal=False, scale=None)",
           inputs=("x", "y", "z"), ranks=(4,), shapes={4: [(2, 4, 64, 32)] * 3},
           notes="(batch, heads, seq, head_dim); is_causal=True for a causal mask"),
    # conv (nn modules; the functional F.convNd with explicit weights counts as the same API)
    _module("nn.Conv1d", "conv", "self.op = nn.Conv1d(8, 16, kernel_size=3, padding=1)", "self.op(x)",
            "nn.Conv1d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True)",
            ranks=(3,), shapes={3: [(4, 8, 64)]}, aliases=["F.conv1d", "torch.conv1d"]),
    _module("nn.Conv2d", "conv", "self.op = nn.Conv2d(8, 16, kernel_size=3, padding=1)", "self.op(x)",
            "nn.Conv2d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True)",
            ranks=(4,), shapes={4: [(2, 8, 16, 16)]}, aliases=["F.conv2d", "torch.conv2d"],
            notes="groups=in_channels gives a depthwise convolution"),
    _module("nn.Conv3d", "conv", "self.op = nn.Conv3d(4, 8, kernel_size=3, padding=1)", "self.op(x)",
            "nn.Conv3d(in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True)",
            ranks=(5,), shapes={5: [(2, 4, 8, 8, 8)]}, aliases=["F.conv3d", "torch.conv3d"]),
    _module("nn.ConvTranspose1d", "conv", "self.op = nn.ConvTranspose1d(8, 4, kernel_size=4, stride=2, padding=1)",
            "self.op(x)", "nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=1, padding=0, ...)",
            ranks=(3,), shapes={3: [(4, 8, 64)]}, aliases=["F.conv_transpose1d", "torch.conv_transpose1d"]),
    _module("nn.ConvTranspose2d", "conv", "self.op = nn.ConvTranspose2d(8, 4, kernel_size=4, stride=2, padding=1)",
            "self.op(x)", "nn.ConvTranspose2d(in_channels, out_channels, kernel_size, stride=1, padding=0, ...)",
            ranks=(4,), shapes={4: [(2, 8, 16, 16)]}, aliases=["F.conv_transpose2d", "torch.conv_transpose2d"]),
    # norm
    _module("nn.LayerNorm", "norm", "self.op = nn.LayerNorm(32)", "self.op(x)",
            "nn.LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True)", ranks=(2, 3, 4, 5),
            shapes={r: [_ANY_RANK[r]] for r in (2, 3, 4, 5)}, aliases=["F.layer_norm", "torch.layer_norm"]),
    _module("nn.RMSNorm", "norm", "self.op = nn.RMSNorm(32)", "self.op(x)",
            "nn.RMSNorm(normalized_shape, eps=None, elementwise_affine=True)", ranks=(2, 3, 4, 5),
            shapes={r: [_ANY_RANK[r]] for r in (2, 3, 4, 5)}, aliases=["F.rms_norm", "torch.rms_norm"]),
    _module("nn.GroupNorm", "norm", "self.op = nn.GroupNorm(4, 8)", "self.op(x)",
            "nn.GroupNorm(num_groups, num_channels, eps=1e-5, affine=True)", ranks=(3, 4),
            shapes={3: [(4, 8, 32)], 4: [(2, 8, 16, 16)]}, aliases=["F.group_norm", "torch.group_norm"]),
    _module("nn.BatchNorm1d", "norm", "self.op = nn.BatchNorm1d(8)", "self.op(x)",
            "nn.BatchNorm1d(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)",
            ranks=(2, 3), shapes={2: [(16, 8)], 3: [(4, 8, 32)]}, aliases=["F.batch_norm", "torch.batch_norm"],
            notes="a fresh BatchNorm in eval mode is ~the identity (running mean 0, var 1): set non-trivial "
                  "running_mean/running_var in __init__, or call F.batch_norm(..., training=False) with buffers"),
    _module("nn.BatchNorm2d", "norm", "self.op = nn.BatchNorm2d(8)", "self.op(x)",
            "nn.BatchNorm2d(num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True)",
            ranks=(4,), shapes={4: [(2, 8, 16, 16)]}, aliases=["F.batch_norm", "torch.batch_norm"],
            notes="a fresh BatchNorm in eval mode is ~the identity (running mean 0, var 1): set non-trivial "
                  "running_mean/running_var in __init__, or call F.batch_norm(..., training=False) with buffers"),
    _module("nn.InstanceNorm2d", "norm", "self.op = nn.InstanceNorm2d(8)", "self.op(x)",
            "nn.InstanceNorm2d(num_features, eps=1e-5, affine=False)", ranks=(4,), shapes={4: [(2, 8, 16, 16)]},
            aliases=["F.instance_norm", "torch.instance_norm"]),
    _entry("F.normalize", "norm", "F.normalize(x, p=2.0, dim=-1)", "F.normalize(input, p=2.0, dim=1, eps=1e-12)"),
    # pooling and resampling
    _module("nn.MaxPool1d", "pooling", "self.op = nn.MaxPool1d(kernel_size=2, stride=2)", "self.op(x)",
            "nn.MaxPool1d(kernel_size, stride=None, padding=0, dilation=1)", ranks=(3,), shapes={3: [(4, 8, 64)]},
            aliases=["F.max_pool1d", "torch.max_pool1d"]),
    _module("nn.MaxPool2d", "pooling", "self.op = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)", "self.op(x)",
            "nn.MaxPool2d(kernel_size, stride=None, padding=0, dilation=1)", ranks=(4,), shapes={4: [(2, 8, 16, 16)]},
            aliases=["F.max_pool2d", "torch.max_pool2d"]),
    _module("nn.MaxPool3d", "pooling", "self.op = nn.MaxPool3d(kernel_size=2)", "self.op(x)",
            "nn.MaxPool3d(kernel_size, stride=None, padding=0, dilation=1)", ranks=(5,),
            shapes={5: [(2, 4, 8, 8, 8)]}, aliases=["F.max_pool3d", "torch.max_pool3d"]),
    _module("nn.AvgPool1d", "pooling", "self.op = nn.AvgPool1d(kernel_size=4, stride=2, padding=1)", "self.op(x)",
            "nn.AvgPool1d(kernel_size, stride=None, padding=0, count_include_pad=True)", ranks=(3,),
            shapes={3: [(4, 8, 64)]}, aliases=["F.avg_pool1d", "torch.avg_pool1d"]),
    _module("nn.AvgPool2d", "pooling", "self.op = nn.AvgPool2d(kernel_size=2)", "self.op(x)",
            "nn.AvgPool2d(kernel_size, stride=None, padding=0, count_include_pad=True)", ranks=(4,),
            shapes={4: [(2, 8, 16, 16)]}, aliases=["F.avg_pool2d"]),
    _module("nn.AdaptiveAvgPool2d", "pooling", "self.op = nn.AdaptiveAvgPool2d((4, 4))", "self.op(x)",
            "nn.AdaptiveAvgPool2d(output_size)", ranks=(4,), shapes={4: [(2, 8, 16, 16)]},
            aliases=["F.adaptive_avg_pool2d"]),
    _entry("F.interpolate", "pooling", "F.interpolate(x, scale_factor=2, mode='bilinear')",
           "F.interpolate(input, size=None, scale_factor=None, mode='nearest'|'bilinear'|..., align_corners=None)",
           ranks=(4,), shapes={4: [(2, 8, 16, 16)]}, aliases=["nn.Upsample"]),
    # scan
    _scan("torch.cumsum", "torch.cumsum(x, dim=-1)", "torch.cumsum(input, dim) -> Tensor"),
    _scan("torch.cumprod", "torch.cumprod(x, dim=-1)", "torch.cumprod(input, dim) -> Tensor",
          notes="running products of standard normals underflow fast: use inputs near 1 (1 + 0.05 * randn)"),
    _scan("torch.cummax", "torch.cummax(x, dim=-1).values", "torch.cummax(input, dim) -> (values, indices)"),
    _scan("torch.cummin", "torch.cummin(x, dim=-1).values", "torch.cummin(input, dim) -> (values, indices)"),
    _scan("torch.logcumsumexp", "torch.logcumsumexp(x, dim=-1)", "torch.logcumsumexp(input, dim) -> Tensor"),
    # loss (reduction='none' keeps one value per element/sample; a scalar loss makes "constant" outputs hard to reject)
    _loss("F.mse_loss", "F.mse_loss(x, y, reduction='none')", "F.mse_loss(input, target, reduction='mean')",
          module="nn.MSELoss"),
    _loss("F.l1_loss", "F.l1_loss(x, y, reduction='none')", "F.l1_loss(input, target, reduction='mean')",
          module="nn.L1Loss"),
    _loss("F.smooth_l1_loss", "F.smooth_l1_loss(x, y, reduction='none', beta=1.0)",
          "F.smooth_l1_loss(input, target, reduction='mean', beta=1.0)", module="nn.SmoothL1Loss"),
    _loss("F.huber_loss", "F.huber_loss(x, y, reduction='none', delta=1.0)",
          "F.huber_loss(input, target, reduction='mean', delta=1.0)", module="nn.HuberLoss"),
    _loss("F.cross_entropy", "F.cross_entropy(x, y, reduction='none')",
          "F.cross_entropy(input (N, C) logits, target (N,) int64 class indices, reduction='mean')",
          module="nn.CrossEntropyLoss", shapes={2: [(16, 10), (16,)]}, domains={"y": "int:10"},
          notes="integer targets come from torch.randint(0, C, (N,))"),
    _loss("F.nll_loss", "F.nll_loss(x, y, reduction='none')",
          "F.nll_loss(input (N, C) log-probabilities, target (N,) int64, reduction='mean')", module="nn.NLLLoss",
          shapes={2: [(16, 10), (16,)]}, domains={"x": "logprob", "y": "int:10"}),
    _loss("F.kl_div", "F.kl_div(x, y, reduction='none')",
          "F.kl_div(input log-probabilities, target probabilities, reduction='mean', log_target=False)",
          module="nn.KLDivLoss", domains={"x": "logprob", "y": "prob"},
          notes="input must be log-probabilities (log_softmax), target probabilities (softmax)"),
    _loss("F.binary_cross_entropy_with_logits", "F.binary_cross_entropy_with_logits(x, y, reduction='none')",
          "F.binary_cross_entropy_with_logits(input logits, target in [0, 1], reduction='mean')",
          module="nn.BCEWithLogitsLoss", domains={"y": "unit"}),
    # shape: data movement (a kernel's index arithmetic is the whole op)
    _shape("torch.Tensor.transpose", "x.transpose(-2, -1)", "Tensor.transpose(dim0, dim1) -> Tensor (a view)",
           ranks=(2, 3, 4, 5), methods=["transpose", "t", "swapaxes"], attrs=["T", "mT"]),
    _shape("torch.Tensor.permute", "x.permute(0, 2, 1)", "Tensor.permute(*dims) -> Tensor (a view)", ranks=(3,)),
    _shape("torch.Tensor.reshape", "x.reshape(x.shape[0], -1)", "Tensor.reshape(*shape) -> Tensor",
           ranks=(2, 3, 4, 5), methods=["reshape", "view"], aliases=["torch.Tensor.view"]),
    _shape("torch.flatten", "torch.flatten(x, 1)", "torch.flatten(input, start_dim=0, end_dim=-1) -> Tensor",
           ranks=(2, 3, 4, 5), aliases=["nn.Flatten"]),
    _shape("torch.cat", "torch.cat([x, y], dim=-1)", "torch.cat(tensors, dim=0) -> Tensor", inputs=("x", "y"),
           aliases=["torch.concat", "torch.concatenate"]),
    _shape("torch.stack", "torch.stack([x, y], dim=0)", "torch.stack(tensors, dim=0) -> Tensor", inputs=("x", "y")),
    _shape("torch.flip", "torch.flip(x, dims=[-1])", "torch.flip(input, dims) -> Tensor"),
    _shape("torch.roll", "torch.roll(x, shifts=1, dims=-1)", "torch.roll(input, shifts, dims=None) -> Tensor"),
    _shape("torch.chunk", "torch.chunk(x, 2, dim=-1)[0]", "torch.chunk(input, chunks, dim=0) -> tuple of Tensors",
           aliases=["torch.split", "torch.Tensor.split"], methods=["chunk", "split"]),
    _shape("F.pad", "F.pad(x, (1, 1))", "F.pad(input, pad, mode='constant', value=None) -> Tensor"),
    _shape("torch.gather", "torch.gather(x, -1, y)", "torch.gather(input, dim, index) -> Tensor",
           inputs=("x", "y"), ranks=(2, 3), shapes={2: [(16, 32), (16, 8)], 3: [(4, 16, 32), (4, 16, 8)]},
           domains={"y": "int:32"}),
    _shape("F.pixel_shuffle", "F.pixel_shuffle(x, 2)", "F.pixel_shuffle(input, upscale_factor) -> Tensor",
           ranks=(4,), shapes={4: [(2, 8, 16, 16)]}, aliases=["nn.PixelShuffle"]),
    _shape("torch.tril", "torch.tril(x)", "torch.tril(input, diagonal=0) -> Tensor", ranks=(2, 3, 4, 5)),
    _shape("torch.triu", "torch.triu(x, diagonal=1)", "torch.triu(input, diagonal=0) -> Tensor", ranks=(2, 3, 4, 5)),
    _module("nn.Embedding", "shape", "self.op = nn.Embedding(100, 32)", "self.op(x)",
            "nn.Embedding(num_embeddings, embedding_dim); forward: int64 indices -> rows of the table",
            ranks=(1, 2), shapes={1: [(64,)], 2: [(8, 16)]}, domains={"x": "int:100"}, aliases=["F.embedding"],
            dtypes=FLOATS, fanout=32),   # (an index becomes 32 values: scaled_shapes grows it 32x less)
]

BY_NAME = {e["name"]: e for e in CATALOG}
assert len(BY_NAME) == len(CATALOG), "duplicate catalog names"
assert all(e["kind"] in KINDS for e in CATALOG)


def lookup(api):
    """A catalog entry from an entry or a name (canonical or short, e.g. 'F.gelu' or 'nn.Conv2d')."""
    return api if isinstance(api, dict) else BY_NAME[_full(api)]


# -----------------------------------------------------------------------------
# Example modules: every entry rendered as a runnable KernelBench-format module (tests, synthetic generator)


def _input_expr(shape, domain, dtype):
    """Source of a get_inputs() tensor: torch.randn by default (never torch.rand for a generic input)."""
    dt = "" if dtype == "float32" else f", dtype=torch.{dtype}"
    shape = tuple(shape)
    if domain.startswith("int:"):
        return f"torch.randint(0, {int(domain[4:])}, {shape})"
    return {"normal": f"torch.randn({shape}{dt})",
            "positive": f"(torch.randn({shape}{dt}).abs() + 0.5)",
            "unit": f"torch.rand({shape}{dt})",
            "prob": f"torch.softmax(torch.randn({shape}{dt}), dim=-1)",
            "logprob": f"torch.log_softmax(torch.randn({shape}{dt}), dim=-1)"}[domain]


def scaled_shapes(entry, rank, elements):
    """The entry's example input shapes at `rank`, grown until the largest input holds about `elements` values (a
    power-of-two factor; 0 keeps them as they are). A GPU times a module reliably only above ~50 us of work, which
    the examples' few thousand values are far below. Matmuls grow every dimension (shared dimensions stay equal) to
    `elements` / 16 (a 1024 x 2048 operand: enough FLOPs; torch.outer: its output); the rest grow the leading
    (batch) dimension of every input when all inputs share it, since the module's __init__ (channels,
    normalized_shape) fixes the others. E.g. F.relu rank 2, 2**25: [16, 32] -> [1048576, 32]; torch.mm, 2**25:
    [32, 64] x [64, 48] -> [1024, 2048] x [2048, 1536]; nn.Conv2d rank 4 (channels fixed by __init__):
    [2, 8, 16, 16] -> [16384, 8, 16, 16]."""
    shapes = [list(s) for s in entry["example_shapes"][rank]]
    elements //= entry.get("fanout", 1)   # (values of output per input value, where far above 1: nn.Embedding)
    largest = max(math.prod(s) for s in shapes)
    if not elements or largest >= elements:
        return shapes
    if entry["kind"] == "matmul" and not entry["init"]:
        dims = max(len(s) for s in shapes)   # the largest input grows by f ** dims
        if dims == 1:   # torch.outer: its output (the product of the sizes) is what grows, by f ** 2
            largest, dims = math.prod(s[0] for s in shapes), 2
        f = 2 ** round(math.log2(max(elements / 16 / largest, 1)) / dims)
        return [[d * f for d in s] for s in shapes]
    if len({s[0] for s in shapes}) > 1:
        return shapes
    f = 2 ** int(math.log2(elements // largest))
    return [[s[0] * f] + s[1:] for s in shapes]


def on_meta(src):
    """(namespace, inputs) of a module source of our own making (a composition, a corpus module; never a proposed
    one: it is run here), get_inputs() run on the meta device: shapes and sizes, nothing allocated."""
    namespace = {}
    exec(compile(src, "<module>", "exec"), namespace)
    with torch.device("meta"):
        return namespace, [x for x in namespace["get_inputs"]() if isinstance(x, torch.Tensor)]


def example_module_source(api, rank=None, dtype="float32", elements=0):
    """A KernelBench-format module whose forward is just the API's call template on its example inputs: small, or
    with about `elements` values in its largest input (scaled_shapes)."""
    e = lookup(api)
    rank = e["ranks"][0] if rank is None else rank
    inputs = [_input_expr(s, e["domains"].get(n, "normal"), dtype)
              for n, s in zip(e["inputs"], scaled_shapes(e, rank, elements))]
    init = f"\n        {e['init']}" if e["init"] else ""
    cast = f"\n        self.to(torch.{dtype})" if e["init"] and dtype != "float32" else ""
    return (f'"""Example for {e["name"]} ({e["kind"]}), rank {rank}, {dtype}."""\n'
            "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"
            "class Model(nn.Module):\n"
            f"    def __init__(self):\n        super().__init__(){init}{cast}\n\n"
            f"    def forward(self, {', '.join(e['inputs'])}):\n        return {e['call']}\n\n\n"
            f"def get_inputs():\n    return [{', '.join(inputs)}]\n\n\n"
            "def get_init_inputs():\n    return []\n")


# -----------------------------------------------------------------------------
# Sampling API sets for the Proposer

# At most this many APIs of a kind per set, so that a set composes into one module (one GEMM or conv, one loss, ...).
KIND_CAPS = {"matmul": 1, "conv": 1, "loss": 1, "norm": 1, "pooling": 1, "scan": 1, "shape": 1, "reduction": 2}
HEAVY_KINDS = ("matmul", "conv")  # at most one of these in total


def _compatible(entry, chosen):
    """Can `entry` join the set `chosen`: kind caps, one heavy op, and a rank every API accepts."""
    kinds = [c["kind"] for c in chosen]
    if kinds.count(entry["kind"]) >= KIND_CAPS.get(entry["kind"], len(CATALOG)):
        return False
    if entry["kind"] in HEAVY_KINDS and any(k in HEAVY_KINDS for k in kinds):
        return False
    ranks = set(entry["ranks"])
    for c in chosen:
        ranks &= set(c["ranks"])
    return bool(ranks)


def sample_api_set(rng, k, weights=None):
    """k distinct, composable catalog entries drawn without replacement, P(api) proportional to weights[name].

    rng: random.Random (the only randomness, so a seed fixes the set); weights: {api name: weight >= 0}, names
    missing from it weigh 1.0, weight 0 is never drawn. Returns fewer than k entries only when no compatible API
    with positive weight is left.
    """
    weights = weights or {}
    chosen = []
    while len(chosen) < k:
        pool = [e for e in CATALOG if e not in chosen and _compatible(e, chosen)]
        w = [max(0.0, float(weights.get(e["name"], 1.0))) for e in pool]
        total = sum(w)
        if total <= 0:
            break
        r = rng.random() * total
        pick = max(i for i, wi in enumerate(w) if wi > 0)  # fallback for float round-off at the top end
        for i, wi in enumerate(w):  # inverse-CDF draw in catalog order: deterministic for a given rng state
            r -= wi
            if wi > 0 and r < 0:
                pick = i
                break
        chosen.append(pool[pick])
    return chosen


def render_api_set(apis):
    """Concise prompt text for a set: one line per API with an example call, its signature, ranks and notes.

    - torch.nn.functional.gelu: `F.gelu(x)` (elementwise_unary; F.gelu(input, approximate='none'|'tanh') -> Tensor;
      input rank 1-4)
    """
    lines = []
    for api in apis:
        e = lookup(api)
        how = f"`{e['init']}` in __init__, `{e['call']}` in forward" if e["init"] else f"`{e['call']}`"
        r = e["ranks"]
        ranks = f"{r[0]}-{r[-1]}" if len(r) > 1 and r == list(range(r[0], r[-1] + 1)) else ", ".join(map(str, r))
        note = f"; note: {e['notes']}" if e["notes"] else ""
        lines.append(f"- {e['name']}: {how} ({e['kind']}; {e['signature']}; input rank {ranks}{note})")
    return "\n".join(lines)


def render_examples(apis, elements=0):
    """One example module per API of a set, at a rank that every API of the set accepts, for the Proposer's prompt:
    a small model copies a call's argument shapes, dtypes and constructor far more reliably than it infers them from
    a signature (wrong ones are most of what the linter rejects)."""
    entries = [lookup(a) for a in apis]
    shared = sorted(set.intersection(*(set(e["ranks"]) for e in entries))) if entries else []
    rank = next((r for r in shared if r >= 2), shared[0] if shared else None)
    return "\n".join(f"```python\n{example_module_source(e, rank, elements=elements)}```" for e in entries)


# -----------------------------------------------------------------------------
# Source checks: which APIs a module uses, and a normalised hash for de-duplication


def _usage(src):
    """(dotted torch names, method names, operator names, attribute names) used outside get_inputs/get_init_inputs.

    Operators count only outside __init__ (`1.0 / math.sqrt(d)` there is scalar set-up, not a tensor op), and
    `self.norm(x)` is a submodule call, not the tensor method `norm`.
    """
    tree = ast.parse(src)
    aliases = import_aliases(tree)
    body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name in ("get_inputs", "get_init_inputs"))
            and not isinstance(n, (ast.Import, ast.ImportFrom))]
    in_init = {id(sub) for top in body for f in ast.walk(top) if isinstance(f, ast.FunctionDef) and f.name == "__init__"
               for sub in ast.walk(f)}
    names, methods, ops, attrs = set(), set(), set(), set()
    for node in (sub for top in body for sub in ast.walk(top)):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and id(node) not in in_init:
            ops.add(type(node.op).__name__)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            chain = name_chain(node.func)
            # a method on a tensor expression: x.sum(), (a * b).softmax(), self.weight.sum(); not self.op(x)
            if chain is None or (chain[0] not in aliases and chain[:1] != ["self"]) or len(chain) > 2:
                methods.add(node.func.attr)
        if isinstance(node, (ast.Attribute, ast.Name)):
            chain = name_chain(node)
            if chain and chain[0] in aliases:
                names.add(".".join([aliases[chain[0]]] + chain[1:]))
            elif isinstance(node, ast.Attribute):
                attrs.add(node.attr)
    return names, methods, ops, attrs


def module_uses_apis(module_src, apis):
    """Names of the APIs in `apis` (entries or names) that the module does NOT use; [] means every one is used.

    Counts any equivalent spelling: F.gelu / torch.nn.functional.gelu / nn.GELU / a `from ... import` alias,
    torch.sum / x.sum(), torch.matmul / x @ y, nn.Conv2d / F.conv2d. Only the model code counts (get_inputs and
    get_init_inputs are ignored: torch.randn there is input generation). A source that does not parse uses nothing.
    """
    entries = [lookup(a) for a in apis]
    try:
        names, methods, ops, attrs = _usage(module_src)
    except SyntaxError:
        return [e["name"] for e in entries]
    missing = []
    for e in entries:
        used = (bool(names & {e["name"], *e["aliases"]}) or bool(methods & set(e["methods"]))
                or bool(ops & set(e["operators"])) or bool(attrs & set(e["attrs"])))
        if not used:
            missing.append(e["name"])
    return missing


class _Normalise(ast.NodeTransformer):
    """Strips docstrings and annotations, resolves import aliases to dotted torch names, renames user identifiers.

    Names bound by the module (size globals, functions other than the KernelBench entry points, locals, arguments,
    self.<attribute>s) become v0, v1, ... in order of first appearance, so renaming a variable or an import alias,
    or editing comments and docstrings, leaves the hash unchanged.
    """
    KEEP = {"Model", "ModelNew", "get_inputs", "get_init_inputs", "forward", "__init__", "self", "super"}

    def __init__(self, aliases, bound, bound_attrs, ignore_constants):
        self.aliases, self.bound, self.bound_attrs, self.ignore_constants = aliases, bound, bound_attrs, ignore_constants
        self.names, self.attrs = {}, {}  # separate namespaces: `self.alpha = alpha` may become `self.a = alpha`

    def _rename(self, name):
        if name in self.KEEP or name not in self.bound:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def _rename_attr(self, name):
        if name not in self.bound_attrs:
            return name
        return self.attrs.setdefault(name, f"a{len(self.attrs)}")

    def _strip_docstring(self, node):
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    def visit_Module(self, node):
        self._strip_docstring(node)
        node.body = [n for n in node.body if not isinstance(n, (ast.Import, ast.ImportFrom))]
        return self.generic_visit(node)

    def visit_FunctionDef(self, node):
        self._strip_docstring(node)
        node.name = self._rename(node.name)
        node.returns = None
        return self.generic_visit(node)

    def visit_ClassDef(self, node):
        self._strip_docstring(node)
        return self.generic_visit(node)

    def visit_arg(self, node):
        node.arg = self._rename(node.arg)
        node.annotation = None
        return node

    def visit_AnnAssign(self, node):  # `y: torch.Tensor = expr` is `y = expr`
        if node.value is None:
            return None
        return self.visit(ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno))

    def visit_Name(self, node):
        if node.id in self.aliases:  # F -> torch.nn.functional, as a single dotted name
            return ast.copy_location(ast.Name(id=self.aliases[node.id], ctx=node.ctx), node)
        node.id = self._rename(node.id)
        return node

    def visit_Attribute(self, node):
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "self":
            node.attr = self._rename_attr(node.attr)
        elif isinstance(node.value, ast.Name) and node.value.id.startswith("torch"):  # fold torch.nn.functional.gelu
            return ast.copy_location(ast.Name(id=f"{node.value.id}.{node.attr}", ctx=node.ctx), node)
        return node

    def visit_Constant(self, node):
        if self.ignore_constants and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return ast.copy_location(ast.Constant(value=0), node)
        return node


def _dump(node):
    """ast.dump without the empty and None fields, so the text (and the hash) is the same on Python 3.11 and 3.12
    (3.12 added FunctionDef.type_params, an empty list in all our modules)."""
    if isinstance(node, ast.AST):
        fields = [(f, getattr(node, f, None)) for f in node._fields]
        return "(" + " ".join([type(node).__name__] + [f"{f}={_dump(v)}" for f, v in fields if v not in (None, [])]) + ")"
    if isinstance(node, list):
        return "[" + ", ".join(_dump(x) for x in node) + "]"
    return repr(node)


def normalized_source_hash(src, ignore_constants=False):
    """sha256 hex of the module's AST without docstrings, comments, annotations, import spellings and local names.

    Two modules that differ only in comments, docstrings, formatting, import aliases (F.gelu vs
    torch.nn.functional.gelu) or the names of their variables, arguments, attributes and size globals hash the same.
    ignore_constants=True also maps every numeric literal to 0, so the same module at other sizes hashes the same
    (use it to check that a generated module is not a held-out task with different sizes). Raises SyntaxError on
    source that does not parse.
    """
    tree = ast.parse(src)
    aliases = import_aliases(tree)
    bound, bound_attrs = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id == "self":
            bound_attrs.add(node.attr)
    bound -= set(aliases)
    tree = _Normalise(aliases, bound, bound_attrs, ignore_constants).visit(tree)
    return hashlib.sha256(_dump(tree).encode()).hexdigest()


if __name__ == "__main__":
    for kind in KINDS:
        group = [e for e in CATALOG if e["kind"] == kind]
        print(f"{kind} ({len(group)})")
        print(render_api_set(group))
    print(f"{len(CATALOG)} APIs; a sample set: {[e['name'] for e in sample_api_set(random.Random(0), 3)]}")
