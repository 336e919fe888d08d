"""Euclidean norm of each row, torch.linalg.vector_norm over the last dimension of a (65536, 1024) tensor."""
import torch
import torch.nn as nn

BATCH = 65536
DIM = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.vector_norm(x, ord=2, dim=-1)


def get_inputs():
    # Rows with different scales, so the output is not nearly constant (every row's norm would be ~32).
    scale = torch.rand(BATCH, 1) * 4 + 0.1
    return [scale * torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
