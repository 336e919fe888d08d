"""Triton solution for level2/002_MatmulSoftmax: y = softmax(A @ B, dim=-1).

Two kernels: a tiled GEMM (Triton tutorial 03) writes the logits, then a row softmax overwrites them in place (one
read and one write per logit; a single fused kernel would need whole 2048-wide rows of C per program). The softmax
subtracts the row maximum before exp() so that it never overflows. tl.dot(..., input_precision="ieee"): by default
tl.dot rounds fp32 inputs to TF32 (~1e-3 relative error), which fails the fp32 tolerance of 1e-4 on the GPU; the CPU
interpreter is exact either way. GPU: 128 x 128 x 32 GEMM tiles, one softmax program per row. CPU interpreter (cost
grows with the number of programs): 512 x 512 x 512 tiles, 64 rows per softmax program.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped ordering: consecutive program ids walk down GROUP_M row-tiles, sharing B tiles in L2.
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    group_size = GROUP_M * num_pid_n
    first_m = (pid // group_size) * GROUP_M
    group_m = min(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_size) % group_m
    pid_n = (pid % group_size) // group_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] + k0 < K) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def softmax_rows_inplace_kernel(y_ptr, n_rows, n_cols, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    z = tl.load(y_ptr + offs, mask=mask, other=-float("inf"))
    e = tl.exp(z - tl.max(z, axis=1)[:, None])
    tl.store(y_ptr + offs, e / tl.sum(e, axis=1)[:, None], mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        M, K = A.shape
        N = B.shape[1]
        y = torch.empty((M, N), device=A.device, dtype=A.dtype)
        if A.is_cuda:
            BM, BN, BK, warps, stages, ROWS = 128, 128, 32, 8, 3, 1
        else:
            BM, BN, BK, warps, stages, ROWS = 512, 512, 512, 4, 1, 64
        grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
        matmul_kernel[grid](A, B, y, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
                            y.stride(0), y.stride(1), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=8,
                            num_warps=warps, num_stages=stages)
        softmax_rows_inplace_kernel[(triton.cdiv(M, ROWS),)](
            y, M, N, ROWS=ROWS, BLOCK_N=triton.next_power_of_2(N), num_warps=8 if A.is_cuda else 4)
        return y
