"""One-shot example for the Proposer's prompt: a KernelBench-format task built from two catalog operations
(kernelzero.PROPOSER_EXAMPLE_APIS: torch.nn.functional.softplus and torch.logsumexp). It passes the task linter
(`python eval_harness.py lint cuda_ext/example_proposal.py`); the tests check that."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH, DIM = 8192, 2048   # 16M fp32 elements (64 MB): enough work that launch overhead does not dominate


class Model(nn.Module):
    """Row-wise log-sum-exp of a scaled softplus."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(F.softplus(x) * self.scale, dim=1)


def get_inputs():
    return [torch.randn(BATCH, DIM)]


def get_init_inputs():
    return [0.5]
