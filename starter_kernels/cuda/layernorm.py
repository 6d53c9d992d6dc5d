"""LayerNorm over the last dim in CUDA C++: one thread block per row.

Memory traffic. The minimum is one read of x, one write of y and one read each of weight and bias:
(2 * M * N + 2 * N) * elem_size bytes, about 8 FLOPs per element: memory-bound. The first sweep
computes the row's mean and variance, the second re-reads the row (mostly from L2) and writes
(x - mean) * rstd * weight + bias: 3 * M * N reads and writes in all.

Numerics: each thread keeps Welford's running (count, mean, M2) in fp32, and the block merges the
threads' triples with Chan's formula in a fixed order (deterministic). Unlike sum(x^2) - mean^2,
this keeps its accuracy when the mean is large against the spread (a row offset by 1e3 with unit
variance loses every digit of the variance to cancellation in fp32 the naive way).
"""
import torch

from harness.cuda_launcher import dtype_code, load_launcher

KERNEL_TYPE = "layernorm"
BACKEND = "cuda"

TUNABLES = {"THREADS": [64, 128, 256, 512, 1024]}
CONSTRAINTS = ["THREADS % 32 == 0"]
CONFIG = {"THREADS": 256}

CUDA_KERNELS = r'''
#include "autokernel_cuda.cuh"

// Welford statistics of a set of values: how many, their mean, and the sum of squared deviations.
struct Stats { float n, mean, m2; };

// Chan et al.'s pairwise update: the statistics of the union of two disjoint sets.
__device__ __forceinline__ Stats combine(Stats a, Stats b) {
  const float n = a.n + b.n;
  if (n == 0.f) return a;
  const float delta = b.mean - a.mean, wb = b.n / n;
  return {n, a.mean + delta * wb, a.m2 + b.m2 + delta * delta * a.n * wb};
}

__device__ __forceinline__ Stats warp_combine(Stats s) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    Stats other = {__shfl_xor_sync(0xffffffffu, s.n, offset), __shfl_xor_sync(0xffffffffu, s.mean, offset),
                   __shfl_xor_sync(0xffffffffu, s.m2, offset)};
    s = combine(s, other);
  }
  return s;
}

__device__ Stats block_combine(Stats s) {
  __shared__ Stats warp_parts[THREADS / 32];
  __shared__ Stats row;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  s = warp_combine(s);
  if (lane == 0) warp_parts[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < THREADS / 32 ? warp_parts[lane] : Stats{0.f, 0.f, 0.f};
    s = warp_combine(s);
    if (lane == 0) row = s;
  }
  __syncthreads();
  return row;
}

template <typename T>
__global__ void __launch_bounds__(THREADS) layernorm_kernel(const T* __restrict__ x, const T* __restrict__ weight,
                                                            const T* __restrict__ bias, T* __restrict__ y,
                                                            int64_t cols, float eps) {
  const T* x_row = x + (int64_t)blockIdx.x * cols;
  T* y_row = y + (int64_t)blockIdx.x * cols;
  Stats part = {0.f, 0.f, 0.f};
  for (int64_t c = threadIdx.x; c < cols; c += THREADS) {
    const float v = to_float(x_row[c]);
    part.n += 1.f;
    const float delta = v - part.mean;
    part.mean += delta / part.n;
    part.m2 += delta * (v - part.mean);
  }
  const Stats row = block_combine(part);
  const float rstd = 1.f / sqrtf(row.m2 / (float)cols + eps);
  for (int64_t c = threadIdx.x; c < cols; c += THREADS) {
    const float v = (to_float(x_row[c]) - row.mean) * rstd;
    y_row[c] = from_float<T>(v * to_float(weight[c]) + to_float(bias[c]));
  }
}

template <typename T>
static void launch(const void* x, const void* w, const void* b, void* y, int64_t rows, int64_t cols, float eps,
                   cudaStream_t stream) {
  layernorm_kernel<T><<<(unsigned)rows, THREADS, 0, stream>>>(
      static_cast<const T*>(x), static_cast<const T*>(w), static_cast<const T*>(b), static_cast<T*>(y), cols, eps);
}

// x, y contiguous [rows, cols]; weight, bias contiguous [cols]; all of one dtype (DTYPE_*).
void layernorm_launch(const void* x, const void* w, const void* b, void* y, int64_t rows, int64_t cols, float eps,
                      int dtype, cudaStream_t stream) {
  AUTOKERNEL_DISPATCH(dtype, T, launch<T>(x, w, b, y, rows, cols, eps, stream));
}
'''


def kernel_fn(x, weight, bias, eps=1e-5):
    if x.dim() < 1:
        raise ValueError("layernorm: x needs at least one dim")
    cols = x.shape[-1]
    if weight.numel() != cols or bias.numel() != cols:
        raise ValueError(f"layernorm: weight and bias need {cols} elements")
    if weight.dtype != x.dtype or bias.dtype != x.dtype:
        raise ValueError("layernorm: x, weight and bias must share a dtype")
    code = dtype_code(x)
    x, weight, bias = x.contiguous(), weight.contiguous(), bias.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    rows = y.numel() // cols
    if rows >= 2**31:
        raise ValueError("layernorm: too many rows for one grid")
    load_launcher(CUDA_KERNELS, CONFIG).layernorm_launch(x, weight, bias, y, rows, cols, float(eps), code, None)
    return y
