"""Batch normalisation in inference form: per-channel (x - running_mean) / sqrt(running_var + eps) * weight + bias.

The statistics are fixed, non-trivial buffers (with the default mean 0 / var 1 / weight 1 / bias 0 the op would be
the identity), and F.batch_norm is called with training=False so the result does not depend on train/eval mode.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
CHANNELS = 64
HEIGHT = 128
WIDTH = 128


class Model(nn.Module):
    def __init__(self, num_features: int, eps: float):
        super().__init__()
        self.eps = eps
        self.register_buffer("running_mean", torch.linspace(-1.0, 1.0, num_features))
        self.register_buffer("running_var", torch.linspace(0.25, 4.0, num_features))
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, num_features))
        self.bias = nn.Parameter(torch.linspace(-0.3, 0.3, num_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=False, eps=self.eps)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS, 1e-5]
