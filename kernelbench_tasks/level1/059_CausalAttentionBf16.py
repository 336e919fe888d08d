"""Causal scaled dot-product attention in bfloat16, q, k, v of shape (16, 16, 1024, 64) (is_causal=True)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16
HEADS = 16
SEQ_LEN = 1024
HEAD_DIM = 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def get_inputs():
    shape = (BATCH, HEADS, SEQ_LEN, HEAD_DIM)
    return [torch.randn(shape, dtype=torch.bfloat16) for _ in range(3)]


def get_init_inputs():
    return []
