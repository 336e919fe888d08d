"""Cumulative product along the last dimension of a (8192, 4096) tensor with entries near 1."""
import torch
import torch.nn as nn

BATCH = 8192
DIM = 4096


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, dim=self.dim)


def get_inputs():
    # Entries near 1 keep the running product in range: raw standard normals underflow to ~0 after a few dozen steps.
    return [1 + 0.02 * torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [1]
