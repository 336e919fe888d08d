"""Triton solution for level1/008_SumDim: torch.sum(x, dim, keepdim=True) for any dim.

x is viewed as (outer, R, inner) with R the reduced size. Each program owns one `outer` index and a block of BLOCK_I
neighbouring `inner` columns and walks down R in BLOCK_R-row tiles: every tile load is contiguous along `inner`
(coalesced), the partial sums stay in fp32 registers, and one row of BLOCK_I results is written at the end. GPU: 32
x 64 tiles (about two thousand programs for the task's shape); under the CPU interpreter, whose cost grows with the
number of programs and loop trips, one 512 x 512 tile.
"""
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sum_dim_kernel(x_ptr, y_ptr, R, inner, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    o = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    col_mask = cols < inner
    acc = tl.zeros((BLOCK_I,), dtype=tl.float32)
    base = x_ptr + o * R * inner
    for r0 in range(0, R, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        mask = (rows[:, None] < R) & col_mask[None, :]
        tile = tl.load(base + rows[:, None] * inner + cols[None, :], mask=mask, other=0.0)
        acc += tl.sum(tile, axis=0)
    tl.store(y_ptr + o * inner + cols, acc, mask=col_mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dim = self.dim % x.dim()
        outer, R, inner = math.prod(x.shape[:dim]), x.shape[dim], math.prod(x.shape[dim + 1:])
        out_shape = list(x.shape)
        out_shape[dim] = 1
        y = torch.empty(out_shape, device=x.device, dtype=x.dtype)
        if x.is_cuda:
            BLOCK_R, BLOCK_I = 32, 64
        else:
            BLOCK_R, BLOCK_I = 512, 512
        grid = (outer, triton.cdiv(inner, BLOCK_I))
        sum_dim_kernel[grid](x, y, R, inner, BLOCK_R=BLOCK_R, BLOCK_I=BLOCK_I)
        return y
