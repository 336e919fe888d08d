"""SiLU (swish) (golden task, level 1). y = x * sigmoid(x).

Sizes: 32M fp32 elements (128 MB in, 128 MB out): ~75 us of HBM traffic on an H200 (above the 50 us floor), up to
about a second eager on the CPU, and a Triton solution with 4096-16384-element blocks stays inside the interpreter's
budget. Inputs are torch.randn so that the op is neither the identity nor a constant.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 16384
dim = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
