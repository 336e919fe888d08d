"""Rectangular matrix multiplication: C = A @ B with A (M, K), B (K, N) and M, K, N all different."""
import torch
import torch.nn as nn

M = 2048
K = 1024
N = 1536


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
