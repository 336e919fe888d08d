"""Row-wise log-sum-exp, log(sum(exp(x), dim=-1)), over a (65536, 1024) tensor."""
import torch
import torch.nn as nn

BATCH = 65536
DIM = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(x, dim=-1)


def get_inputs():
    # A scale of 4 spreads the row results; much larger and the output is just the row max within tolerance.
    return [4 * torch.randn(BATCH, DIM)]


def get_init_inputs():
    return []
