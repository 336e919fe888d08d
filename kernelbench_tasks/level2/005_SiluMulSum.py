"""SwiGLU-style gate followed by a row sum (golden task, level 2): y = sum(silu(x) * g, dim=-1).

x, g: (batch, dim) -> y: (batch,). The fused kernel never materialises silu(x) * g.
Sizes: two 32M-element fp32 inputs.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16384
dim = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return torch.sum(F.silu(x) * g, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
