"""Attention scores with a causal mask: softmax(mask(q @ k^T * scale)) over batched (B*H, S, D) inputs.

Positions j > i get -inf before the softmax, so each row i is a softmax over its first i + 1 scores.
"""
import math

import torch
import torch.nn as nn

BATCH_HEADS = 64
SEQ_LEN = 512
HEAD_DIM = 64


class Model(nn.Module):
    def __init__(self, head_dim: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        scores = torch.bmm(q, k.transpose(1, 2)) * self.scale
        seq_len = scores.shape[-1]
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool, device=scores.device).triu(diagonal=1)
        scores = scores.masked_fill(mask, float("-inf"))
        return torch.softmax(scores, dim=-1)


def get_inputs():
    return [torch.randn(BATCH_HEADS, SEQ_LEN, HEAD_DIM), torch.randn(BATCH_HEADS, SEQ_LEN, HEAD_DIM)]


def get_init_inputs():
    return [HEAD_DIM]
