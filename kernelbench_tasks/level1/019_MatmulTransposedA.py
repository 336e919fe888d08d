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
    # scaled by K^-1/4 so outputs are O(1): the fp32 summation order of a correct kernel (vs cuBLAS) then stays far
    # below the 1e-4 tolerance, while a TF32 kernel still fails (see 014_SquareMatmul)
    return [torch.randn(K, M) / K ** 0.25, torch.randn(K, N) / K ** 0.25]


def get_init_inputs():
    return []
