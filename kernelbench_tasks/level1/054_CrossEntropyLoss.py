"""Cross-entropy per sample from logits (32768, 2048) and integer class targets (reduction='none')."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32768
NUM_CLASSES = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets, reduction="none")


def get_inputs():
    return [2 * torch.randn(BATCH, NUM_CLASSES), torch.randint(0, NUM_CLASSES, (BATCH,))]


def get_init_inputs():
    return []
