"""Instance normalisation (nn.InstanceNorm2d: per sample and channel, over H x W) of a (32, 64, 128, 128) tensor."""
import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 64
HEIGHT = 128
WIDTH = 128


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.norm = nn.InstanceNorm2d(num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    # Per-channel offsets and scales, so normalising actually changes the input.
    return [3 * torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH) + torch.randn(1, CHANNELS, 1, 1)]


def get_init_inputs():
    return [CHANNELS]
