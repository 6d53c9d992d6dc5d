"""Matrix product a @ b in CUDA C++: shared-memory tiling, tensor cores (wmma) for fp16 and bf16,
IEEE fp32 FMAs for fp32.

Arithmetic. 2 * M * N * K FLOPs over at least (M * K + K * N + M * N) * elem_size bytes: compute-bound
for large matrices (4096^3 in fp16: 137 GFLOP over 100 MB). Tiling is what makes the bytes small:
a BM x BN output tile reads a BM x BK slice of a and a BK x BN slice of b per step into shared
memory, and every element loaded is used BN (or BM) times from there, so global traffic is
M * N * K * (1/BN + 1/BM) elements instead of 2 * M * N * K.

- fp16 / bf16: each warp owns a WM x WN piece of the tile as 16x16 wmma accumulator fragments in
  fp32; a and b tiles are staged in shared memory (rows padded by 8 elements against bank
  conflicts), multiplied on the tensor cores, and the fp32 tile is written back through shared
  memory and rounded once to the output dtype.
- fp32: no tensor cores (TF32 would round the inputs to 10 mantissa bits and fail the strict fp32
  tolerance): each thread accumulates a TM x TN register micro-tile with fmaf, its rows and columns
  strided across the tile so shared-memory reads are conflict-free and the stores coalesce.

Ragged edges are zero-filled on load and masked on store, so any M, N, K works (K = 1, M = 1).
"""
import torch

from harness.cuda_launcher import dtype_code, load_launcher

KERNEL_TYPE = "matmul"
BACKEND = "cuda"

TUNABLES = {"BLOCK_M": [32, 64, 128], "BLOCK_N": [32, 64, 128], "BLOCK_K": [8, 16, 32],
            "THREAD_M": [2, 4, 8], "THREAD_N": [2, 4, 8],
            "TC_BLOCK_M": [32, 64, 128], "TC_BLOCK_N": [32, 64, 128], "TC_BLOCK_K": [16, 32, 64],
            "TC_WARP_M": [16, 32, 64], "TC_WARP_N": [16, 32, 64]}
CONSTRAINTS = [
    "(BLOCK_M // THREAD_M) * (BLOCK_N // THREAD_N) >= 32",
    "(BLOCK_M // THREAD_M) * (BLOCK_N // THREAD_N) <= 1024",
    "BLOCK_K * (BLOCK_M + 4 + BLOCK_N) * 4 <= 49152",
    "TC_BLOCK_M % TC_WARP_M == 0", "TC_BLOCK_N % TC_WARP_N == 0",
    "(TC_BLOCK_M // TC_WARP_M) * (TC_BLOCK_N // TC_WARP_N) <= 32",
    "2 * (TC_BLOCK_M * (TC_BLOCK_K + 8) + TC_BLOCK_K * (TC_BLOCK_N + 8)) + 4 * TC_BLOCK_M * (TC_BLOCK_N + 4) <= 49152",
]
CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 16, "THREAD_M": 4, "THREAD_N": 4, "TC_BLOCK_M": 64, "TC_BLOCK_N": 64, "TC_BLOCK_K": 32, "TC_WARP_M": 32, "TC_WARP_N": 32}

CUDA_KERNELS = r'''
#include "autokernel_cuda.cuh"
#include <mma.h>

// fp32: thread (ty, tx) owns rows ty + i * (BM / TM) and columns tx + j * (BN / TN) of the tile.
template <int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
matmul_fp32_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int M, int N,
                   int K) {
  constexpr int ROWS = BM / TM, COLS = BN / TN, NT = ROWS * COLS;
  static_assert(BM % TM == 0 && BN % TN == 0, "tile sizes must divide");
  __shared__ float a_tile[BK][BM + 4];  // transposed, padded: a column of a is a row here
  __shared__ float b_tile[BK][BN];
  const int tid = threadIdx.x, tx = tid % COLS, ty = tid / COLS;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  float acc[TM][TN];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = tid; i < BM * BK; i += NT) {
      const int m = i / BK, k = i % BK, gm = row0 + m, gk = k0 + k;
      a_tile[k][m] = (gm < M && gk < K) ? a[(int64_t)gm * K + gk] : 0.f;
    }
    for (int i = tid; i < BK * BN; i += NT) {
      const int k = i / BN, n = i % BN, gk = k0 + k, gn = col0 + n;
      b_tile[k][n] = (gk < K && gn < N) ? b[(int64_t)gk * N + gn] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float av[TM], bv[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = a_tile[k][ty + i * ROWS];
#pragma unroll
      for (int j = 0; j < TN; ++j) bv[j] = b_tile[k][tx + j * COLS];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int gm = row0 + ty + i * ROWS;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int gn = col0 + tx + j * COLS;
      if (gm < M && gn < N) c[(int64_t)gm * N + gn] = acc[i][j];
    }
  }
}

// fp16 / bf16: warp (wm, wn) owns a WM x WN piece of the BM x BN tile as 16x16 fragments.
template <typename T, int BM, int BN, int BK, int WM, int WN>
__global__ void __launch_bounds__(32 * (BM / WM) * (BN / WN))
matmul_wmma_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ c, int M, int N, int K) {
  using namespace nvcuda;
  constexpr int WARPS_N = BN / WN, NT = 32 * (BM / WM) * WARPS_N, FM = WM / 16, FN = WN / 16;
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0,
                "wmma tiles are multiples of 16");
  // +8 elements per row: fragment loads hit different banks; rows stay 32-byte aligned for wmma.
  __shared__ __align__(32) T a_tile[BM][BK + 8];
  __shared__ __align__(32) T b_tile[BK][BN + 8];
  __shared__ __align__(32) float c_tile[BM][BN + 4];
  const int tid = threadIdx.x, warp = tid / 32, wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  const T zero = from_float<T>(0.f);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[FM][FN];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.f);
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = tid; i < BM * BK; i += NT) {
      const int m = i / BK, k = i % BK, gm = row0 + m, gk = k0 + k;
      a_tile[m][k] = (gm < M && gk < K) ? a[(int64_t)gm * K + gk] : zero;
    }
    for (int i = tid; i < BK * BN; i += NT) {
      const int k = i / BN, n = i % BN, gk = k0 + k, gn = col0 + n;
      b_tile[k][n] = (gk < K && gn < N) ? b[(int64_t)gk * N + gn] : zero;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> bf[FN];
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(af[i], &a_tile[wm * WM + i * 16][kk], BK + 8);
#pragma unroll
      for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(bf[j], &b_tile[kk][wn * WN + j * 16], BN + 8);
#pragma unroll
      for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], af[i], bf[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j)
      wmma::store_matrix_sync(&c_tile[wm * WM + i * 16][wn * WN + j * 16], acc[i][j], BN + 4, wmma::mem_row_major);
  __syncthreads();
  for (int i = tid; i < BM * BN; i += NT) {
    const int m = i / BN, n = i % BN, gm = row0 + m, gn = col0 + n;
    if (gm < M && gn < N) c[(int64_t)gm * N + gn] = from_float<T>(c_tile[m][n]);
  }
}

template <typename T>
static void launch_wmma(const void* a, const void* b, void* c, int M, int N, int K, cudaStream_t stream) {
  constexpr int threads = 32 * (TC_BLOCK_M / TC_WARP_M) * (TC_BLOCK_N / TC_WARP_N);
  const dim3 grid((N + TC_BLOCK_N - 1) / TC_BLOCK_N, (M + TC_BLOCK_M - 1) / TC_BLOCK_M);
  matmul_wmma_kernel<T, TC_BLOCK_M, TC_BLOCK_N, TC_BLOCK_K, TC_WARP_M, TC_WARP_N><<<grid, threads, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(c), M, N, K);
}

// a contiguous [M, K], b contiguous [K, N], c [M, N]; all of one dtype (DTYPE_*); K >= 1.
void matmul_launch(const void* a, const void* b, void* c, int M, int N, int K, int dtype, cudaStream_t stream) {
  if (dtype == DTYPE_F32) {
    constexpr int threads = (BLOCK_M / THREAD_M) * (BLOCK_N / THREAD_N);
    const dim3 grid((N + BLOCK_N - 1) / BLOCK_N, (M + BLOCK_M - 1) / BLOCK_M);
    matmul_fp32_kernel<BLOCK_M, BLOCK_N, BLOCK_K, THREAD_M, THREAD_N><<<grid, threads, 0, stream>>>(
        static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(c), M, N, K);
  } else if (dtype == DTYPE_F16) {
    launch_wmma<__half>(a, b, c, M, N, K, stream);
  } else if (dtype == DTYPE_BF16) {
    launch_wmma<__nv_bfloat16>(a, b, c, M, N, K, stream);
  }
}
'''


def kernel_fn(a, b):
    """a [..., K] @ b [K, N] -> [..., N] in a's dtype; leading dims of a are rows."""
    if a.dim() < 1 or b.dim() != 2 or a.shape[-1] != b.shape[0]:
        raise ValueError(f"matmul: shapes {tuple(a.shape)} and {tuple(b.shape)} do not multiply")
    if a.dtype != b.dtype:
        raise ValueError("matmul: a and b must share a dtype")
    code = dtype_code(a)
    K, N = b.shape
    M = a.numel() // K if K else 0
    out_shape = (*a.shape[:-1], N)
    if K == 0:
        return torch.zeros(out_shape, dtype=a.dtype, device=a.device)  # an empty sum is 0, as in torch
    c = torch.empty(out_shape, dtype=a.dtype, device=a.device)
    if c.numel() == 0:
        return c
    if max(M, N, K) >= 2**31:
        raise ValueError("matmul: too large")
    load_launcher(CUDA_KERNELS, CONFIG).matmul_launch(a.contiguous(), b.contiguous(), c, M, N, K, code, None)
    return c
