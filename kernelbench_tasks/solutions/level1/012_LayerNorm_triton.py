"""Triton solution for level1/012_LayerNorm: nn.LayerNorm over the last dimension (weight and bias, eps 1e-5).

Each program holds ROWS whole rows in registers as a (ROWS, BLOCK_N) tile and normalises them with the two-pass
formula: mean first, then the biased variance of (x - mean). The one-pass E[x^2] - E[x]^2 loses digits when the mean
is large compared with the spread. The module keeps an nn.LayerNorm only as the holder of its weight and bias (same
names and initialisation as the reference); forward never calls it. On the GPU ROWS = 1 (one program per row, 8
warps); under the CPU interpreter ROWS = 64.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, y_ptr, n_rows, n_cols, eps,
                      ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    mask = (rows[:, None] < n_rows) & col_mask[None, :]
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    mean = tl.sum(x, axis=1) / n_cols
    # Padding lanes must not contribute (x - mean)^2 = mean^2 to the variance.
    d = tl.where(mask, x - mean[:, None], 0.0)
    var = tl.sum(d * d, axis=1) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=col_mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=col_mask, other=0.0)
    y = d * rstd[:, None] * w[None, :] + b[None, :]
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        y = torch.empty_like(x)
        ROWS = 1 if x.is_cuda else 64
        layer_norm_kernel[(triton.cdiv(n_rows, ROWS),)](
            x, self.norm.weight, self.norm.bias, y, n_rows, n_cols, self.norm.eps,
            ROWS=ROWS, BLOCK_N=triton.next_power_of_2(n_cols), num_warps=8 if x.is_cuda else 4)
        return y
