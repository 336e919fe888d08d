"""
How KernelZero's models are asked, answer and get checked, in the order a phase runs: the ranks under torchrun and
this process's device and harness; the policies (a Policy holds the trained model with its AdamW state and the copy
that generates); the prompts; `rollout`, which samples completions and scores them with the trained model, giving the
log-probs that the CA-GRPO loss (kernelzero.py) takes; and `generate_and_verify`, which sends each generate call's
kernels to the harness while the next call generates.

How this departs from a plain transformers + TRL setup:
1. fp32 master weights train, a bf16 copy samples (on a GPU): small updates do not round away, and the sampler is
   refreshed in place after each update so that its compiled static-cache decode step stays valid.
2. The log-probs come from a separate forward pass of the trained model at the sampling temperature, never from
   generate's processed scores (as in TRL and verl); plain ancestral sampling (no top-p, no top-k) keeps them the
   sampler's own.
3. `TokenLogprobs` computes log_softmax(logits / t).gather(ids) with a hand-written backward that keeps no fp32
   vocabulary-sized tensor, and `sequence_logprobs` can run lm_head in checkpointed chunks: memory, not maths (the
   same values and gradients up to float rounding). Its forward gets a mask in which a left-pad query attends to
   every key instead of none (`padded_causal_mask`): transformers 5 leaves such rows empty, and some CUDA attention
   kernels return NaN for them, which then reaches every gradient.
4. Every generate call of a phase sees one shape (prompts padded to a bucket, completions to max_new_tokens, a short
   last batch padded), so the compiled decode step compiles once.
5. Generation and verification overlap: CUDA builds, worker start-up and input generation hide behind the next
   generate call, and candidates use the GPU only while this process does not (Evaluator.holding_gpus).
6. LoRA (cfg.lora_rank > 0) is written out here in a few lines (LoRALinear, add_lora) rather than taken from peft:
   the adapters train, the bf16 sampler stays a plain model that receives merged weights after each update, and the
   saved model is merged (see "LoRA" in the README).

kernelzero.py and evaluation.py import it; `python bench.py rollout` times `rollout` against plain
`model.generate`, and `python bench.py train` the update built on `sequence_logprobs`. `cfg` below is a
kernelzero.Config.
"""

import ast
import concurrent.futures
import contextlib
import copy
import math
import os
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torch.utils.checkpoint
from tqdm import tqdm

from eval_harness import Evaluator, KernelResult, extract_code
from models import load_model, set_attention

# -----------------------------------------------------------------------------
# Ranks (torchrun): one process per GPU, each with its share of a phase's rows; this process's device and harness
# Without torchrun there is no process group: world() is 1, my_rows() is every row, and the collectives below return
# their input, so a one-process run is the plain program.


def world():
    return dist.get_world_size() if dist.is_initialized() else 1


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def my_rows(n):
    """This rank's contiguous share of n rows (sizes differ by at most one): 10 rows on 4 ranks are 2, 3, 2, 3."""
    return slice(n * rank() // world(), n * (rank() + 1) // world())


def gather_rows(items):
    """Every rank's list, concatenated in rank order (the inverse of my_rows): all ranks get the whole batch's
    verdicts and texts, so group statistics, rewards and pool updates are those of a one-process run."""
    if world() == 1:
        return list(items)
    parts = [None] * world()
    dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def _reduce(values, op):
    if world() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64,
                     device="cuda" if dist.get_backend() == "nccl" else "cpu")   # (NCCL reduces GPU tensors only)
    dist.all_reduce(t, op=op)
    return t.tolist()


def all_sum(values):
    """[float] summed elementwise over ranks."""
    return _reduce(values, dist.ReduceOp.SUM)


def all_max(value):
    """The largest of every rank's float."""
    return _reduce([value], dist.ReduceOp.MAX)[0]


def barrier():
    if world() > 1:
        dist.barrier()


def microbatches(n, size):
    """Slices of `size` rows covering n rows, then None until this rank has as many as the rank with the most:
    FSDP2 gathers weights in every forward and reduces gradients in every backward, so every rank must run the same
    number of them (a None runs a row with weight 0). One process: the plain slices."""
    own = [slice(i, i + size) for i in range(0, n, size)]
    most = int(all_max(len(own)))
    return own + [None] * (most - len(own))


def say(*args, **kwargs):
    """print on rank 0 only: one console, however many ranks."""
    if rank() == 0:
        print(*args, **kwargs)


def resolve_device(cfg):
    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda but no GPU is visible; use --device cpu (and --backend triton)")
    return torch.device(cfg.device)


def setup_ranks(cfg):
    """This process's device. Under torchrun (it sets LOCAL_RANK, RANK, WORLD_SIZE): one GPU per rank and NCCL, or
    gloo for ranks on the CPU (the tests); a collective waits at most cfg.dist_timeout_s, so a rank that died or
    hangs ends the job with an error instead of a hang. Without torchrun: resolve_device, no process group."""
    device = resolve_device(cfg)
    if "LOCAL_RANK" not in os.environ or dist.is_initialized():
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=timedelta(seconds=cfg.dist_timeout_s))
    return device


def open_evaluator(cfg, harness_device, device, **opts):
    """The harness for this process: every GPU without torchrun, this rank's own GPU under it (timing stays fair per
    GPU), and the CPU cores shared out between the ranks."""
    workers = cfg.eval_workers or (None if world() == 1 else max(1, len(os.sched_getaffinity(0)) // world()))
    gpus = [device.index] if device.index is not None else None
    return Evaluator(backend=cfg.backend, device=harness_device, cpu_workers=workers, gpus=gpus,
                     gpu_workers=cfg.gpu_workers, **opts)


def harness_device_for(cfg, device):
    if cfg.backend == "cuda" and not torch.cuda.is_available():
        raise SystemExit("the CUDA backend needs a GPU: pass --backend triton to run Triton kernels under the interpreter")
    return "cuda" if torch.cuda.is_available() and device.type == "cuda" else "cpu"


# -----------------------------------------------------------------------------
# Policies
# A policy is the trained fp32 model with its AdamW state, plus (on a GPU) a bf16 copy that samples: fp32
# master weights keep small updates from rounding away, the bf16 sampler keeps static-cache decoding fast and simple.
# With cfg.lora_rank > 0 the trained weights are LoRA adapters on a frozen model (below).


@dataclass
class Policy:
    model: torch.nn.Module  # trained weights (fp32)
    tok: object  # its tokenizer (left padding)
    opt: torch.optim.Optimizer  # AdamW over model's trained parameters (all of them, or the LoRA adapters)
    sampler: torch.nn.Module  # generates: a bf16 copy on a GPU, the model itself on a CPU (a copy under torchrun)
    ref: torch.nn.Module | None  # frozen initial weights for the k3 KL penalty, only when kl_coef > 0
    source: str = ""  # the model it was loaded from (a LoRA adapter is only valid on this base)


# LoRA (Hu et al. 2021, arXiv:2106.09685): each nn.Linear in the decoder blocks gets a trained low-rank correction
# and everything else is frozen. What it buys here: AdamW state for ~1% of the weights instead of all of them, and a
# run's whole trained state in tens of megabytes, so that a run can stop on one machine and resume on another that
# has the same base weights.
# "LoRA Without Regret" (Schulman et al., Thinking Machines Lab, 2025) found policy-gradient RL with LoRA as
# sample-efficient as full fine-tuning even at rank 1, provided every layer is adapted (the MLPs too) and the
# learning rate is about 10x full fine-tuning's.


class LoRALinear(torch.nn.Module):
    """y = base(x) + (alpha / r) * x A^T B^T with base frozen; A (r, in) starts random, B (out, r) at zero, so the
    wrapped model computes exactly what the base model did until the first update (Hu et al. 2021, section 4.1)."""

    def __init__(self, base, rank, alpha, generator=None):
        super().__init__()
        self.base = base.requires_grad_(False)
        a = torch.empty(rank, base.in_features)
        torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)   # nn.Linear's init, as peft's
        self.lora_a = torch.nn.Parameter(a.to(base.weight.device))
        self.lora_b = torch.nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank

    def forward(self, x):
        return self.base(x) + (x @ self.lora_a.t() @ self.lora_b.t()) * self.scale


def add_lora(model, rank, alpha, seed=0):
    """Freeze model and wrap every nn.Linear inside its decoder blocks (attention and MLP projections; not the
    embeddings or lm_head) in a LoRALinear, in place. A is drawn from a generator seeded with `seed`, so every rank
    under torchrun builds the same adapters (FSDP2 shards what each rank holds; it does not broadcast)."""
    model.requires_grad_(False)
    generator = torch.Generator().manual_seed(seed)
    blocks = [m for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]   # (Qwen2DecoderLayer, ...)
    for block in blocks:
        for name, module in list(block.named_modules()):
            if isinstance(module, torch.nn.Linear):
                parent, _, leaf = name.rpartition(".")
                setattr(block.get_submodule(parent), leaf, LoRALinear(module, rank, alpha, generator))
    return model


def adapters(model):
    """{module name: LoRALinear} of a model ({} without LoRA)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, LoRALinear)}


def trained_names(model):
    """The state-dict keys a checkpoint of this model holds: every key but the frozen parameters' (with LoRA: the
    adapters; without: everything)."""
    frozen = {n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}
    return [k for k in model.state_dict() if k not in frozen]


def check_keys(saved, model, what):
    """SystemExit with one clear line when a saved state dict does not hold exactly what this model trains (a LoRA
    checkpoint on a full fine-tuning run, another rank, another model)."""
    want, have = set(trained_names(model)), set(saved)
    if want != have:
        lora = adapters(model)
        kind = f"LoRA rank {next(iter(lora.values())).rank} adapters" if lora else "all weights (no LoRA)"
        missing, unknown = sorted(want - have), sorted(have - want)
        why = ([f"{len(missing)} of this run's keys are missing (e.g. {missing[0]})"] if missing else []) + \
              ([f"{len(unknown)} keys are not this run's (e.g. {unknown[0]})"] if unknown else [])
        raise SystemExit(f"{what} cannot be loaded into this run, which trains {kind}: {'; '.join(why)}. Pass the "
                         f"--lora-rank and the model it was written with")


def lora_merge(weight, a, b, scale):
    """W + scale B A in W's dtype: the plain weight that computes what a LoRALinear does."""
    return weight + (scale * (b.float() @ a.float())).to(weight.dtype)


def merged_state_dict(state, scale):
    """A LoRA model's whole state dict as the plain model's: W + scale B A (scale = alpha / r) for each adapted weight,
    under the plain model's key (".q_proj.base.weight" -> ".q_proj.weight"), the adapters dropped (a model without
    adapters: unchanged). E.g. W = [[1, 0], [0, 1]], A = [[1, 2]], B = [[1], [0]], scale 0.5:
    W + 0.5 [[1, 2], [0, 0]] = [[1.5, 1], [0, 1]]."""
    adapted = {k[:-len(".lora_a")] for k in state if k.endswith(".lora_a")}
    out = {}
    for key, value in state.items():
        prefix, _, leaf = key.rpartition(".base.")
        if prefix in adapted:
            if leaf == "weight":
                value = lora_merge(value, state[prefix + ".lora_a"], state[prefix + ".lora_b"], scale)
            out[f"{prefix}.{leaf}"] = value
        elif not key.endswith((".lora_a", ".lora_b")):
            out[key] = value
    return out


def wrap_policy(model, tok, cfg, lr, device, adapter=None, source=""):
    """A Policy around a loaded (model, tokenizer): on `device`, with AdamW, a bf16 sampler on a GPU, a KL reference.
    With cfg.lora_rank > 0 the model gets LoRA adapters (their values from `adapter`, a state dict, when given) and
    AdamW trains only them. Under torchrun the trained model is sharded across the ranks with FSDP2 (each keeps a
    slice of the weights, gradients and AdamW state; a 7B Coder fits 8 GPUs so), and every rank samples from a whole
    copy of its own."""
    model.to(device)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    sampler = model
    if device.type == "cuda":   # (made before the adapters: the sampler is a plain model that gets merged weights)
        sampler = copy.deepcopy(model).to(torch.bfloat16).eval().requires_grad_(False)
    elif dist.is_initialized():   # (ranks generate different lengths: a sharded sampler would wait for the others)
        sampler = copy.deepcopy(model).eval().requires_grad_(False)
    if cfg.attention != "sdpa":
        set_attention(sampler, cfg.attention)
    if cfg.lora_rank > 0:
        add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.seed)
        if adapter is not None:
            check_keys(adapter, model, f"the adapter of {source}")
            model.load_state_dict(adapter, strict=False)
    ref = None
    if cfg.kl_coef > 0:   # (after the adapter: the reference is the model the run starts from)
        ref = copy.deepcopy(model).eval().requires_grad_(False)
    if dist.is_initialized():
        shard_model(model, device)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=cfg.weight_decay)
    policy = Policy(model, tok, opt, sampler, ref, source)
    if adapter is not None:
        refresh_sampler(policy)
    return policy


def shard_model(model, device):
    """FSDP2 (torch.distributed.fsdp.fully_shard), the way PyTorch's own recipes apply it: each transformer block is
    one unit (its weights gathered just before it runs, its gradients reduce-scattered right after), and the root
    holds the rest (embeddings, final norm, lm_head, tied or not). Frozen weights (LoRA's base) are sharded too."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (world(),))
    for block in model.modules():
        if type(block).__name__.endswith("DecoderLayer"):   # (Qwen2DecoderLayer, LlamaDecoderLayer, ...)
            fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def _whole(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t   # (FSDP2: gather the shards)


def optimizer_step(policy, max_norm):
    """Clip the gradients to max_norm, then take the AdamW step unless their norm is not finite: a NaN or inf
    gradient would reach every weight through the clip factor (max_norm / NaN) and AdamW's moments, so that step is
    skipped and the run goes on (verl's actor does the same). Returns the pre-clip norm (all ranks' under FSDP2)."""
    norm = float(_whole(torch.nn.utils.clip_grad_norm_(policy.model.parameters(), max_norm)))   # (frozen: no grad)
    if math.isfinite(norm):
        policy.opt.step()
    else:
        say(f"warning: non-finite gradient norm ({norm}); this optimizer step was skipped")
    return norm


def read_adapter(path, base, cfg):
    """The LoRA adapter (a state dict) that save_pretrained_atomic wrote next to the merged model in path, after
    checking that it belongs to this base model and rank."""
    file = os.path.join(path, "adapter.pt")
    if not os.path.exists(file):
        raise SystemExit(f"{path} has no adapter.pt: it was not trained with LoRA (delete it, or run without "
                         f"--lora-rank)")
    saved = torch.load(file, map_location="cpu")
    if (saved["base"], saved["lora_rank"], saved["lora_alpha"]) != (base, cfg.lora_rank, cfg.lora_alpha):
        raise SystemExit(f"{file} adapts {saved['base']!r} at rank {saved['lora_rank']} (alpha "
                         f"{saved['lora_alpha']}), this run {base!r} at rank {cfg.lora_rank} (alpha {cfg.lora_alpha})")
    return saved["state"]


def make_policy(name, cfg, lr, device, sft_path=None):
    """The Policy of model `name`, or of its SFT checkpoint in sft_path: the merged model, or with LoRA the base model
    `name` plus the adapter that SFT trained (training goes on in the same adapter)."""
    if sft_path is None:
        return wrap_policy(*load_model(name, cfg.seed), cfg, lr, device, source=name)
    if cfg.lora_rank > 0:
        adapter = read_adapter(sft_path, name, cfg)
        return wrap_policy(*load_model(name, cfg.seed), cfg, lr, device, adapter=adapter, source=name)
    return wrap_policy(*load_model(sft_path, cfg.seed), cfg, lr, device, source=sft_path)


@torch.no_grad()
def refresh_sampler(policy):
    """Copy the freshly updated weights into the bf16 sampler in place (static addresses keep compiled decode valid).
    With LoRA only the adapted weights change, and each arrives merged: W + (alpha / r) B A."""
    if policy.sampler is policy.model:
        return
    lora = adapters(policy.model)
    if lora:
        for name, m in lora.items():
            merged = lora_merge(_whole(m.base.weight), _whole(m.lora_a), _whole(m.lora_b), m.scale)
            policy.sampler.get_submodule(name).weight.copy_(merged)
    else:
        for p_s, p in zip(policy.sampler.parameters(), policy.model.parameters()):
            p_s.copy_(_whole(p))


def place(policy, device):
    """Move a policy (weights, sampler, reference, AdamW state) to device: with offload_idle the idle one waits on CPU."""
    for m in {id(m): m for m in (policy.model, policy.sampler, policy.ref) if m is not None}.values():
        m.to(device)
    for st in policy.opt.state.values():
        for k, v in st.items():
            if torch.is_tensor(v) and k != "step":  # AdamW keeps its step counter on the CPU
                st[k] = v.to(device)


def focus(active, idle, cfg, device):
    """Make `active` the policy on the device; the other one goes to CPU memory when cfg.offload_idle."""
    if cfg.offload_idle and device.type == "cuda":
        place(idle, torch.device("cpu"))
        place(active, device)


def autocast(device):
    # bf16 autocast for training forwards on a GPU; a no-op on the CPU (the tiny model runs in fp32)
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")



# -----------------------------------------------------------------------------
# Prompts: what the Coder and the Proposer are asked


HERE = os.path.dirname(os.path.abspath(__file__))

BACKEND_RULES = {
    "triton": ("Write Triton kernels (`import triton`, `import triton.language as tl`, `@triton.jit`) and launch them "
               "from ModelNew.forward. fp32 `tl.dot` must pass `input_precision=\"ieee\"` (TF32 misses the 1e-4 "
               "tolerance)."),
    "cuda": ("Write CUDA kernels as strings compiled with `torch.utils.cpp_extension.load_inline` and call them from "
             "ModelNew.forward. Launch them on PyTorch's current stream (`c10::cuda::getCurrentCUDAStream()`, from "
             "`<c10/cuda/CUDAStream.h>`)."),
}


def read_one_shot(backend):
    """(reference, solution) sources of the one-shot example in cuda_ext/, or None when the files are missing."""
    paths = [os.path.join(HERE, "cuda_ext", f"example_{n}.py") for n in ("ref", backend)]
    if not all(os.path.exists(p) for p in paths):
        return None
    sources = []
    for p in paths:  # without the file's docstring, which talks about the prompt rather than the kernel
        src = open(p).read()
        tree = ast.parse(src)
        if ast.get_docstring(tree):
            src = "\n".join(src.splitlines()[tree.body[0].end_lineno:])
        sources.append(src)
    return tuple(sources)


def coder_prompt(module_src, backend, one_shot=True):
    """KernelBench-style prompt: an optional one-shot example, the rules, then the module to optimise."""
    parts = [f"You write fast, correct {backend.upper()} kernels for PyTorch modules. Replace the computation of the "
             f"given Model with your own {backend} kernels in a new module named ModelNew (same constructor arguments "
             f"and forward signature, same outputs)."]
    example = read_one_shot(backend) if one_shot else None
    if example:
        parts.append(f"Example. Given this module:\n```python\n{example[0].strip()}\n```\n"
                     f"a good answer is:\n```python\n{example[1].strip()}\n```")
    parts.append("Rules: answer with exactly one ```python block that defines ModelNew; compute the whole forward pass "
                 "in your own kernels (no PyTorch fallback for the computation); keep outputs within 1e-4 of the "
                 "reference in fp32. " + BACKEND_RULES[backend])
    parts.append(f"Now write ModelNew for this module:\n```python\n{module_src.strip()}\n```")
    return "\n\n".join(parts)


def proposer_prompt(api_text, examples=""):
    """Ask for one KernelBench-format task built from the given APIs (rendered by catalog.render_api_set), with each
    API's example module on its own (catalog.render_examples) when given."""
    shown = (f"Each operation on its own, with inputs of a good size:\n{examples}\n\nCompose them into ONE new module "
             "(not a copy of an example).\n") if examples else ""
    return ("Write a PyTorch module that a GPU kernel engineer will be asked to optimise. It must use every one of "
            f"these operations:\n{api_text}\n\n{shown}"
            "Format (KernelBench): `import torch`, `import torch.nn as nn`; module-level size constants; "
            "`class Model(nn.Module)` with `__init__` and `forward`; `get_inputs()` returning a list of CPU tensors "
            "made with torch.randn (not torch.rand: ReLU of [0,1) inputs is the identity); `get_init_inputs()` "
            "returning the constructor arguments.\n"
            "Quality rules: deterministic in eval mode; the output must not be zero, constant, the input or its mean; "
            "at most 512 MB of inputs; about 2-16M elements for elementwise work, 1024-2048 for matmul sides; "
            "fp32 unless an operation needs integers.\n"
            "Answer with exactly one ```python block.")


# -----------------------------------------------------------------------------
# Rollouts


def completion_mask(completion_ids, eos_ids):
    """(B, T) ids -> (B, T) float mask: 1 up to and including the first stop token, 0 after; no stop token -> all 1.

    [x, y, EOS, pad, pad] -> [1, 1, 1, 0, 0]   (the EOS is a sampled action, so it is trained on)
    [x, y, z, w, v]       -> [1, 1, 1, 1, 1]   (truncated: every token counts)
    """
    is_stop = torch.isin(completion_ids, torch.as_tensor(eos_ids, device=completion_ids.device))  # (B, T)
    T = completion_ids.shape[1]
    first = torch.where(is_stop.any(1), is_stop.float().argmax(1), torch.full_like(is_stop[:, 0], T, dtype=torch.long))
    return (torch.arange(T, device=completion_ids.device)[None, :] <= first[:, None]).float()


# config fields with which a causal LM scales or soft-caps lm_head's output (Gemma 2, Cohere, Granite): the chunked
# log-probs below apply lm_head alone, so such models take the unchunked path
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


class TokenLogprobs(torch.autograd.Function):
    """log_softmax(logits / t).gather(ids) with a hand-written backward, one position slice at a time:
    d logp(y) / d logits = (onehot(y) - softmax(logits / t)) / t, the softmax recomputed from the saved log-sum-exp."""

    @staticmethod
    def forward(ctx, logits, targets, t, piece):
        B, T, V = logits.shape
        lse = torch.empty(B, T, dtype=torch.float32, device=logits.device)  # (B, T)
        picked = torch.empty_like(lse)  # (B, T): logit of the sampled id / t
        step = max(1, piece // (B * V))  # positions per fp32 piece
        for s in range(0, T, step):
            x = logits[:, s:s + step].float() / t  # (B, step, V) fp32, freed after this iteration
            lse[:, s:s + step] = torch.logsumexp(x, -1)
            picked[:, s:s + step] = x.gather(-1, targets[:, s:s + step, None]).squeeze(-1)
        ctx.save_for_backward(logits, targets, lse)
        ctx.t, ctx.step = t, step
        return picked - lse

    @staticmethod
    def backward(ctx, grad):  # grad (B, T): d loss / d logp
        logits, targets, lse = ctx.saved_tensors
        out = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)  # (B, T, V), the logits' dtype
        for s in range(0, logits.shape[1], ctx.step):
            g = grad[:, s:s + ctx.step, None].float()  # (B, step, 1)
            d = torch.exp(logits[:, s:s + ctx.step].float() / ctx.t - lse[:, s:s + ctx.step, None]).mul_(-g)
            d.scatter_add_(-1, targets[:, s:s + ctx.step, None], g)  # + g at the sampled id: (onehot - softmax) * g
            out[:, s:s + ctx.step] = d.div_(ctx.t)
        return out, None, None, None


def token_logprobs(logits, targets, temperature, piece=2**26):
    """(B, T, V) logits, (B, T) ids -> (B, T) fp32 log-probs of the ids under logits / temperature (0 counts as 1).

    The plain expression, x = logits.float() / temperature; x.gather(-1, ids) - x.logsumexp(-1), makes autograd keep
    the fp32 copy and build more (B, T, V) fp32 tensors in backward (softmax, the gather's scatter, their sum): at
    Qwen2.5's V = 151,936, B = 8, T = 768 that is 3.7 GB each. TokenLogprobs computes the same numbers keeping only
    the logits as they came (bf16 under autocast) and the (B, T) log-sum-exp, in fp32 pieces of <= `piece` elements.
    """
    return TokenLogprobs.apply(logits, targets, temperature if temperature > 0 else 1.0, piece)


# attentions that take a (B, 1, q, L) bool mask as given (transformers' "sdpa" and models.sdpa_gqa_attention)
BOOL_MASK_ATTENTIONS = ("sdpa", "sdpa_gqa")


def padded_causal_mask(attention_mask):
    """(B, L) 0/1 padding mask -> (B, 1, L, L) bool attention mask (True: may attend): causal over real keys, and a
    pad query attends to every key.

    transformers' own mask leaves a left-pad query with no key at all (causal and padding together exclude every
    one), and since transformers 5 nothing repairs such rows. Some CUDA SDPA kernels return NaN for a query with no
    key, in the forward or in its backward, and the next layer's 0 * NaN carries it into real tokens and every
    weight's gradient (pytorch/pytorch#103749 and #110213, huggingface/transformers#38690). A pad query's output is
    never read and a pad key stays masked for real queries, so real tokens' log-probs are unchanged.
    """
    keep = attention_mask.bool()  # (B, L)
    L = keep.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=keep.device).tril()  # (L, L): query i sees keys <= i
    mask = (causal & keep[:, None, :]) | ~keep[:, :, None]  # (B, L, L): real keys only; pad queries see all
    return mask[:, None]


def sequence_logprobs(model, input_ids, attention_mask, n_completion, temperature, chunk=0):
    """(B, L) prompt+completion -> (B, T) log-probs of the last T = n_completion tokens under logits / temperature.

    A separate forward pass, never generate's processed scores (TRL/verl do the same): sampling used the same
    temperature, so these are the log-probs of the distribution that was actually sampled.
    chunk (0 < chunk < T): the transformer body runs once, then lm_head and the log-softmax run on `chunk`
    completion positions at a time, each inside a non-reentrant activation checkpoint, so only (B, chunk, V) logits
    exist at once instead of (B, T, V) (Qwen2.5's V = 151,936: at B = 8, T = 768 that is 1.9 GB in bf16); backward
    recomputes one chunk's logits (a third more lm_head FLOPs on completion tokens; BENCHMARKS.md, "The 1.5B-shaped
    update", has the memory and time).
    Same values and gradients up to float rounding. This assumes logits = lm_head(final hidden state), true for
    Llama, Qwen2 and SmolLM2 (tied lm_head included: the tied weight gets both gradients as usual); a model whose
    config names a logit scale or soft-cap (LOGIT_POSTPROCESSING) takes the unchunked path.
    The forward gets padded_causal_mask's 4D mask when its attention takes one (BOOL_MASK_ATTENTIONS), so no CUDA
    kernel sees a query without keys.
    """
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # left padding: positions start at the first token
    targets = input_ids[:, -n_completion:]
    if getattr(model.config, "_attn_implementation", None) in BOOL_MASK_ATTENTIONS and not attention_mask.all():
        # (B, 1, L, L): no query row without a key. (Without padding transformers passes no mask at all, and SDPA
        # can take its causal fast path: left as it is.)
        attention_mask = padded_causal_mask(attention_mask)
    if chunk <= 0 or chunk >= n_completion or any(getattr(model.config, k, None) for k in LOGIT_POSTPROCESSING):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False,
                       logits_to_keep=n_completion + 1).logits[:, :-1]  # (B, T, V): position t predicts token t + 1
        return token_logprobs(logits, targets, temperature)
    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                                 use_cache=False).last_hidden_state[:, -n_completion - 1:-1]  # (B, T, H), normed
    head = model.get_output_embeddings()

    def piece(h, t):
        return token_logprobs(head(h), t, temperature)
    out = []
    for s in range(0, n_completion, chunk):
        h, t = hidden[:, s:s + chunk], targets[:, s:s + chunk]
        # without grad (old and reference log-probs) there is nothing to recompute: plain call
        out.append(torch.utils.checkpoint.checkpoint(piece, h, t, use_reentrant=False) if torch.is_grad_enabled()
                   else piece(h, t))
    return torch.cat(out, 1)


def stop_ids(tok):
    ids = {tok.eos_token_id}
    for t in ("<|im_end|>", "<|endoftext|>"):  # chat models end a turn with either
        i = tok.convert_tokens_to_ids(t)
        if isinstance(i, int) and tok.convert_ids_to_tokens(i) == t:  # really in the vocabulary, not <unk>
            ids.add(i)
    return sorted(i for i in ids if i is not None)


def chat(tok, text):
    """The user turn in the tokenizer's chat template when it has one, else the raw text."""
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return text


@torch.no_grad()
def rollout(model, tok, prompts, cfg, sampler=None, desc="generate", gpu_turn=contextlib.nullcontext, on_chunk=None,
            rows=None, seed=None):
    """Sample one completion per prompt (repeat a prompt for a group) and score it with the training model.

    All prompts of a phase are padded (left) to one bucketed length P and completions to max_new_tokens T, so every
    generate call and every training forward sees the same shapes. Returns a dict:
      completions (list[str]), input_ids (N, P+T), attention_mask (N, P+T), completion_mask (N, T),
      old_logprobs (N, T) from `model`, timing {gen_s, logprob_s, new_tokens, tokens_per_s}
    gpu_turn() is entered around every generate call and the scoring pass (Evaluator.holding_gpus: no candidate runs
    on the GPU meanwhile); on_chunk(start, texts) gets each generate call's completions as soon as they exist.
    rows (a slice): generate only those prompts (this rank's share, my_rows), padded like the whole list, so that a
    prompt's tokens do not depend on the number of ranks. seed: each generate call samples from torch's generator
    seeded with seed + the index of its first prompt in the whole list: a run is reproducible, and N ranks whose
    shares are whole generate batches sample exactly what one process does.
    """
    sampler = sampler if sampler is not None else model
    device = next(model.parameters()).device
    T = cfg.max_new_tokens
    enc = tok([chat(tok, p) for p in prompts], return_tensors="pt", padding=True, truncation=True,
              max_length=cfg.max_prompt_tokens, pad_to_multiple_of=cfg.prompt_bucket)
    rows = rows or slice(0, len(prompts))
    enc_ids, enc_mask = enc.input_ids[rows], enc.attention_mask[rows]   # (N, P) this rank's rows
    stops = stop_ids(tok)
    gen_kwargs = dict(max_new_tokens=T, eos_token_id=stops, pad_token_id=tok.pad_token_id)
    if cfg.temperature > 0:  # plain ancestral sampling: no top-p/top-k, so the log-probs below are the sampler's own
        gen_kwargs.update(do_sample=True, temperature=cfg.temperature, top_p=1.0, top_k=0)
    else:  # greedy (temperature 0): deterministic, for evaluation and for checking the compiled path
        gen_kwargs.update(do_sample=False)
    if cfg.static_cache and device.type == "cuda":
        # transformers compiles the decode step for a static cache (CompileConfig defaults: dynamic=None,
        # mode="reduce-overhead"): the first shape (batch B, cache length P + T) compiles static, a second one
        # recompiles with the changed dims symbolic (torch._dynamo's automatic_dynamic_shapes), which is slow:
        # pad_batches keeps B fixed and prompt_bucket limits the values P takes
        gen_kwargs["cache_implementation"] = "static"
    t0 = time.perf_counter()
    sampler.eval()
    chunks, masks, texts = [], [], []
    B = cfg.gen_batch_size
    starts = range(0, len(enc_ids), B)
    lean = getattr(cfg, "lean_rollouts", False)
    # progress: on a GPU one step per generate call; on the CPU, where one call takes minutes, one step per token
    per_token = device.type == "cpu" and rank() == 0
    bar = tqdm(total=len(starts) * T if per_token else len(starts), desc=f"{desc} ({len(enc_ids)} x <= {T} tokens)",
               leave=False, disable=rank() > 0 or (not per_token and len(starts) < 2))
    if per_token:
        gen_kwargs["stopping_criteria"] = token_ticks(bar)
    for i in starts:
        ids, mask = enc_ids[i:i + B], enc_mask[i:i + B]
        n = ids.shape[0]
        if cfg.pad_batches and n < B:
            # a smaller last batch would be a new compiled shape: fill it with copies of its last prompt, whose
            # outputs are dropped (greedy copies stop with their original; sampled ones may run a few steps longer)
            ids, mask = (torch.cat([x, x[-1:].expand(B - n, -1)]) for x in (ids, mask))
        if seed is not None:
            torch.manual_seed(seed + rows.start + i)
        with gpu_turn():
            out = sampler.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                   **gen_kwargs)[:n, ids.shape[1]:]
        if per_token:   # (the bar's count for this call: a call stops when all its answers have)
            bar.n = (starts.index(i) + 1) * T
            bar.refresh()
        else:
            bar.update(1)
        chunks.append(F.pad(out, (0, T - out.shape[1]), value=tok.pad_token_id))  # generate stops when all finished
        masks.append(completion_mask(chunks[-1], stops))
        texts += tok.batch_decode(chunks[-1] * masks[-1].long() + tok.pad_token_id * (1 - masks[-1].long()),
                                  skip_special_tokens=True, clean_up_tokenization_spaces=False)
        if on_chunk:
            on_chunk(i, texts[i:])
    bar.close()
    empty = torch.zeros(0, T, dtype=torch.long, device=device)   # (a rank with no rows: more ranks than prompts)
    completion_ids, cmask = torch.cat(chunks or [empty]), torch.cat(masks or [empty.float()])  # (N, T) each
    if lean and len(cmask):   # the longest answer's length instead of T: every forward after this is shorter
        T = max(int(cmask.sum(1).max()), 1)
        completion_ids, cmask = completion_ids[:, :T], cmask[:, :T]
    gen_s = time.perf_counter() - t0
    input_ids = torch.cat([enc_ids.to(device), completion_ids], 1)  # (N, P+T)
    attention_mask = torch.cat([enc_mask.to(device), torch.ones_like(completion_ids)], 1)
    t0 = time.perf_counter()
    model.eval()
    if lean:   # no scoring pass: policy_update takes the old log-probs from its own forward (ppo_epochs 1: ratio 1)
        return dict(completions=texts, input_ids=input_ids, attention_mask=attention_mask, completion_mask=cmask,
                    old_logprobs=None, timing=dict(gen_s=gen_s, logprob_s=0.0, new_tokens=int(cmask.sum()),
                                                   tokens_per_s=int(cmask.sum()) / max(gen_s, 1e-9)))
    old = [torch.zeros(0, T, device=device)]
    pad_row = torch.full((1, input_ids.shape[1]), tok.pad_token_id, device=device)
    for sl in microbatches(len(input_ids), cfg.micro_batch):
        ids, mask = (input_ids[sl], attention_mask[sl]) if sl else (pad_row, torch.ones_like(pad_row))
        with gpu_turn(), autocast(device):
            # the update's own chunking: the old and new log-probs round alike, so the first ratio is 1
            logp = sequence_logprobs(model, ids, mask, T, cfg.temperature, cfg.logprob_chunk)
        if sl:   # (None: the other ranks' forward needed this one's part of the weights; the output is dropped)
            old.append(logp)
    logprob_s = time.perf_counter() - t0
    new_tokens = int(cmask.sum())
    return dict(completions=texts, input_ids=input_ids, attention_mask=attention_mask, completion_mask=cmask,
                old_logprobs=torch.cat(old), timing=dict(gen_s=gen_s, logprob_s=logprob_s, new_tokens=new_tokens,
                                                         tokens_per_s=new_tokens / max(gen_s, 1e-9)))


# -----------------------------------------------------------------------------
# Verification: the harness's verdicts on a phase's answers


def token_ticks(bar):
    """generate's stopping criteria that never stop: they move a progress bar one token per decode step."""
    from transformers import StoppingCriteria, StoppingCriteriaList   # (imported where used: the CLI starts without)

    class Ticks(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            bar.update(1)
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    return StoppingCriteriaList([Ticks()])


def run_kernels(ev, refs, completions):
    """Harness results in order; an answer without a ```python block is a `format` failure without a harness call."""
    codes = [extract_code(c) for c in completions]
    done = iter(ev.map([(r, c) for r, c in zip(refs, codes) if c is not None]) if any(codes) else [])
    return [next(done) if c is not None else
            KernelResult(compiled=False, correct=False, error_kind="format", error="no ```python block in the answer")
            for c in codes]


@contextlib.contextmanager
def timed(times, key):
    """`with timed(times, "coder_gen"):` adds the block's wall time in seconds to times["coder_gen"]."""
    t0 = time.perf_counter()
    yield
    times[key] = times.get(key, 0.0) + time.perf_counter() - t0


def generate_and_verify(ev, policy, prompts, refs, cfg, times, key, desc, seed=None):
    """rollout() + run_kernels(), overlapped: each generate call's kernels go to the harness (one background thread)
    while the next call generates, so CUDA builds, worker start-up and input generation hide behind generation. The
    GPU itself is never shared with candidates: rollout holds it alone (Evaluator.holding_gpus), so no candidate is
    timed against the trainer's kernels or can exhaust the memory the trainer is using; they check and time between
    generate calls and after the last one. Under torchrun each rank generates and verifies its share of the prompts
    (my_rows) on its own GPU; seed: see rollout.
    Adds the wall time of generation to times[key + "_gen"] and of the rest of verification to times[key + "_eval"].
    Returns (batch, results, completions): batch holds this rank's rows, results and completions every rank's, in
    prompt order."""
    rows = my_rows(len(prompts))
    mine = refs[rows]
    pending = []
    with concurrent.futures.ThreadPoolExecutor(1) as harness:
        def verify(start, texts):
            pending.append(harness.submit(run_kernels, ev, mine[start:start + len(texts)], texts))
        with timed(times, key + "_gen"):
            batch = rollout(policy.model, policy.tok, prompts, cfg, policy.sampler, desc, ev.holding_gpus, verify,
                            rows, seed)
        with timed(times, key + "_eval"):
            results = gather_rows(r for job in pending for r in job.result())
    return batch, results, gather_rows(batch["completions"])


def phase_seed(cfg, round_, phase):
    """The seed of one phase's sampling (rollout adds each generate call's first prompt index): a function of the
    run's seed, the round and the phase, so that a resumed run and a run on more ranks draw the same samples."""
    return zlib.crc32(f"{cfg.seed}/{round_}/{phase}".encode())


def harness_seconds(results):
    """Per-candidate harness seconds summed over a batch, by phase (startup = waiting for a started worker,
    reference, compile, run) plus gpu_wait (waiting for a GPU turn) and mem_wait (waiting for memory admission: large
    tasks, such as official KernelBench's, run fewer at once). Candidates overlap, so the sum exceeds the wall time; it
    says what a batch's verification spends its worker slots on."""
    total = Counter()
    for r in results:
        total.update(r.details.get("phase_s") or {})
        total["gpu_wait"] += r.details.get("gpu_wait_s") or 0.0
        total["mem_wait"] += r.details.get("mem_wait_s") or 0.0
    return {k: round(v, 2) for k, v in total.items()} if any(total.values()) else {}


def graph_timed_frac(results):
    """Of the timed correct kernels, the share timed as CUDA graph replays (the rest were timed eagerly, with host
    latency inside the window: a noisier speedup; a CUDA kernel launched on the legacy default stream is one); None
    when none was timed (the CPU)."""
    methods = [r.details.get("timing_method") for r in results if r.correct and r.speedup is not None]
    return sum(m == "graph" for m in methods) / len(methods) if methods else None


def kernel_scores(results):
    """(correct (N,), speedup (N,)) tensors from KernelResults; a missing speedup (CPU: no timing) is NaN."""
    correct = torch.tensor([float(r.correct) for r in results])
    speedup = torch.tensor([r.speedup if r.speedup is not None else float("nan") for r in results], dtype=torch.float)
    return correct, speedup
