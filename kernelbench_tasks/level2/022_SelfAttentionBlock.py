"""Multi-head self-attention block: fused QKV projection, split heads, scaled dot-product attention, output projection.

x (B, S, D) -> qkv = x @ W_qkv^T -> (q, k, v) each (B, H, S, D/H) -> softmax(q k^T / sqrt(d)) v -> merge -> out_proj.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4
SEQ_LEN = 512
HIDDEN = 512
HEADS = 8


class Model(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, hidden = x.shape
        qkv = self.qkv(x).view(batch, seq_len, 3, self.heads, hidden // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        attn = F.scaled_dot_product_attention(q, k, v)
        return self.out_proj(attn.transpose(1, 2).reshape(batch, seq_len, hidden))


def get_inputs():
    return [2 * torch.randn(BATCH, SEQ_LEN, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, HEADS]
