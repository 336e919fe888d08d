"""Cosine similarity of paired rows, F.cosine_similarity over the last dimension of two (16384, 2048) tensors."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16384
DIM = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.cosine_similarity(a, b, dim=-1)


def get_inputs():
    # b shares a random fraction of a, so similarities spread over (-1, 1) instead of all being ~0.
    a = torch.randn(BATCH, DIM)
    mix = torch.rand(BATCH, 1) * 2 - 1
    return [a, mix * a + torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
