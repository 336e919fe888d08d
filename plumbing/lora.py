"""
LoRA (Hu et al. 2021, arXiv:2106.09685), written out in a few lines rather than taken from peft: each nn.Linear in the
decoder blocks gets a trained low-rank correction and everything else is frozen (cfg.lora_rank > 0). The adapters
train, the bf16 sampler stays a plain model that receives merged weights after each update (policy.refresh_sampler),
and the saved model is merged, with the adapters beside it (checkpoints.save_pretrained_atomic; "LoRA" in
docs/training.md).

What it buys here: AdamW state for ~1% of the weights instead of all of them, and a run's whole trained state in
tens of megabytes, so that a run can stop on one machine and resume on another that has the same base weights.
"LoRA Without Regret" (Schulman et al., Thinking Machines Lab, 2025) found policy-gradient RL with LoRA as
sample-efficient as full fine-tuning even at rank 1, provided every layer is adapted (the MLPs too) and the
learning rate is about 10x full fine-tuning's.
"""

import math
import os

import torch


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



def adapter_header(path):
    """{"base", "lora_rank", "lora_alpha"} of a folder that holds LoRA adapters alone (adapter.pt without a model:
    an SFT folder written with --no-sft-merged), else None. Reads the adapter file (a few MB), not the model."""
    file = os.path.join(path, "adapter.pt")
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "config.json")) or not os.path.exists(file):
        return None
    saved = torch.load(file, map_location="cpu")
    return {k: saved[k] for k in ("base", "lora_rank", "lora_alpha")}


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

