"""GELU with the tanh approximation (as in GPT-2), elementwise over a (8192, 4096) fp32 tensor."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8192
DIM = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
