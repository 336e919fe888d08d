"""Matmul with a transposed left operand: C = A.T @ B where A is stored as (K, M) and B as (K, N)."""
import torch
import torch.nn as nn

M = 1024
K = 2048
N = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A.T, B)


def get_inputs():
    return [torch.randn(K, M), torch.randn(K, N)]


def get_init_inputs():
    return []
