"""CUDA solution for level1/004_Tanh: tanh.

One elementwise kernel, one thread per element (256 threads per block), computed in fp32 with the accurate CUDA math
functions (no --use_fast_math: the fp32 tolerance is 1e-4). The extension is built once at import with
torch.utils.cpp_extension.load_inline; the harness caches builds by source hash.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__global__ void tanh_kernel(const float* __restrict__ x, float* __restrict__ y,
                            int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        y[i] = tanhf(v);
    }
}

torch::Tensor tanh_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();   // PyTorch's current stream
    tanh_kernel<<<blocks, threads, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "tanh_kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""
cpp_source = "torch::Tensor tanh_forward(torch::Tensor x);"

tanh_ext = load_inline(
    name="kz_golden_l1_004_tanh_cuda", cpp_sources=cpp_source, cuda_sources=cuda_source,
    functions=["tanh_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return tanh_ext.tanh_forward(x)
