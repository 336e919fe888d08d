"""Batched matrix multiplication: C[b] = A[b] @ B[b] with torch.bmm."""
import torch
import torch.nn as nn

BATCH = 64
M = 256
K = 512
N = 384


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


def get_inputs():
    # scaled by K^-1/4 so outputs are O(1): the fp32 summation order of a correct kernel (vs cuBLAS) then stays far
    # below the 1e-4 tolerance, while a TF32 kernel still fails (see 014_SquareMatmul)
    return [torch.randn(BATCH, M, K) / K ** 0.25, torch.randn(BATCH, K, N) / K ** 0.25]


def get_init_inputs():
    return []
