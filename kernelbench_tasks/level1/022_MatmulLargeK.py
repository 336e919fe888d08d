"""Matmul with a small output and a long reduction: C = A @ B, A (256, 16384), B (16384, 256) (split-K territory)."""
import torch
import torch.nn as nn

M = 256
K = 16384
N = 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
