"""Matrix-vector product: y = A @ x with A (M, K) and x (K, 1); memory-bound (each element of A is read once)."""
import torch
import torch.nn as nn

M = 16384
K = 4096


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, x)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, 1)]


def get_init_inputs():
    return []
