"""KL divergence per sample, KL(target || pred) = sum(target * (log target - log_pred)), from log-probability inputs.

Inputs: log-probabilities of the prediction and probabilities of the target, both (16384, 2048), rows normalised.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16384
NUM_CLASSES = 2048


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, log_predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.kl_div(log_predictions, targets, reduction="none").sum(dim=-1)


def get_inputs():
    log_predictions = torch.log_softmax(torch.randn(BATCH, NUM_CLASSES), dim=-1)
    targets = torch.softmax(2 * torch.randn(BATCH, NUM_CLASSES), dim=-1)
    return [log_predictions, targets]


def get_init_inputs():
    return []
