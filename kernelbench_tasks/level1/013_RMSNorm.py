"""RMSNorm over the last dimension, no weight (golden task, level 1).

y = x / sqrt(mean(x^2) + eps), eps = 1e-6, written out in torch ops (as in KernelBench's RMSNorm task).
Sizes: 32M fp32 elements (128 MB in, 128 MB out).
"""
import torch
import torch.nn as nn

batch_size = 16384
hidden = 2048
eps = 1e-6


class Model(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x / rms


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [eps]
