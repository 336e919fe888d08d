"""Triton solution for level2/004_ResidualRMSNorm: h = x + residual; y = h / sqrt(mean(h^2) + eps) * weight.

One kernel: each program loads ROWS rows of x and residual as (ROWS, BLOCK_N) tiles, forms h in registers (h is
never written to memory), reduces mean(h^2) in fp32 and writes the scaled rows. The weight is the module's own
nn.Parameter, initialised exactly as in the reference. On the GPU ROWS = 1 (one program per row, 8 warps); under the
CPU interpreter ROWS = 64.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def residual_rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, n_rows, n_cols, eps,
                             ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    mask = (rows[:, None] < n_rows) & col_mask[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]
    h = tl.load(x_ptr + offs, mask=mask, other=0.0) + tl.load(r_ptr + offs, mask=mask, other=0.0)
    ms = tl.sum(h * h, axis=1) / n_cols
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0)
    y = h / tl.sqrt(ms + eps)[:, None] * w[None, :]
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.cos(torch.arange(hidden, dtype=torch.float32)))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        x, residual = x.contiguous(), residual.contiguous()
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        y = torch.empty_like(x)
        ROWS = 1 if x.is_cuda else 64
        residual_rms_norm_kernel[(triton.cdiv(n_rows, ROWS),)](
            x, residual, self.weight, y, n_rows, n_cols, self.eps,
            ROWS=ROWS, BLOCK_N=triton.next_power_of_2(n_cols), num_warps=8 if x.is_cuda else 4)
        return y
