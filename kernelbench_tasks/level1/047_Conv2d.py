"""2-D convolution (nn.Conv2d, 64 -> 128 channels, 3x3, padding 1, with bias) of a (8, 64, 64, 64) tensor."""
import torch
import torch.nn as nn

BATCH = 8
IN_CHANNELS = 64
OUT_CHANNELS = 128
HEIGHT = 64
WIDTH = 64
KERNEL_SIZE = 3


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
