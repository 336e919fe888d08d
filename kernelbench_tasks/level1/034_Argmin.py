"""Argmin over the last dimension of a (16384, 4096) tensor; the output is int64 indices."""
import torch
import torch.nn as nn

BATCH = 16384
DIM = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmin(dim=-1)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
