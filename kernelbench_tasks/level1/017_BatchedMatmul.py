"""Batched matrix multiplication: C[b] = A[b] @ B[b] with torch.bmm."""
import torch
import torch.nn as nn

BATCH = 32
M = 256
K = 512
N = 384


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N)]


def get_init_inputs():
    return []
