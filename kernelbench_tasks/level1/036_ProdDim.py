"""Product over the middle dimension (size 16) of a (256, 16, 16384) tensor with entries near 1."""
import torch
import torch.nn as nn

BATCH = 256
DIM1 = 16
DIM2 = 16384


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.prod(x, dim=self.dim)


def get_inputs():
    # Entries near 1 keep the product well scaled (a product of 16 standard normals is mostly tiny).
    return [1 + 0.2 * torch.randn(BATCH, DIM1, DIM2)]


def get_init_inputs():
    return [1]
