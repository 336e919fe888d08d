"""CUDA solution for level1/012_LayerNorm: nn.LayerNorm over the last dimension (weight, bias, eps 1e-5).

One block of 256 threads per row, two-pass statistics: the mean first, then the biased variance of (x - mean) (the
one-pass E[x^2] - E[x]^2 loses digits when the mean is large compared with the spread), then a third sweep writes (x
- mean) * rstd * weight + bias. The row is 8 KB, so the second and third sweeps read L1/L2, not HBM. The module
keeps an nn.LayerNorm only as the holder of its weight and bias (same names and initialisation as the reference);
forward never calls it.
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

__global__ void layer_norm_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                  const float* __restrict__ b, float* __restrict__ y, int64_t n_cols, float eps) {
    const float* xrow = x + (int64_t)blockIdx.x * n_cols;
    float* yrow = y + (int64_t)blockIdx.x * n_cols;
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) s += xrow[c];
    float mean = block_sum(s) / n_cols;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) {
        float d = xrow[c] - mean;
        ss += d * d;
    }
    float rstd = 1.0f / sqrtf(block_sum(ss) / n_cols + eps);
    for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) yrow[c] = (xrow[c] - mean) * rstd * w[c] + b[c];
}

torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    x = x.contiguous();
    w = w.contiguous();
    b = b.contiguous();
    auto y = torch::empty_like(x);
    int64_t n_cols = x.size(-1);
    int64_t n_rows = x.numel() / n_cols;
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();   // PyTorch's current stream
    layer_norm_kernel<<<(unsigned)n_rows, 256, 0, stream>>>(x.data_ptr<float>(), w.data_ptr<float>(),
                                                            b.data_ptr<float>(), y.data_ptr<float>(), n_cols,
                                                            (float)eps);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "layer_norm_kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""
cpp_source = "torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, double eps);"

layer_norm_ext = load_inline(
    name="kz_golden_l1_012_layer_norm_cuda", cpp_sources=cpp_source, cuda_sources=cuda_source,
    functions=["layer_norm_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_ext.layer_norm_forward(x, self.norm.weight, self.norm.bias, self.norm.eps)
