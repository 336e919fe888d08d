"""Minimum over the last dimension (values only) of a (16384, 4096) tensor."""
import torch
import torch.nn as nn

BATCH = 16384
DIM = 4096


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.min(x, dim=self.dim).values


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [-1]
