"""RMSNorm over the last dim in CUDA C++: one thread block per row.

Memory traffic. The minimum is one read of x, one write of y and one read of weight:
(2 * M * N + N) * elem_size bytes for about 5 FLOPs per element: memory-bound. The first sweep sums
x^2 (each thread its own fp32 partial sum, then a fixed-order tree across the block, so the result
is deterministic); the second re-reads the row (mostly from L2) and writes x * rstd * weight.

Numerics: the mean of squares, rstd and the product are fp32; the output is rounded once to x's
dtype. Squares are never negative, so a plain fp32 sum has no cancellation to fear.
"""
import torch

from harness.cuda_launcher import dtype_code, load_launcher

KERNEL_TYPE = "rmsnorm"
BACKEND = "cuda"

TUNABLES = {"THREADS": [64, 128, 256, 512, 1024]}
CONSTRAINTS = ["THREADS % 32 == 0"]
CONFIG = {"THREADS": 256}

CUDA_KERNELS = r'''
#include "autokernel_cuda.cuh"

// The block's sum of v, in every thread; a fixed tree, so deterministic.
__device__ float block_sum(float v) {
  __shared__ float warp_parts[THREADS / 32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) warp_parts[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < THREADS / 32 ? warp_parts[lane] : 0.f;
    v = warp_sum(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

template <typename T>
__global__ void __launch_bounds__(THREADS) rmsnorm_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                                          T* __restrict__ y, int64_t cols, float eps) {
  const T* x_row = x + (int64_t)blockIdx.x * cols;
  T* y_row = y + (int64_t)blockIdx.x * cols;
  float sum_sq = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += THREADS) {
    const float v = to_float(x_row[c]);
    sum_sq = fmaf(v, v, sum_sq);
  }
  const float rstd = 1.f / sqrtf(block_sum(sum_sq) / (float)cols + eps);
  for (int64_t c = threadIdx.x; c < cols; c += THREADS) {
    y_row[c] = from_float<T>(to_float(x_row[c]) * rstd * to_float(weight[c]));
  }
}

template <typename T>
static void launch(const void* x, const void* w, void* y, int64_t rows, int64_t cols, float eps,
                   cudaStream_t stream) {
  rmsnorm_kernel<T><<<(unsigned)rows, THREADS, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(w),
                                                             static_cast<T*>(y), cols, eps);
}

// x, y contiguous [rows, cols]; weight contiguous [cols]; all of one dtype (DTYPE_*).
void rmsnorm_launch(const void* x, const void* w, void* y, int64_t rows, int64_t cols, float eps, int dtype,
                    cudaStream_t stream) {
  AUTOKERNEL_DISPATCH(dtype, T, launch<T>(x, w, y, rows, cols, eps, stream));
}
'''


def kernel_fn(x, weight, eps=1e-6):
    if x.dim() < 1:
        raise ValueError("rmsnorm: x needs at least one dim")
    cols = x.shape[-1]
    if weight.numel() != cols:
        raise ValueError(f"rmsnorm: weight needs {cols} elements, got {weight.numel()}")
    if weight.dtype != x.dtype:
        raise ValueError("rmsnorm: x and weight must share a dtype")
    code = dtype_code(x)
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    rows = y.numel() // cols
    if rows >= 2**31:
        raise ValueError("rmsnorm: too many rows for one grid")
    load_launcher(CUDA_KERNELS, CONFIG).rmsnorm_launch(x, weight, y, rows, cols, float(eps), code, None)
    return y
