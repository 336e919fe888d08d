"""1-D average pooling (kernel 8, stride 4, padding 2, zero padding counted) of a (128, 64, 8192) tensor."""
import torch
import torch.nn as nn

BATCH = 128
CHANNELS = 64
LENGTH = 8192


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.AvgPool1d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, LENGTH)]


def get_init_inputs():
    return [8, 4, 2]
