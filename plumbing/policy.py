"""
The policies: a Policy holds the trained model with its AdamW state, the copy that generates, and the frozen KL
reference; make_policy builds one from a model name or an SFT checkpoint and places it (FSDP2 under torchrun);
refresh_sampler copies the weights into the sampler after each update; focus moves the idle one to CPU memory.

How this departs from a plain transformers + TRL setup:
1. fp32 master weights train, a bf16 copy samples (on a GPU): small updates do not round away, and the sampler is
   refreshed in place after each update so that its compiled static-cache decode step stays valid.
2. With LoRA (cfg.lora_rank > 0, lora.py) the sampler stays a plain model that receives merged weights.
3. A policy's learning rate is set once, when it is made (make_policy's lr: AdamW's); the update never sets it, and a
   resumed run keeps it (checkpoints.load_checkpoint), so a flag given with --resume applies.

`cfg` below is a kernelzero.Config.
"""

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist

from plumbing.distributed import full_tensor, shard_model
from plumbing.lora import add_lora, adapters, check_keys, lora_merge, read_adapter
from plumbing.models import load_model, set_attention

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
            merged = lora_merge(full_tensor(m.base.weight), full_tensor(m.lora_a), full_tensor(m.lora_b), m.scale)
            policy.sampler.get_submodule(name).weight.copy_(merged)
    else:
        for p_s, p in zip(policy.sampler.parameters(), policy.model.parameters()):
            p_s.copy_(full_tensor(p))


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
