"""Residual add then LayerNorm: y = LayerNorm(x + residual) over the last dimension (post-norm transformer step)."""
import torch
import torch.nn as nn

BATCH = 32768
HIDDEN = 1024


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x + residual)


def get_inputs():
    return [torch.randn(BATCH, HIDDEN), 2 * torch.randn(BATCH, HIDDEN) + 1]


def get_init_inputs():
    return [HIDDEN]
