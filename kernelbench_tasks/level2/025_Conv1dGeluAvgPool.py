"""Conv1d, GELU, then global average pooling over the length: (B, C_in, L) -> (B, C_out)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16
IN_CHANNELS = 64
OUT_CHANNELS = 128
LENGTH = 4096
KERNEL_SIZE = 5


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.conv(x)).mean(dim=-1)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, LENGTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
