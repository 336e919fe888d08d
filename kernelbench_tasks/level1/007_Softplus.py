"""Softplus (beta=1, threshold=20: torch's defaults) (golden task, level 1). y = log(1 + exp(x)), and y = x where x > 20.

Sizes: 8M fp32 elements (32 MB in, 32 MB out): tens of microseconds of HBM traffic on an H200, tens of
milliseconds eager on one CPU core, and a Triton solution with 4096-16384-element blocks stays inside the
interpreter's budget. Inputs are torch.randn so that the op is neither the identity nor a constant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 4096
dim = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
