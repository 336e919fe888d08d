"""Inclusive prefix sum along the last dimension (golden task, level 1).

y[i, j] = x[i, 0] + ... + x[i, j]. Rows are 4096 long: a kernel scans them in chunks and carries the running total.
Sizes: 32M fp32 elements (128 MB in, 128 MB out).
Inputs are torch.rand (positive): the prefix sums grow monotonically, so any summation order stays within rtol.
With randn the sums wander across zero while their magnitude reaches ~100, and fp32 rounding there exceeds
atol 1e-4 for every order but torch's own (seen on an H200: correct chunked scans failed by 3e-4).
"""
import torch
import torch.nn as nn

batch_size = 8192
length = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-1)


def get_inputs():
    return [torch.rand(batch_size, length)]


def get_init_inputs():
    return []
