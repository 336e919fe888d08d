"""Square matrix multiplication C = A @ B, fp32 (golden task, level 1).

N = 2048: 17 GFLOP, a few hundred microseconds on an H200 in fp32 (TF32 off, as the harness requires), well under
a second eager on one CPU core. fp32 tolerance (1e-4) rules out TF32: Triton solutions use
tl.dot(..., input_precision="ieee").
"""
import torch
import torch.nn as nn

N = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
