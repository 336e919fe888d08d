"""Square matrix multiplication C = A @ B, fp32 (golden task, level 1).

N = 2048: 17 GFLOP, a few hundred microseconds on an H200 in fp32 (TF32 off, as the harness requires), well under
a second eager on one CPU core. The inputs are scaled by N^-1/4 so that C has unit-variance entries. Why: with plain
randn inputs the partial sums of a 2048-long dot product reach ~45, and the order of an fp32 sum alone (cuBLAS
versus any other correct kernel) then moves near-zero outputs by ~1e-4, the size of the fp32 tolerance. Scaled,
order effects stay ~1e-6, while TF32 (~3e-4 relative error per product) still fails the tolerance: Triton solutions
use tl.dot(..., input_precision="ieee").
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
    return [torch.randn(N, N) / N ** 0.25, torch.randn(N, N) / N ** 0.25]


def get_init_inputs():
    return []
