"""ELU activation with a configurable alpha, elementwise over a (4096, 8192) fp32 tensor."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4096
DIM = 8192


class Model(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.elu(x, alpha=self.alpha)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [1.5]
