"""Linear layer, HardSwish, then a constant scale: y = hardswish(x @ W^T + b) * scale (an epilogue fusion)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 1024
IN_FEATURES = 2048
OUT_FEATURES = 2048


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardswish(self.linear(x)) * self.scale


def get_inputs():
    # Scaled so the pre-activations reach the HardSwish kinks at -3 and +3.
    return [4 * torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, 1.7]
