"""Argmax over the middle dimension of a (64, 1024, 1024) tensor; the output is int64 indices."""
import torch
import torch.nn as nn

BATCH = 64
DIM1 = 1024
DIM2 = 1024


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.argmax(x, dim=self.dim)


def get_inputs():
    return [torch.randn(BATCH, DIM1, DIM2)]


def get_init_inputs():
    return [1]
