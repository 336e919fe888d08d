"""Gated mean pooling over the sequence: mean(sigmoid(gate) * x, dim=1) for (B, S, D) inputs."""
import torch
import torch.nn as nn

BATCH = 64
SEQ_LEN = 512
DIM = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return torch.mean(torch.sigmoid(gate) * x, dim=1)


def get_inputs():
    # A per-(batch, feature) offset in x makes the pooled values vary more than the noise.
    x = torch.randn(BATCH, SEQ_LEN, DIM) + torch.randn(BATCH, 1, DIM)
    return [x, 3 * torch.randn(BATCH, SEQ_LEN, DIM)]


def get_init_inputs():
    return []
