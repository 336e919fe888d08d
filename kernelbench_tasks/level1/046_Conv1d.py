"""1-D convolution (nn.Conv1d, 64 -> 128 channels, kernel 5, padding 2, with bias) of a (8, 64, 8192) tensor."""
import torch
import torch.nn as nn

BATCH = 8
IN_CHANNELS = 64
OUT_CHANNELS = 128
LENGTH = 8192
KERNEL_SIZE = 5


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, LENGTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
