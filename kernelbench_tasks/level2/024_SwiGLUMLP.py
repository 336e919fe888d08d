"""SwiGLU feed-forward block (Llama style): y = W_down(silu(W_gate x) * W_up x), no biases."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 1024
HIDDEN = 1024
INTERMEDIATE = 2048


class Model(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def get_inputs():
    return [4 * torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE]
