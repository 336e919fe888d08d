"""CUDA solution for level2/004_ResidualRMSNorm: h = x + residual; y = h / sqrt(mean(h^2) + eps) * weight.

One block of 256 threads per row and h is never written to memory: the first sweep forms h = x + r and accumulates
h^2 in fp32, a warp-shuffle block reduction gives the mean, and the second sweep recomputes h (its reads hit L1/L2:
rows are 8 KB) and writes h / rms * weight. The weight is the module's own nn.Parameter, initialised exactly as in
the reference.
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

__global__ void residual_rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ r,
                                         const float* __restrict__ w, float* __restrict__ y, int64_t n_cols,
                                         float eps) {
    int64_t offset = (int64_t)blockIdx.x * n_cols;
    float ss = 0.0f;
    for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) {
        float h = x[offset + c] + r[offset + c];
        ss += h * h;
    }
    float rms = sqrtf(block_sum(ss) / n_cols + eps);
    for (int64_t c = threadIdx.x; c < n_cols; c += blockDim.x) {
        float h = x[offset + c] + r[offset + c];
        y[offset + c] = h / rms * w[c];
    }
}

torch::Tensor residual_rms_norm_forward(torch::Tensor x, torch::Tensor r, torch::Tensor w, double eps) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.sizes() == r.sizes(), "x and residual must have the same shape");
    x = x.contiguous();
    r = r.contiguous();
    w = w.contiguous();
    auto y = torch::empty_like(x);
    int64_t n_cols = x.size(-1);
    int64_t n_rows = x.numel() / n_cols;
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();   // PyTorch's current stream
    residual_rms_norm_kernel<<<(unsigned)n_rows, 256, 0, stream>>>(x.data_ptr<float>(), r.data_ptr<float>(),
                                                        w.data_ptr<float>(), y.data_ptr<float>(), n_cols,
                                                        (float)eps);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "residual_rms_norm_kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""
cpp_source = "torch::Tensor residual_rms_norm_forward(torch::Tensor x, torch::Tensor r, torch::Tensor w, double eps);"

residual_rms_norm_ext = load_inline(
    name="kz_golden_l2_004_residual_rms_norm_cuda", cpp_sources=cpp_source, cuda_sources=cuda_source,
    functions=["residual_rms_norm_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.cos(torch.arange(hidden, dtype=torch.float32)))

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return residual_rms_norm_ext.residual_rms_norm_forward(x, residual, self.weight, self.eps)
