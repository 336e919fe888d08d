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
    # scaled by K^-1/4 so outputs are O(1): the fp32 summation order of a correct kernel (vs cuBLAS) then stays far
    # below the 1e-4 tolerance, while a TF32 kernel still fails (see 014_SquareMatmul)
    return [torch.randn(M, K) / K ** 0.25, torch.randn(K, 1) / K ** 0.25]


def get_init_inputs():
    return []
