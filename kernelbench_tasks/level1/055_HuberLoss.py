"""Elementwise Huber (smooth-L1 style) loss with threshold delta, reduction='none', for (8192, 4096) inputs."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8192
DIM = 4096


class Model(nn.Module):
    def __init__(self, delta: float):
        super().__init__()
        self.delta = delta

    def forward(self, predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.huber_loss(predictions, targets, reduction="none", delta=self.delta)


def get_inputs():
    return [torch.randn(BATCH, DIM), torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [1.0]
