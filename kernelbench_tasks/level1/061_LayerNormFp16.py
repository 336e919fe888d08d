"""Layer normalisation (nn.LayerNorm over 1024 features, fp16 affine parameters) of a (65536, 1024) fp16 tensor."""
import torch
import torch.nn as nn

BATCH = 65536
DIM = 1024


class Model(nn.Module):
    def __init__(self, normalized_shape: int):
        super().__init__()
        self.norm = nn.LayerNorm(normalized_shape, dtype=torch.float16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [3 * torch.randn(BATCH, DIM, dtype=torch.float16) + 1]


def get_init_inputs():
    return [DIM]
