"""Triton solution for level2/003_AddMulTanh: y = tanh((a + b) * c) in one elementwise kernel.

Eager PyTorch runs three kernels and writes two temporaries; here each element of a, b and c is read once and y is
written once. tanh(|z|) = (1 - t) / (1 + t) with t = exp(-2|z|) <= 1 never overflows; tanh is odd, so the sign is
restored at the end. GPU: BLOCK = 1024; under the CPU interpreter, whose cost grows with the number of programs,
BLOCK = 16384.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_mul_tanh_kernel(a_ptr, b_ptr, c_ptr, y_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    c = tl.load(c_ptr + offs, mask=mask)
    z = (a + b) * c
    t = tl.exp(-2.0 * tl.abs(z))
    y = (1.0 - t) / (1.0 + t)
    tl.store(y_ptr + offs, tl.where(z < 0, -y, y), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        a, b, c = a.contiguous(), b.contiguous(), c.contiguous()
        y = torch.empty_like(a)
        n = a.numel()
        BLOCK = 1024 if a.is_cuda else 16384
        add_mul_tanh_kernel[(triton.cdiv(n, BLOCK),)](a, b, c, y, n, BLOCK=BLOCK)
        return y
