"""CUDA solution for level1/013_RMSNorm: y = x / sqrt(mean(x^2, dim=-1) + eps).

One block of 256 threads per row: a strided sweep accumulates x^2 in fp32, a warp-shuffle block reduction gives the
mean, and a second sweep (L1/L2 hits: the row is 8 KB) writes x / sqrt(mean + eps), dividing like the reference.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

// Warp and block sums: every thread of the block gets the result; blockDim.x must be a multiple of 32.
__device__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
    return v;
}

__device__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = (lane < blockDim.x / 32) ? partial[lane] : 0.0f;
    v = warp_sum(v);
    __syncthreads();  // partial[] is reused by the next call
    return v;
}

__global__ void rms_norm_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n_cols, float eps) {
    const float* xrow = x + (int64_t)blockIdx.x * n_cols;
    float* yrow = y + (int64_t)blockIdx.x * n_cols;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) ss += xrow[c] * xrow[c];
    float rms = sqrtf(block_sum(ss) / n_cols + eps);
    for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) yrow[c] = xrow[c] / rms;
}

torch::Tensor rms_norm_forward(torch::Tensor x, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    int64_t n_cols = x.size(-1);
    int64_t n_rows = x.numel() / n_cols;
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();   // PyTorch's current stream
    rms_norm_kernel<<<(unsigned)n_rows, 256, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n_cols, (float)eps);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "rms_norm_kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""
cpp_source = "torch::Tensor rms_norm_forward(torch::Tensor x, double eps);"

rms_norm_ext = load_inline(
    name="kz_golden_l1_013_rms_norm_cuda", cpp_sources=cpp_source, cuda_sources=cuda_source,
    functions=["rms_norm_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_ext.rms_norm_forward(x, self.eps)
