"""One-shot example for the Coder's prompt (Triton): ModelNew for cuda_ext/example_ref.py, an elementwise add kernel.

Note for matmuls: tl.dot computes fp32 inputs in TF32 by default on the GPU (~1e-3 relative error, fails the fp32
tolerance of 1e-4); write tl.dot(a, b, input_precision="ieee") for fp32 tasks."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(a_ptr, b_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    a = tl.load(a_ptr + offsets, mask=mask)
    b = tl.load(b_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, a + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a, b = a.contiguous(), b.contiguous()
        out = torch.empty_like(a)
        n = out.numel()
        BLOCK_SIZE = 4096   # large blocks: fewer programs (cheap on the GPU, and fast under the CPU interpreter)
        grid = (triton.cdiv(n, BLOCK_SIZE),)
        add_kernel[grid](a, b, out, n, BLOCK_SIZE=BLOCK_SIZE)
        return out
