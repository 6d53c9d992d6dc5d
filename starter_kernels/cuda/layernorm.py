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
from harness.cuda_build import load_cuda

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

CUDA_HOST = r'''
#include "autokernel_torch.h"

torch::Tensor layernorm_fwd(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
  TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "layernorm: tensors must be on a CUDA device");
  TORCH_CHECK(x.dim() >= 1, "layernorm: x needs at least one dim");
  const int64_t cols = x.size(-1);
  TORCH_CHECK(weight.numel() == cols && bias.numel() == cols, "layernorm: weight and bias need ", cols, " elements");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && bias.scalar_type() == x.scalar_type(),
              "layernorm: x, weight and bias must share a dtype");
  const c10::cuda::CUDAGuard guard(x.device());
  const int code = dtype_code(x, "layernorm");
  auto xc = x.contiguous(), wc = weight.contiguous(), bc = bias.contiguous();
  auto y = torch::empty(x.sizes(), x.options());
  if (y.numel() == 0) return y;
  const int64_t rows = y.numel() / cols;
  TORCH_CHECK(rows < (int64_t(1) << 31), "layernorm: too many rows for one grid");
  layernorm_launch(xc.data_ptr(), wc.data_ptr(), bc.data_ptr(), y.data_ptr(), rows, cols, (float)eps, code,
                   at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
'''

FUNCTIONS = ["layernorm_fwd"]


def kernel_fn(x, weight, bias, eps=1e-5):
    ext = load_cuda(KERNEL_TYPE, CUDA_KERNELS, CUDA_HOST, FUNCTIONS, CONFIG)
    return ext.layernorm_fwd(x, weight, bias, float(eps))
