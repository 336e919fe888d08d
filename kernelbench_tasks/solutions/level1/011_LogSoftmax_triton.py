"""Triton solution for level1/011_LogSoftmax: torch.log_softmax(x, dim=-1).

One pass over HBM: each program loads ROWS whole rows into registers as a (ROWS, BLOCK_N) tile, computes (x - max) -
log(sum(exp(x - max))) in fp32 and writes the rows back. Subtracting the row maximum first keeps exp() from
overflowing (the standard safe softmax). Padding lanes load -inf, so they add exp(-inf) = 0 to the sums. On the GPU
ROWS = 1 (one program per row, 8 warps); under the CPU interpreter ROWS = 64 (its cost grows with the number of
programs).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def log_softmax_kernel(x_ptr, y_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf"))
    z = x - tl.max(x, axis=1)[:, None]
    e = tl.exp(z)
    y = z - tl.log(tl.sum(e, axis=1))[:, None]
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        y = torch.empty_like(x)
        ROWS = 1 if x.is_cuda else 64
        log_softmax_kernel[(triton.cdiv(n_rows, ROWS),)](
            x, y, n_rows, n_cols, ROWS=ROWS, BLOCK_N=triton.next_power_of_2(n_cols),
            num_warps=8 if x.is_cuda else 4)
        return y
