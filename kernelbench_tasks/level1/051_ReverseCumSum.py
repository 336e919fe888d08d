"""Reverse cumulative sum (suffix sums) along the last dimension of a (8192, 4096) tensor: flip, cumsum, flip.

Inputs are torch.rand (positive): the prefix sums grow monotonically, so any summation order stays within rtol.
With randn the sums wander across zero while their magnitude reaches ~100, and fp32 rounding there exceeds
atol 1e-4 for every order but torch's own (seen on an H200: correct chunked scans failed by 3e-4).
"""
import torch
import torch.nn as nn

BATCH = 8192
DIM = 4096


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x.flip(self.dim), dim=self.dim).flip(self.dim)


def get_inputs():
    return [torch.rand(BATCH, DIM)]


def get_init_inputs():
    return [1]
