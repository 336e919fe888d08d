"""Triton solution for level1/009_MaxDim: torch.max(x, dim=-1).values.

Row reduction. Each program loads ROWS whole rows as one (ROWS, BLOCK_N) tile (BLOCK_N = the row length rounded up
to a power of two; padding lanes read -inf so they never win) and reduces along axis 1. On the GPU ROWS = 1: one
program per row, 8 warps. Under the CPU interpreter ROWS = 64: the interpreter's cost grows with the number of
programs, not with the tile size.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def max_rows_kernel(x_ptr, y_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    x = tl.load(x_ptr + rows[:, None] * n_cols + cols[None, :], mask=mask, other=-float("inf"))
    tl.store(y_ptr + rows, tl.max(x, axis=1), mask=rows < n_rows)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        y = torch.empty(x.shape[:-1], device=x.device, dtype=x.dtype)
        ROWS = 1 if x.is_cuda else 64
        max_rows_kernel[(triton.cdiv(n_rows, ROWS),)](
            x, y, n_rows, n_cols, ROWS=ROWS, BLOCK_N=triton.next_power_of_2(n_cols),
            num_warps=8 if x.is_cuda else 4)
        return y
