"""Gated RMSNorm (as in Mamba-2): y = rmsnorm(x * silu(z)) * weight, rows of 2048, deterministic non-unit weight."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16384
HIDDEN = 2048


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, hidden))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        h = x * F.silu(z)
        h = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return h * self.weight


def get_inputs():
    return [torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, 1e-5]
