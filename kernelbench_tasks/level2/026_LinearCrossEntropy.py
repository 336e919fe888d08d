"""Linear head followed by per-token cross-entropy (the fused "linear cross-entropy" of LLM training).

logits = h @ W^T (no bias), loss_i = logsumexp(logits_i) - logits_i[target_i]; a fused kernel never writes logits.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 2048
HIDDEN = 1024
VOCAB = 4096


class Model(nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.head(h), targets, reduction="none")


def get_inputs():
    return [4 * torch.randn(TOKENS, HIDDEN), torch.randint(0, VOCAB, (TOKENS,))]


def get_init_inputs():
    return [HIDDEN, VOCAB]
