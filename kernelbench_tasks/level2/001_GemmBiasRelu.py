"""Linear layer followed by Relu (golden task, level 2): y = relu(x @ W^T + b).

The fusion: the bias add and the activation run in the GEMM's epilogue instead of two extra passes over the
output. W and b are nn.Linear's parameters (a candidate builds the same nn.Linear and reads its weight and bias).
Sizes: (2048 x 1024) @ (1024 x 2048): 8.6 GFLOP, fp32 (tolerance 1e-4: no TF32).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

batch_size = 2048
in_features = 1024
out_features = 2048


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.gemm(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
