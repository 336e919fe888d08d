"""Residual add followed by RMSNorm with a learned scale (golden task, level 2).

h = x + residual; y = h / sqrt(mean(h^2, dim=-1) + eps) * weight. A transformer block's pre-norm step: the fused
kernel reads x and residual once per row and never writes h. The weight is initialised to 1 + 0.1 * arange-based
ramp (deterministic, not all ones, so a kernel that ignores it fails).
Sizes: 32M-element fp32 inputs, rows of 2048.
"""
import torch
import torch.nn as nn

batch_size = 16384
hidden = 2048
eps = 1e-6


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.cos(torch.arange(hidden, dtype=torch.float32)))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = x + residual
        rms = torch.sqrt(torch.mean(h * h, dim=-1, keepdim=True) + self.eps)
        return h / rms * self.weight


def get_inputs():
    return [torch.randn(batch_size, hidden), torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden, eps]
