"""Triton solution for level2/005_SiluMulSum: y = sum(silu(x) * g, dim=-1).

One kernel, no temporaries: each program loads ROWS rows of x and g as (ROWS, BLOCK_N) tiles, forms silu(x) * g = x
* g / (1 + exp(-x)) in registers and reduces each row in fp32. Padding lanes load 0 and add 0. On the GPU ROWS = 1
(one program per row, 8 warps); under the CPU interpreter ROWS = 64.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def silu_mul_sum_kernel(x_ptr, g_ptr, y_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + rows, tl.sum(x / (1.0 + tl.exp(-x)) * g, axis=1), mask=rows < n_rows)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        x, g = x.contiguous(), g.contiguous()
        n_cols = x.shape[-1]
        n_rows = x.numel() // n_cols
        y = torch.empty(x.shape[:-1], device=x.device, dtype=x.dtype)
        ROWS = 1 if x.is_cuda else 64
        silu_mul_sum_kernel[(triton.cdiv(n_rows, ROWS),)](
            x, g, y, n_rows, n_cols, ROWS=ROWS, BLOCK_N=triton.next_power_of_2(n_cols),
            num_warps=8 if x.is_cuda else 4)
        return y
