"""1-D max pooling (kernel 4, stride 2, padding 1) over the last dimension of a (128, 64, 8192) tensor."""
import torch
import torch.nn as nn

BATCH = 128
CHANNELS = 64
LENGTH = 8192


class Model(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.MaxPool1d(kernel_size, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, LENGTH)]


def get_init_inputs():
    return [4, 2, 1]
