"""CUDA solution for level1/015_CumSum: torch.cumsum(x, dim=-1).

One block of 1024 threads per row. Each thread owns `per_thread` consecutive elements (4 for rows of 4096): it sums
them, the block computes an exclusive scan of the thread totals (an inclusive warp scan with __shfl_up_sync, then a
scan of the 32 warp totals by warp 0), and each thread rewrites its elements as its offset plus a local running sum.
Sequential runs are short and the cross-thread part is a tree, so the fp32 rounding error stays far below the
tolerance even for long rows.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

constexpr int THREADS = 1024;

__device__ float warp_inclusive_scan(float v) {
    int lane = threadIdx.x % 32;
    for (int offset = 1; offset < 32; offset <<= 1) {
        float up = __shfl_up_sync(0xffffffff, v, offset);
        if (lane >= offset) v += up;
    }
    return v;
}

__global__ void cumsum_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n_cols,
                              int64_t per_thread) {
    __shared__ float warp_totals[THREADS / 32];
    const float* xrow = x + (int64_t)blockIdx.x * n_cols;
    float* yrow = y + (int64_t)blockIdx.x * n_cols;
    int64_t begin = threadIdx.x * per_thread;
    int64_t end = min(begin + per_thread, n_cols);
    float local = 0.0f;
    for (int64_t c = begin; c < end; ++c) local += xrow[c];

    // Exclusive prefix of the thread totals across the block.
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float inclusive = warp_inclusive_scan(local);
    if (lane == 31) warp_totals[warp] = inclusive;
    __syncthreads();
    if (warp == 0) warp_totals[lane] = warp_inclusive_scan(warp_totals[lane]);
    __syncthreads();
    float running = inclusive - local + (warp > 0 ? warp_totals[warp - 1] : 0.0f);

    for (int64_t c = begin; c < end; ++c) {
        running += xrow[c];
        yrow[c] = running;
    }
}

torch::Tensor cumsum_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    int64_t n_cols = x.size(-1);
    int64_t n_rows = x.numel() / n_cols;
    int64_t per_thread = (n_cols + THREADS - 1) / THREADS;
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();   // PyTorch's current stream
    cumsum_kernel<<<(unsigned)n_rows, THREADS, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n_cols,
                                                            per_thread);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "cumsum_kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""
cpp_source = "torch::Tensor cumsum_forward(torch::Tensor x);"

cumsum_ext = load_inline(
    name="kz_golden_l1_015_cumsum_cuda", cpp_sources=cpp_source, cuda_sources=cuda_source,
    functions=["cumsum_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cumsum_ext.cumsum_forward(x)
