"""Triton solution for level2/001_GemmBiasRelu: y = relu(x @ W^T + b) in one kernel.

A tiled GEMM (Triton tutorial 03) whose epilogue adds the bias and applies the activation while the output tile is
still in registers: C is written once and never re-read. W is nn.Linear's (out, in) weight, read as W^T through its
strides, without a transposed copy. The module keeps the nn.Linear only as the holder of W and b (same names and
initialisation as the reference); forward never calls it. tl.dot(..., input_precision="ieee"): by default tl.dot
rounds fp32 inputs to TF32 (~1e-3 relative error), which fails the fp32 tolerance of 1e-4 on the GPU; the CPU
interpreter is exact either way. Tiles: 128 x 128 x 32 with 8 warps on the GPU; 512 x 512 x 512 under the
interpreter (few programs, its cost).
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def gemm_bias_act_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                         stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr):
    # Grouped ordering: consecutive program ids walk down GROUP_M row-tiles, sharing W tiles in L2.
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
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    # (BLOCK_K, BLOCK_N) tile of W^T: element (k, n) is W[n, k].
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(x_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] + k0 < K), other=0.0)
        w = tl.load(w_ptrs, mask=(offs_k[:, None] + k0 < K) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, w, input_precision="ieee")
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
    bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)
    acc += bias[None, :]
    acc = tl.maximum(acc, 0.0)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    tl.store(y_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.gemm.weight, self.gemm.bias
        M, K = x.shape
        N = w.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=x.dtype)
        if x.is_cuda:
            BM, BN, BK, warps, stages = 128, 128, 32, 8, 3
        else:
            BM, BN, BK, warps, stages = 512, 512, 512, 4, 1
        grid = (triton.cdiv(M, BM) * triton.cdiv(N, BN),)
        gemm_bias_act_kernel[grid](x, w, b, y, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                                   y.stride(0), y.stride(1), BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=8,
                                   num_warps=warps, num_stages=stages)
        return y
