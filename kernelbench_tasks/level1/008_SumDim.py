"""Sum over a middle dimension, keepdim=True (golden task, level 1).

x: (batch, rows, cols) -> (batch, 1, cols). Reducing a middle dimension means the reduced elements are `cols` apart
in memory: a good kernel keeps loads coalesced along `cols` and loops over `rows`.
Sizes: 64M fp32 elements (256 MB read); randn inputs, so neither zeros nor the mean pass.
"""
import torch
import torch.nn as nn

batch_size = 256
rows = 512
cols = 512
reduce_dim = 1


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim, keepdim=True)


def get_inputs():
    return [torch.randn(batch_size, rows, cols)]


def get_init_inputs():
    return [reduce_dim]
