"""Elementwise fusion of three inputs (golden task, level 2): y = tanh((a + b) * c).

Eager PyTorch makes three passes and two temporaries; one fused kernel reads a, b, c once and writes y once.
Sizes: three 16M-element fp32 inputs (192 MB read, 64 MB written).
"""
import torch
import torch.nn as nn

batch_size = 8192
dim = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return torch.tanh((a + b) * c)


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(batch_size, dim), torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
