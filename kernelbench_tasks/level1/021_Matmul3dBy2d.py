"""3-D tensor times matrix: C[b] = A[b] @ B for A (BATCH, M, K) and one shared B (K, N)."""
import torch
import torch.nn as nn

BATCH = 16
M = 256
K = 1024
N = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
