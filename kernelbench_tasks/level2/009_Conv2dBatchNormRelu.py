"""Conv2d, batch norm in inference form (fixed running statistics), ReLU: the classic conv-bn-relu block.

The batch norm can be folded into the convolution's weights and bias; F.batch_norm is called with training=False
so the result does not depend on train/eval mode. The statistics are non-trivial deterministic buffers.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
IN_CHANNELS = 32
OUT_CHANNELS = 64
HEIGHT = 64
WIDTH = 64
KERNEL_SIZE = 3


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.register_buffer("running_mean", torch.linspace(-0.2, 0.2, out_channels))
        self.register_buffer("running_var", torch.linspace(0.1, 0.6, out_channels))
        self.bn_weight = nn.Parameter(torch.linspace(0.5, 1.5, out_channels))
        self.bn_bias = nn.Parameter(torch.linspace(-0.5, 0.5, out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = F.batch_norm(y, self.running_mean, self.running_var, self.bn_weight, self.bn_bias,
                         training=False, eps=1e-5)
        return torch.relu(y)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
