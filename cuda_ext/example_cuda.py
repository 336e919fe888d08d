"""One-shot example for the Coder's prompt (CUDA): ModelNew for cuda_ext/example_ref.py, an elementwise add kernel
compiled with torch.utils.cpp_extension.load_inline (KernelBench style, except that the kernel launches on
PyTorch's current stream: the harness can then time it as a CUDA graph replay)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <c10/cuda/CUDAStream.h>

__global__ void elementwise_add_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                       float* __restrict__ out, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = a[i] + b[i];
    }
}

torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32 && b.scalar_type() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(a.sizes() == b.sizes(), "inputs must have the same shape");
    a = a.contiguous();
    b = b.contiguous();
    auto out = torch::empty_like(a);
    int64_t n = a.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    // launch on PyTorch's current stream (not the legacy default stream): ordered with PyTorch's own work, and
    // a CUDA graph can capture it
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    elementwise_add_kernel<<<blocks, threads, 0, stream>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                                           out.data_ptr<float>(), n);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "kernel launch failed: ", cudaGetErrorString(err));
    return out;
}
"""

cpp_source = "torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b);"

elementwise_add = load_inline(
    name="elementwise_add",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["elementwise_add_cuda"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return elementwise_add.elementwise_add_cuda(a, b)
