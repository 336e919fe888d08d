"""Matrix product followed by a softmax over its rows (golden task, level 2): y = softmax(A @ B, dim=-1).

Attention-score shaped. A is scaled by 0.1 so that the logits have a standard deviation of about 3: peaked rows,
far from a uniform 1/N. Sizes: (1024 x 1024) @ (1024 x 2048), fp32 (tolerance 1e-4: no TF32).
"""
import torch
import torch.nn as nn

M = 1024
K = 1024
N = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.softmax(A @ B, dim=-1)


def get_inputs():
    return [torch.randn(M, K) * 0.1, torch.randn(K, N)]


def get_init_inputs():
    return []
