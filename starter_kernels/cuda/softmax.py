"""Softmax over the last dim in CUDA C++: one thread block per row.

Memory traffic. A softmax must read x once and write y once: 2 * M * N * elem_size bytes for M rows
of N columns, about 5 FLOPs per element, so it is memory-bound on every GPU. This kernel sweeps a
row twice: the first sweep keeps, per thread, a running maximum and a running sum of exponentials
rescaled whenever the maximum grows (the online softmax), merged across the block with warp
shuffles; the second re-reads the row (from L2 for rows up to a few MB in flight) and writes
exp(x - max) / sum. That is 3 * M * N * elem_size bytes through the memory hierarchy, of which the
re-read is mostly cache. Holding a short row in registers between the sweeps removes the re-read.

Numerics: statistics in fp32 whatever the input dtype; the output is rounded once, at the store.
The running maximum starts at the lowest finite float, so a lane that has seen only -inf (masked
attention scores) adds exp(-inf) = 0 instead of computing -inf - (-inf) = NaN.
"""
import torch

from harness.cuda_launcher import dtype_code, load_launcher

KERNEL_TYPE = "softmax"
BACKEND = "cuda"

TUNABLES = {"THREADS": [64, 128, 256, 512, 1024]}
CONSTRAINTS = ["THREADS % 32 == 0"]
CONFIG = {"THREADS": 256}

CUDA_KERNELS = r'''
#include "autokernel_cuda.cuh"

// The row's (max, sum) in every thread; a fixed merge order, so the result is deterministic.
__device__ MaxSum block_merge(MaxSum v) {
  __shared__ MaxSum warp_parts[THREADS / 32];
  __shared__ MaxSum row;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_merge(v);
  if (lane == 0) warp_parts[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < THREADS / 32 ? warp_parts[lane] : MaxSum{-FLT_MAX, 0.f};
    v = warp_merge(v);
    if (lane == 0) row = v;
  }
  __syncthreads();
  return row;
}

template <typename T>
__global__ void __launch_bounds__(THREADS) softmax_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                          int64_t cols) {
  const T* x_row = x + (int64_t)blockIdx.x * cols;
  T* y_row = y + (int64_t)blockIdx.x * cols;
  MaxSum part = {-FLT_MAX, 0.f};
  for (int64_t c = threadIdx.x; c < cols; c += THREADS) {
    const float v = to_float(x_row[c]);
    if (v > part.m) {
      part.s = part.s * expf(part.m - v) + 1.f;
      part.m = v;
    } else {
      part.s += expf(v - part.m);
    }
  }
  const MaxSum row = block_merge(part);
  const float inv_sum = 1.f / row.s;
  for (int64_t c = threadIdx.x; c < cols; c += THREADS) {
    y_row[c] = from_float<T>(expf(to_float(x_row[c]) - row.m) * inv_sum);
  }
}

template <typename T>
static void launch(const void* x, void* y, int64_t rows, int64_t cols, cudaStream_t stream) {
  softmax_kernel<T><<<(unsigned)rows, THREADS, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(y), cols);
}

// x and y contiguous [rows, cols]; dtype one of DTYPE_*.
void softmax_launch(const void* x, void* y, int64_t rows, int64_t cols, int dtype, cudaStream_t stream) {
  AUTOKERNEL_DISPATCH(dtype, T, launch<T>(x, y, rows, cols, stream));
}
'''


def kernel_fn(x):
    if x.dim() < 1:
        raise ValueError("softmax: x needs at least one dim")
    code = dtype_code(x)
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    cols = x.shape[-1]
    rows = y.numel() // cols
    if rows >= 2**31:
        raise ValueError("softmax: too many rows for one grid")
    load_launcher(CUDA_KERNELS, CONFIG).softmax_launch(x, y, rows, cols, code, None)
    return y
