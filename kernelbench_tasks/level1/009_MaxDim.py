"""Max over the last dimension (golden task, level 1).

x: (batch, dim) -> (batch,), the values of torch.max(x, dim=-1) (no indices).
Sizes: 64M fp32 elements (256 MB read); randn inputs.
"""
import torch
import torch.nn as nn

batch_size = 32768
dim = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.max(x, dim=-1).values


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
