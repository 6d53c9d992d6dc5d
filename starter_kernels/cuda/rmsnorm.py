"""RMSNorm over the last dim in CUDA C++: one thread block per row.

Memory traffic. The minimum is one read of x, one write of y and one read of weight:
(2 * M * N + N) * elem_size bytes for about 5 FLOPs per element: memory-bound. The first sweep sums
x^2 (each thread its own fp32 partial sum, then a fixed-order tree across the block, so the result
is deterministic); the second re-reads the row (mostly from L2) and writes x * rstd * weight.

Numerics: the mean of squares, rstd and the product are fp32; the output is rounded once to x's
dtype. Squares are never negative, so a plain fp32 sum has no cancellation to fear.
"""
from harness.cuda_build import load_cuda

KERNEL_TYPE = "rmsnorm"
BACKEND = "cuda"

TUNABLES = {"THREADS": [64, 128, 256, 512, 1024]}
CONSTRAINTS = ["THREADS % 32 == 0"]
CONFIG = {"THREADS": 256}

CUDA_KERNELS = r'''
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cstdint>

enum : int { DTYPE_F32 = 0, DTYPE_F16 = 1, DTYPE_BF16 = 2 };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The block's sum of v, in every thread; a fixed tree, so deterministic.
__device__ float block_sum(float v) {
  __shared__ float warp_parts[THREADS / 32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (lane == 0) warp_parts[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < THREADS / 32 ? warp_parts[lane] : 0.f;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
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
  switch (dtype) {
    case DTYPE_F32: launch<float>(x, w, y, rows, cols, eps, stream); break;
    case DTYPE_F16: launch<__half>(x, w, y, rows, cols, eps, stream); break;
    case DTYPE_BF16: launch<__nv_bfloat16>(x, w, y, rows, cols, eps, stream); break;
  }
}
'''

CUDA_HOST = r'''
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

static int dtype_code(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return DTYPE_F32;
    case torch::kFloat16: return DTYPE_F16;
    case torch::kBFloat16: return DTYPE_BF16;
    default: TORCH_CHECK(false, "rmsnorm: unsupported dtype ", t.scalar_type());
  }
  return -1;
}

torch::Tensor rmsnorm_fwd(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "rmsnorm: tensors must be on a CUDA device");
  TORCH_CHECK(x.dim() >= 1, "rmsnorm: x needs at least one dim");
  const int64_t cols = x.size(-1);
  TORCH_CHECK(weight.numel() == cols, "rmsnorm: weight needs ", cols, " elements");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "rmsnorm: x and weight must share a dtype");
  const c10::cuda::CUDAGuard guard(x.device());
  const int code = dtype_code(x);
  auto xc = x.contiguous(), wc = weight.contiguous();
  auto y = torch::empty(x.sizes(), x.options());
  if (y.numel() == 0) return y;
  const int64_t rows = y.numel() / cols;
  TORCH_CHECK(rows < (int64_t(1) << 31), "rmsnorm: too many rows for one grid");
  rmsnorm_launch(xc.data_ptr(), wc.data_ptr(), y.data_ptr(), rows, cols, (float)eps, code,
                 at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}
'''

FUNCTIONS = ["rmsnorm_fwd"]


def kernel_fn(x, weight, eps=1e-6):
    return load_cuda(KERNEL_TYPE, CUDA_KERNELS, CUDA_HOST, FUNCTIONS, CONFIG).rmsnorm_fwd(x, weight, float(eps))
