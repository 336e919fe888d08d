"""Weighted squared distance per row: sum((x - y)^2 * w, dim=-1), an elementwise chain ending in a reduction."""
import torch
import torch.nn as nn

BATCH = 16384
DIM = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.sum((x - y) ** 2 * w, dim=-1)


def get_inputs():
    # w is broadcast over rows: one weight per feature, positive.
    return [torch.randn(BATCH, DIM), torch.randn(BATCH, DIM), torch.rand(DIM) + 0.5]


def get_init_inputs():
    return []
