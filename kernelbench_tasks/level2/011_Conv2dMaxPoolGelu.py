"""Conv2d, 2x2 max pooling, GELU: the pooling and activation can run on the convolution's output tile."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
IN_CHANNELS = 32
OUT_CHANNELS = 64
HEIGHT = 128
WIDTH = 128
KERNEL_SIZE = 3


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.max_pool2d(self.conv(x), kernel_size=2))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
