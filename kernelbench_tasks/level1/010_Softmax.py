"""Softmax over the last dimension (golden task, level 1).

y = exp(x - max) / sum(exp(x - max)) along the last dimension.
Inputs are randn * 4 so that rows have a clear maximum (a uniform 1/dim output would be close to the reference for
unit-variance inputs of this width). Sizes: 32M fp32 elements, one row of 2048 per (batch) index.
"""
import torch
import torch.nn as nn

batch_size = 16384
dim = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(batch_size, dim) * 4.0]


def get_init_inputs():
    return []
