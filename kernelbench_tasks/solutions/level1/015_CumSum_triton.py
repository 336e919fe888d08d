"""Triton solution for level1/015_CumSum: torch.cumsum(x, dim=-1).

Each program scans ROWS rows left to right in BLOCK-wide chunks: tl.cumsum gives the prefix sums inside a chunk and
a per-row running total (`carry`, fp32) is added to them, then grows by the chunk's sum. On the GPU one program
scans one row with a 1-D block of 1024 (`cumsum_row_kernel`, 4 chunks per row of 4096; Triton 3.6 fails to lower
a (1, BLOCK) scan, "PassManager::run failed" in make_ttgir); tl.cumsum is a tree scan there, accurate to a few
ulps. Under the CPU interpreter tl.cumsum is numpy's sequential fp32 cumsum, whose error grows with the chunk length
(~3e-4 over 4096 randn values, past the 1e-4 tolerance), so the chunks are kept short (256) and the rows per program
many (64).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def cumsum_kernel(x_ptr, y_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_mask = rows < n_rows
    carry = tl.zeros((ROWS,), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = row_mask[:, None] & (cols[None, :] < n_cols)
        offs = rows[:, None] * n_cols + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        tl.store(y_ptr + offs, tl.cumsum(x, axis=1) + carry[:, None], mask=mask)
        carry += tl.sum(x, axis=1)


@triton.jit
def cumsum_row_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row_start = tl.program_id(0).to(tl.int64) * n_cols   # 32M elements: int64 offsets
    carry = tl.zeros((1,), dtype=tl.float32)
    for c0 in range(0, n_cols, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row_start + cols, mask=mask, other=0.0)
        tl.store(y_ptr + row_start + cols, tl.cumsum(x, axis=0) + carry, mask=mask)
        carry += tl.sum(x, axis=0)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        y = torch.empty_like(x)
        if x.is_cuda:
            cumsum_row_kernel[(n_rows,)](x, y, n_cols, BLOCK=1024)
            return y
        ROWS, BLOCK = 64, 256
        cumsum_kernel[(triton.cdiv(n_rows, ROWS),)](x, y, n_rows, n_cols, ROWS=ROWS, BLOCK=BLOCK)
        return y
