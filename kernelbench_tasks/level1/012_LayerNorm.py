"""LayerNorm over the last dimension with an affine weight and bias (golden task, level 1).

y = (x - mean) / sqrt(var + eps) * weight + bias, var the biased variance, eps = 1e-5 (nn.LayerNorm defaults).
nn.LayerNorm initialises weight = 1 and bias = 0; a candidate must still read them (they are parameters).
Inputs have a non-zero mean (randn * 2 + 1) so that a one-pass E[x^2] - E[x]^2 shortcut shows its rounding.
Sizes: 32M fp32 elements (128 MB in, 128 MB out).
"""
import torch
import torch.nn as nn

batch_size = 16384
hidden = 2048


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch_size, hidden) * 2.0 + 1.0]


def get_init_inputs():
    return [hidden]
