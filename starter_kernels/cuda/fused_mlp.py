"""The SwiGLU MLP of LLaMA-style models in CUDA C++: (silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T.

Arithmetic. 6 * M * D * F FLOPs (three products) plus 4 * M * F for the SiLU and the product, over
at least (2 * M * D + 3 * D * F) * elem_size bytes of inputs and output: compute-bound for LLaMA-7B
shapes (M=4096, D=4096, F=11008: 1.1 TFLOP). Two kernels:

1. gate/up: one tiled product against both weight matrices at once. Each x tile is loaded into
   shared memory once and multiplied by the matching w_gate and w_up tiles, into two accumulators;
   the epilogue computes silu(g) * u in fp32 and writes h [M, F] once. Against three separate
   kernels this saves reading x twice and writing and re-reading g and u: 4 * M * F elements.
2. down: h @ w_down.T with the same tiled kernel, one accumulator.

Both are "NT" products (the weights are nn.Linear [out, in], so the reduction runs along rows of
both operands). fp16 / bf16 run on the tensor cores (wmma 16x16x16, fp32 accumulators; h is stored
in the input dtype, as PyTorch's eager MLP stores it); fp32 uses IEEE fp32 fmaf in registers (no
TF32) and keeps h in fp32.
"""
import torch

from harness.cuda_launcher import dtype_code, load_launcher

KERNEL_TYPE = "fused_mlp"
BACKEND = "cuda"

TUNABLES = {"BLOCK_M": [32, 64, 128], "BLOCK_N": [32, 64, 128], "BLOCK_K": [8, 16, 32],
            "THREAD_M": [2, 4, 8], "THREAD_N": [2, 4, 8],
            "TC_BLOCK_M": [32, 64, 128], "TC_BLOCK_N": [32, 64, 128], "TC_BLOCK_K": [16, 32, 64],
            "TC_WARP_M": [16, 32, 64], "TC_WARP_N": [16, 32, 64]}
CONSTRAINTS = [
    "(BLOCK_M // THREAD_M) * (BLOCK_N // THREAD_N) >= 32",
    "(BLOCK_M // THREAD_M) * (BLOCK_N // THREAD_N) <= 1024",
    "BLOCK_K * (BLOCK_M + 2 * BLOCK_N + 12) * 4 <= 49152",
    "TC_BLOCK_M % TC_WARP_M == 0", "TC_BLOCK_N % TC_WARP_N == 0",
    "(TC_BLOCK_M // TC_WARP_M) * (TC_BLOCK_N // TC_WARP_N) <= 32",
    "2 * (TC_BLOCK_M + 2 * TC_BLOCK_N) * (TC_BLOCK_K + 8) + 4 * TC_BLOCK_M * (TC_BLOCK_N + 4) <= 49152",
]
CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 16, "THREAD_M": 4, "THREAD_N": 4, "TC_BLOCK_M": 64, "TC_BLOCK_N": 64, "TC_BLOCK_K": 32, "TC_WARP_M": 32, "TC_WARP_N": 32}

CUDA_KERNELS = r'''
#include "autokernel_cuda.cuh"
#include <mma.h>

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// c[m, n] = sum_k a[m, k] * b0[n, k]; GATED: silu(that) * sum_k a[m, k] * b1[n, k].
// fp32: thread (ty, tx) owns rows ty + i * (BM / TM) and columns tx + j * (BN / TN) of the tile.
template <bool GATED, int BM, int BN, int BK, int TM, int TN>
__global__ void __launch_bounds__((BM / TM) * (BN / TN))
mlp_fp32_kernel(const float* __restrict__ a, const float* __restrict__ b0, const float* __restrict__ b1,
                float* __restrict__ c, int M, int N, int K) {
  constexpr int ROWS = BM / TM, COLS = BN / TN, NT = ROWS * COLS;
  static_assert(BM % TM == 0 && BN % TN == 0, "tile sizes must divide");
  __shared__ float a_tile[BK][BM + 4];  // all transposed (k-major), padded
  __shared__ float b0_tile[BK][BN + 4];
  __shared__ float b1_tile[GATED ? BK : 1][BN + 4];
  const int tid = threadIdx.x, tx = tid % COLS, ty = tid / COLS;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  float acc0[TM][TN], acc1[GATED ? TM : 1][GATED ? TN : 1];
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      acc0[i][j] = 0.f;
      if (GATED) acc1[i][j] = 0.f;
    }
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = tid; i < BM * BK; i += NT) {
      const int m = i / BK, k = i % BK, gm = row0 + m, gk = k0 + k;
      a_tile[k][m] = (gm < M && gk < K) ? a[(int64_t)gm * K + gk] : 0.f;
    }
    for (int i = tid; i < BN * BK; i += NT) {
      const int n = i / BK, k = i % BK, gn = col0 + n, gk = k0 + k;
      const bool in = gn < N && gk < K;
      b0_tile[k][n] = in ? b0[(int64_t)gn * K + gk] : 0.f;
      if (GATED) b1_tile[k][n] = in ? b1[(int64_t)gn * K + gk] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < BK; ++k) {
      float av[TM];
#pragma unroll
      for (int i = 0; i < TM; ++i) av[i] = a_tile[k][ty + i * ROWS];
#pragma unroll
      for (int j = 0; j < TN; ++j) {
        const float bv0 = b0_tile[k][tx + j * COLS];
        const float bv1 = GATED ? b1_tile[k][tx + j * COLS] : 0.f;
#pragma unroll
        for (int i = 0; i < TM; ++i) {
          acc0[i][j] = fmaf(av[i], bv0, acc0[i][j]);
          if (GATED) acc1[i][j] = fmaf(av[i], bv1, acc1[i][j]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i) {
    const int gm = row0 + ty + i * ROWS;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int gn = col0 + tx + j * COLS;
      if (gm < M && gn < N) c[(int64_t)gm * N + gn] = GATED ? silu(acc0[i][j]) * acc1[i][j] : acc0[i][j];
    }
  }
}

// fp16 / bf16: warp (wm, wn) owns a WM x WN piece of the BM x BN tile as 16x16 fragments. A b tile
// is kept as rows of b ([n][k]), which is the k x n operand in column-major order.
template <typename T, bool GATED, int BM, int BN, int BK, int WM, int WN>
__global__ void __launch_bounds__(32 * (BM / WM) * (BN / WN))
mlp_wmma_kernel(const T* __restrict__ a, const T* __restrict__ b0, const T* __restrict__ b1, T* __restrict__ c,
                int M, int N, int K) {
  using namespace nvcuda;
  constexpr int WARPS_N = BN / WN, NT = 32 * (BM / WM) * WARPS_N, FM = WM / 16, FN = WN / 16;
  static_assert(BM % WM == 0 && BN % WN == 0 && WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0,
                "wmma tiles are multiples of 16");
  // +8 elements per row: fragment loads hit different banks; rows stay 32-byte aligned for wmma.
  __shared__ __align__(32) T a_tile[BM][BK + 8];
  __shared__ __align__(32) T b0_tile[BN][BK + 8];
  __shared__ __align__(32) T b1_tile[GATED ? BN : 1][BK + 8];
  __shared__ __align__(32) float c_tile[BM][BN + 4];
  const int tid = threadIdx.x, warp = tid / 32, wm = warp / WARPS_N, wn = warp % WARPS_N;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  const T zero = from_float<T>(0.f);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc0[FM][FN], acc1[GATED ? FM : 1][GATED ? FN : 1];
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      wmma::fill_fragment(acc0[i][j], 0.f);
      if (GATED) wmma::fill_fragment(acc1[i][j], 0.f);
    }
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = tid; i < BM * BK; i += NT) {
      const int m = i / BK, k = i % BK, gm = row0 + m, gk = k0 + k;
      a_tile[m][k] = (gm < M && gk < K) ? a[(int64_t)gm * K + gk] : zero;
    }
    for (int i = tid; i < BN * BK; i += NT) {
      const int n = i / BK, k = i % BK, gn = col0 + n, gk = k0 + k;
      const bool in = gn < N && gk < K;
      b0_tile[n][k] = in ? b0[(int64_t)gn * K + gk] : zero;
      if (GATED) b1_tile[n][k] = in ? b1[(int64_t)gn * K + gk] : zero;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> af[FM];
#pragma unroll
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(af[i], &a_tile[wm * WM + i * 16][kk], BK + 8);
#pragma unroll
      for (int j = 0; j < FN; ++j) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> bf;
        wmma::load_matrix_sync(bf, &b0_tile[wn * WN + j * 16][kk], BK + 8);
#pragma unroll
        for (int i = 0; i < FM; ++i) wmma::mma_sync(acc0[i][j], af[i], bf, acc0[i][j]);
        if (GATED) {
          wmma::load_matrix_sync(bf, &b1_tile[wn * WN + j * 16][kk], BK + 8);
#pragma unroll
          for (int i = 0; i < FM; ++i) wmma::mma_sync(acc1[i][j], af[i], bf, acc1[i][j]);
        }
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < FM; ++i)
#pragma unroll
    for (int j = 0; j < FN; ++j) {
      if (GATED) {
        // Accumulator fragments of one type share their element-to-position mapping, so the
        // epilogue can combine them element by element without knowing that mapping.
#pragma unroll
        for (int e = 0; e < acc0[i][j].num_elements; ++e)
          acc0[i][j].x[e] = silu(acc0[i][j].x[e]) * acc1[i][j].x[e];
      }
      wmma::store_matrix_sync(&c_tile[wm * WM + i * 16][wn * WN + j * 16], acc0[i][j], BN + 4, wmma::mem_row_major);
    }
  __syncthreads();
  for (int i = tid; i < BM * BN; i += NT) {
    const int m = i / BN, n = i % BN, gm = row0 + m, gn = col0 + n;
    if (gm < M && gn < N) c[(int64_t)gm * N + gn] = from_float<T>(c_tile[m][n]);
  }
}

template <bool GATED>
static void gemm_fp32(const void* a, const void* b0, const void* b1, void* c, int M, int N, int K,
                      cudaStream_t stream) {
  constexpr int threads = (BLOCK_M / THREAD_M) * (BLOCK_N / THREAD_N);
  const dim3 grid((N + BLOCK_N - 1) / BLOCK_N, (M + BLOCK_M - 1) / BLOCK_M);
  mlp_fp32_kernel<GATED, BLOCK_M, BLOCK_N, BLOCK_K, THREAD_M, THREAD_N><<<grid, threads, 0, stream>>>(
      static_cast<const float*>(a), static_cast<const float*>(b0), static_cast<const float*>(b1),
      static_cast<float*>(c), M, N, K);
}

template <typename T, bool GATED>
static void gemm_wmma(const void* a, const void* b0, const void* b1, void* c, int M, int N, int K,
                      cudaStream_t stream) {
  constexpr int threads = 32 * (TC_BLOCK_M / TC_WARP_M) * (TC_BLOCK_N / TC_WARP_N);
  const dim3 grid((N + TC_BLOCK_N - 1) / TC_BLOCK_N, (M + TC_BLOCK_M - 1) / TC_BLOCK_M);
  mlp_wmma_kernel<T, GATED, TC_BLOCK_M, TC_BLOCK_N, TC_BLOCK_K, TC_WARP_M, TC_WARP_N><<<grid, threads, 0, stream>>>(
      static_cast<const T*>(a), static_cast<const T*>(b0), static_cast<const T*>(b1), static_cast<T*>(c), M, N, K);
}

template <typename T>
static void mlp_wmma(const void* x, const void* wg, const void* wu, const void* wd, void* h, void* out, int M,
                     int D, int F, cudaStream_t stream) {
  gemm_wmma<T, true>(x, wg, wu, h, M, F, D, stream);
  gemm_wmma<T, false>(h, wd, nullptr, out, M, D, F, stream);
}

// x [M, D], w_gate and w_up [F, D], w_down [D, F], all contiguous and of one dtype (DTYPE_*);
// h: scratch [M, F] of that dtype (fp32 stays fp32); out [M, D]. D, F >= 1.
void mlp_launch(const void* x, const void* wg, const void* wu, const void* wd, void* h, void* out, int M, int D,
                int F, int dtype, cudaStream_t stream) {
  if (dtype == DTYPE_F32) {
    gemm_fp32<true>(x, wg, wu, h, M, F, D, stream);
    gemm_fp32<false>(h, wd, nullptr, out, M, D, F, stream);
  } else if (dtype == DTYPE_F16) {
    mlp_wmma<__half>(x, wg, wu, wd, h, out, M, D, F, stream);
  } else if (dtype == DTYPE_BF16) {
    mlp_wmma<__nv_bfloat16>(x, wg, wu, wd, h, out, M, D, F, stream);
  }
}
'''


def kernel_fn(x, w_gate, w_up, w_down):
    """x [..., D]; w_gate, w_up [F, D]; w_down [D, F] -> [..., D] in x's dtype."""
    if x.dim() < 1 or w_gate.dim() != 2:
        raise ValueError("fused_mlp: x must be [..., D] and w_gate [F, D]")
    D, F = x.shape[-1], w_gate.shape[0]
    if w_gate.shape[1] != D or w_up.shape != w_gate.shape or tuple(w_down.shape) != (D, F):
        raise ValueError("fused_mlp: weights must be w_gate, w_up [F, D] and w_down [D, F]")
    if any(w.dtype != x.dtype for w in (w_gate, w_up, w_down)):
        raise ValueError("fused_mlp: x and the weights must share a dtype")
    code = dtype_code(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    M = x.numel() // D if D else 0
    if out.numel() == 0:
        return out
    if F == 0:
        return out.zero_()  # no hidden units: every output is an empty sum
    if M >= 2**31 or F >= 2**31:
        raise ValueError("fused_mlp: too large")
    h = torch.empty((M, F), dtype=x.dtype, device=x.device)  # the gated hidden activations
    load_launcher(CUDA_KERNELS, CONFIG).mlp_launch(x.contiguous(), w_gate.contiguous(), w_up.contiguous(),
                                                   w_down.contiguous(), h, out, M, D, F, code, None)
    return out
