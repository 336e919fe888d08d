"""Linear layer, LeakyReLU (slope 0.1), then clamp to [-1, 1]: three elementwise steps after one GEMM."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 2048
IN_FEATURES = 1024
OUT_FEATURES = 2048


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, negative_slope: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.leaky_relu(self.linear(x), negative_slope=self.negative_slope)
        return torch.clamp(y, min=-1.0, max=1.0)


def get_inputs():
    return [2 * torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, 0.1]
