"""CUDA solution for level1/008_SumDim: torch.sum(x, dim, keepdim=True) for any dim.

x is viewed as (outer, R, inner), R the reduced size. A block of 32 x 8 threads owns one `outer` index and 32
neighbouring `inner` columns: threadIdx.x walks the columns (each warp's loads are 32 consecutive floats,
coalesced), threadIdx.y splits R into 8 interleaved slices, and the 8 partial sums per column are added in shared
memory. All sums are fp32.
"""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

constexpr int COLS = 32;   // inner columns per block (threadIdx.x)
constexpr int SLICES = 8;  // R slices per block (threadIdx.y)

__global__ void sum_dim_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t R, int64_t inner) {
    __shared__ float partial[SLICES][COLS];
    int64_t o = blockIdx.y;
    int64_t col = (int64_t)blockIdx.x * COLS + threadIdx.x;
    float acc = 0.0f;
    if (col < inner) {
        const float* base = x + o * R * inner + col;
        for (int64_t r = threadIdx.y; r < R; r += SLICES) acc += base[r * inner];
    }
    partial[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < inner) {
        float total = 0.0f;
        for (int s = 0; s < SLICES; ++s) total += partial[s][threadIdx.x];
        y[o * inner + col] = total;
    }
}

torch::Tensor sum_dim_forward(torch::Tensor x, int64_t outer, int64_t R, int64_t inner) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    x = x.contiguous();
    auto y = torch::empty({outer, inner}, x.options());
    dim3 block(COLS, SLICES);
    dim3 grid((unsigned)((inner + COLS - 1) / COLS), (unsigned)outer);
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();   // PyTorch's current stream
    sum_dim_kernel<<<grid, block, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), R, inner);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "sum_dim_kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""
cpp_source = "torch::Tensor sum_dim_forward(torch::Tensor x, int64_t outer, int64_t R, int64_t inner);"

sum_dim_ext = load_inline(
    name="kz_golden_l1_008_sum_dim_cuda", cpp_sources=cpp_source, cuda_sources=cuda_source,
    functions=["sum_dim_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.dim % x.dim()
        outer, R, inner = math.prod(x.shape[:dim]), x.shape[dim], math.prod(x.shape[dim + 1:])
        out_shape = list(x.shape)
        out_shape[dim] = 1
        return sum_dim_ext.sum_dim_forward(x, outer, R, inner).view(out_shape)
