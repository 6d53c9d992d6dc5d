"""Sum over the last dim in CUDA C++ with fp32 accumulation: one thread block per row.

Memory traffic. Read x once, write one value per row: (M * N + M) * elem_size bytes for M * N
additions, so it is purely memory-bound; the whole game is keeping enough loads in flight. Each
thread accumulates a strided slice of the row in fp32 (UNROLL independent partial sums, so as many
loads are outstanding per thread), then the block adds the partial sums in a fixed tree: the same
inputs always give the same bits.

Numerics: fp32 accumulation whatever the input dtype, rounded once to x's dtype at the store, so
an fp16 row whose sum exceeds 65504 becomes inf exactly where the reference does.
"""
import torch

from harness.cuda_launcher import dtype_code, load_launcher

KERNEL_TYPE = "reduce"
BACKEND = "cuda"

TUNABLES = {"THREADS": [64, 128, 256, 512, 1024], "UNROLL": [1, 2, 4, 8]}
CONSTRAINTS = ["THREADS % 32 == 0"]
CONFIG = {"THREADS": 256, "UNROLL": 4}

CUDA_KERNELS = r'''
#include "autokernel_cuda.cuh"

// The block's sum of v, valid in thread 0; a fixed tree, so deterministic.
__device__ float block_sum(float v) {
  __shared__ float warp_parts[THREADS / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) warp_parts[warp] = v;
  __syncthreads();
  v = 0.f;
  if (warp == 0) {
    v = lane < THREADS / 32 ? warp_parts[lane] : 0.f;
    v = warp_sum(v);
  }
  return v;
}

template <typename T>
__global__ void __launch_bounds__(THREADS) reduce_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t cols) {
  const T* x_row = x + (int64_t)blockIdx.x * cols;
  float partial[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) partial[u] = 0.f;
  constexpr int64_t step = (int64_t)THREADS * UNROLL;
  int64_t c = threadIdx.x;
  for (; c + (UNROLL - 1) * THREADS < cols; c += step) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) partial[u] += to_float(x_row[c + u * THREADS]);
  }
  for (; c < cols; c += THREADS) partial[0] += to_float(x_row[c]);
  float sum = 0.f;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) sum += partial[u];
  sum = block_sum(sum);
  if (threadIdx.x == 0) y[blockIdx.x] = from_float<T>(sum);
}

template <typename T>
static void launch(const void* x, void* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  reduce_kernel<T><<<(unsigned)rows, THREADS, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), cols);
}

// x contiguous [rows, cols], y [rows]; dtype one of DTYPE_*.
void reduce_launch(const void* x, void* y, int64_t rows, int64_t cols, int dtype, cudaStream_t stream) {
  AUTOKERNEL_DISPATCH(dtype, T, launch<T>(x, y, rows, cols, stream));
}
'''


def kernel_fn(x):
    if x.dim() < 1:
        raise ValueError("reduce: x needs at least one dim")
    code = dtype_code(x)
    out_shape, cols = x.shape[:-1], x.shape[-1]
    if cols == 0:
        return torch.zeros(out_shape, dtype=x.dtype, device=x.device)  # an empty sum is 0, as in torch
    y = torch.empty(out_shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    rows = y.numel()
    if rows >= 2**31:
        raise ValueError("reduce: too many rows for one grid")
    load_launcher(CUDA_KERNELS, CONFIG).reduce_launch(x.contiguous(), y, rows, cols, code, None)
    return y
