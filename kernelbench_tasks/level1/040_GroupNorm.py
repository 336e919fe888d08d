"""Group normalisation (nn.GroupNorm, 8 groups of 8 channels) of a (32, 64, 128, 128) tensor."""
import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 64
GROUPS = 8
HEIGHT = 128
WIDTH = 128


class Model(nn.Module):
    def __init__(self, num_groups: int, num_channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(num_groups, num_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [GROUPS, CHANNELS]
