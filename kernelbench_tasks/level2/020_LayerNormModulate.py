"""LayerNorm without affine, then per-sample scale and shift (adaLN in diffusion transformers):
y = LayerNorm(x) * (1 + scale[:, None, :]) + shift[:, None, :] for x (B, S, D) and scale, shift (B, D).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
SEQ_LEN = 1024
HIDDEN = 1024


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.hidden = hidden
        self.eps = eps

    def forward(self, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(x, (self.hidden,), eps=self.eps)
        return y * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


def get_inputs():
    return [torch.randn(BATCH, SEQ_LEN, HIDDEN), 0.5 * torch.randn(BATCH, HIDDEN), 0.5 * torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, 1e-6]
