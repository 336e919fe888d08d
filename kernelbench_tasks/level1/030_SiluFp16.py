"""SiLU (x * sigmoid(x)) in float16, elementwise over a (16384, 4096) tensor: a half-precision variant."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16384
DIM = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


def get_inputs():
    return [torch.randn(BATCH, DIM, dtype=torch.float16)]


def get_init_inputs():
    return []
