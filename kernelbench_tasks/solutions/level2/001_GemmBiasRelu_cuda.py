"""CUDA solution for level2/001_GemmBiasRelu: y = relu(x @ W^T + b) in one kernel.

A shared-memory tiled SGEMM (64 x 64 output tile per block of 256 threads, 4 x 4 outputs per thread, K staged 16 at
a time) whose epilogue adds the bias and applies the activation while the results are still in registers, so the
output is written once. W is nn.Linear's (out, in) weight, read transposed while it is staged into shared memory (no
transposed copy). fp32 FMAs throughout, no TF32 (the fp32 tolerance is 1e-4). The module keeps the nn.Linear only as
the holder of W and b (same names and initialisation as the reference); forward never calls it.
"""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

// Tiled fp32 GEMM: each 16 x 16 block computes a 64 x 64 tile of C, each thread a 4 x 4 sub-tile at rows
// ty + 16 i and columns tx + 16 j (strided so that shared-memory reads are conflict-free and stores coalesced).
// K is walked in steps of 16: the A and B tiles are staged in shared memory, then every thread does 4 x 4 fp32
// FMAs per k. TRANS_B: B is given as (N, K) row-major (an nn.Linear weight) and read as its transpose.
constexpr int TILE = 64, TK = 16, THREADS = 16;

template <bool TRANS_B>
__device__ void gemm_tile(const float* __restrict__ A, const float* __restrict__ B, int M, int N, int K,
                          float acc[4][4]) {
    __shared__ float As[TILE][TK + 1];      // +1 column of padding: no bank conflicts on the transposed store
    __shared__ float Bs[TK][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * THREADS + tx;
    const int m0 = blockIdx.y * TILE, n0 = blockIdx.x * TILE;
    for (int k0 = 0; k0 < K; k0 += TK) {
        // 64 x 16 elements per tile, 256 threads: 4 loads each (out-of-range elements read as 0).
        for (int e = tid; e < TILE * TK; e += THREADS * THREADS) {
            int r = e / TK, c = e % TK;
            int m = m0 + r, k = k0 + c;
            As[r][c] = (m < M && k < K) ? A[(int64_t)m * K + k] : 0.0f;
            if (TRANS_B) {
                int n = n0 + r;
                Bs[c][r] = (n < N && k < K) ? B[(int64_t)n * K + k] : 0.0f;
            }
        }
        if (!TRANS_B) {
            for (int e = tid; e < TILE * TK; e += THREADS * THREADS) {
                int r = e / TILE, c = e % TILE;
                int k = k0 + r, n = n0 + c;
                Bs[r][c] = (k < K && n < N) ? B[(int64_t)k * N + n] : 0.0f;
            }
        }
        __syncthreads();
        for (int kk = 0; kk < TK; ++kk) {
            float a[4], b[4];
            for (int i = 0; i < 4; ++i) a[i] = As[ty + THREADS * i][kk];
            for (int j = 0; j < 4; ++j) b[j] = Bs[kk][tx + THREADS * j];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
}

__global__ void gemm_bias_relu_kernel(const float* __restrict__ X, const float* __restrict__ W,
                             const float* __restrict__ bias, float* __restrict__ Y, int M, int N, int K) {
    float acc[4][4] = {};
    gemm_tile<true>(X, W, M, N, K, acc);
    for (int i = 0; i < 4; ++i) {
        int m = blockIdx.y * TILE + threadIdx.y + THREADS * i;
        for (int j = 0; j < 4; ++j) {
            int n = blockIdx.x * TILE + threadIdx.x + THREADS * j;
            if (m < M && n < N) {
                float v = acc[i][j] + bias[n];
                Y[(int64_t)m * N + n] = fmaxf(v, 0.0f);
            }
        }
    }
}

torch::Tensor gemm_bias_relu_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "shapes must be (M, K) and (N, K)");
    x = x.contiguous();
    w = w.contiguous();
    b = b.contiguous();
    int M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    dim3 block(THREADS, THREADS);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();   // PyTorch's current stream
    gemm_bias_relu_kernel<<<grid, block, 0, stream>>>(x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                                  y.data_ptr<float>(), M, N, K);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "gemm_bias_relu_kernel launch failed: ", cudaGetErrorString(err));
    return y;
}
"""
cpp_source = "torch::Tensor gemm_bias_relu_forward(torch::Tensor x, torch::Tensor w, torch::Tensor b);"

gemm_bias_relu_ext = load_inline(
    name="kz_golden_l2_001_gemm_bias_relu_cuda", cpp_sources=cpp_source, cuda_sources=cuda_source,
    functions=["gemm_bias_relu_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gemm_bias_relu_ext.gemm_bias_relu_forward(x, self.gemm.weight, self.gemm.bias)
