"""One-shot example for the Coder's prompt (reference side): a KernelBench-style task that adds two tensors.
cuda_ext/example_cuda.py and cuda_ext/example_triton.py are correct candidates for it; the harness tests check that."""
import torch
import torch.nn as nn


class Model(nn.Module):
    """out = a + b, elementwise."""

    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


N = 1 << 20   # small on purpose: the Coder reads this example, and the CPU tests run it under the Triton
             # interpreter (our benchmark tasks are larger: >= ~50 us eager on an H200)


def get_inputs():
    return [torch.randn(N), torch.randn(N)]


def get_init_inputs():
    return []
