"""Matmul with a transposed right operand: C = A @ B.T where A is (M, K) and B is stored as (N, K)."""
import torch
import torch.nn as nn

M = 1024
K = 2048
N = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B.T)


def get_inputs():
    return [torch.randn(M, K), torch.randn(N, K)]


def get_init_inputs():
    return []
