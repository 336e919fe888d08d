"""Triton solution for level1/002_Gelu: exact (erf) GELU.

One elementwise kernel: each program loads BLOCK contiguous elements, applies 0.5 x (1 + erf(x / sqrt 2)) in fp32
registers and stores them. On the GPU BLOCK=1024 (4 warps, 8 elements per thread); under the CPU interpreter the
cost grows with the number of programs, so forward() picks a 16384-element block there.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n_elements, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask)
    # torch's default GELU is the erf form, not the tanh approximation (which is off by ~1e-3).
    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        BLOCK = 1024 if x.is_cuda else 16384
        gelu_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, BLOCK=BLOCK)
        return y
