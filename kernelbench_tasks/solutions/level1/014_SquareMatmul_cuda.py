"""CUDA solution for level1/014_SquareMatmul: C = A @ B in fp32.

A classic shared-memory tiled SGEMM (64 x 64 output tile per block of 256 threads, 4 x 4 outputs per thread, K
staged 16 at a time), fp32 FMAs throughout: no TF32 (the fp32 tolerance is 1e-4). It is far simpler than cuBLAS (no
double buffering, no vector loads, no warp tiling) and slower: a correct baseline and a teaching example rather than
a speed record.
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

__global__ void matmul_kernel(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                              int M, int N, int K) {
    float acc[4][4] = {};
    gemm_tile<false>(A, B, M, N, K, acc);
    for (int i = 0; i < 4; ++i) {
        int m = blockIdx.y * TILE + threadIdx.y + THREADS * i;
        for (int j = 0; j < 4; ++j) {
            int n = blockIdx.x * TILE + threadIdx.x + THREADS * j;
            if (m < M && n < N) C[(int64_t)m * N + n] = acc[i][j];
        }
    }
}

torch::Tensor matmul_forward(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda() && A.scalar_type() == torch::kFloat32 &&
                B.scalar_type() == torch::kFloat32, "A and B must be float32 CUDA tensors");
    TORCH_CHECK(A.dim() == 2 && B.dim() == 2 && A.size(1) == B.size(0), "shapes must be (M, K) and (K, N)");
    A = A.contiguous();
    B = B.contiguous();
    int M = A.size(0), K = A.size(1), N = B.size(1);
    auto C = torch::empty({M, N}, A.options());
    dim3 block(THREADS, THREADS);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream();   // PyTorch's current stream
    matmul_kernel<<<grid, block, 0, stream>>>(A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), M, N, K);
    cudaError_t err = cudaGetLastError();
    TORCH_CHECK(err == cudaSuccess, "matmul_kernel launch failed: ", cudaGetErrorString(err));
    return C;
}
"""
cpp_source = "torch::Tensor matmul_forward(torch::Tensor A, torch::Tensor B);"

matmul_ext = load_inline(
    name="kz_golden_l1_014_square_matmul_cuda", cpp_sources=cpp_source, cuda_sources=cuda_source,
    functions=["matmul_forward"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return matmul_ext.matmul_forward(A, B)
