"""Row softmax in bfloat16 over the last dimension of a (16384, 4096) tensor: a low-precision variant."""
import torch
import torch.nn as nn

BATCH = 16384
DIM = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    # Scaled so rows are peaked: with standard normals every probability is ~1/4096, below the bf16 tolerance.
    return [4 * torch.randn(BATCH, DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
