"""Triton solution for level1/013_RMSNorm: y = x / sqrt(mean(x^2, dim=-1) + eps).

Each program holds ROWS whole rows in registers as a (ROWS, BLOCK_N) tile: one read, one write per element. On the
GPU ROWS = 1 (one program per row, 8 warps); under the CPU interpreter ROWS = 64.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, y_ptr, n_rows, n_cols, eps, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    ms = tl.sum(x * x, axis=1) / n_cols
    # Divide by the same sqrt as the reference (not multiply by rsqrt): one rounding fewer.
    y = x / tl.sqrt(ms + eps)[:, None]
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        y = torch.empty_like(x)
        ROWS = 1 if x.is_cuda else 64
        rms_norm_kernel[(triton.cdiv(n_rows, ROWS),)](
            x, y, n_rows, n_cols, self.eps, ROWS=ROWS, BLOCK_N=triton.next_power_of_2(n_cols),
            num_warps=8 if x.is_cuda else 4)
        return y
