"""Matmul with a small output and a long reduction: C = A @ B, A (256, 32768), B (32768, 256) (split-K territory)."""
import torch
import torch.nn as nn

M = 256
K = 32768
N = 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    # scaled by K^-1/4 so outputs are O(1): the fp32 summation order of a correct kernel (vs cuBLAS) then stays far
    # below the 1e-4 tolerance, while a TF32 kernel still fails (see 014_SquareMatmul)
    return [torch.randn(M, K) / K ** 0.25, torch.randn(K, N) / K ** 0.25]


def get_init_inputs():
    return []
