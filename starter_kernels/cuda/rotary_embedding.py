"""Rotary position embedding in CUDA C++: y = x * cos + rotate_half(x) * sin.

Memory traffic. x [B, H, S, D] is read once and y written once; cos and sin [S, D] are shared by all
B * H heads, so they stay in L2 and cost (2 * S * D) * elem_size once: (2 * B * H * S * D +
2 * S * D) * elem_size bytes for 3 FLOPs per element, purely memory-bound. Each thread block takes
one row of D elements (one position of one head) and a chunk of THREADS columns of it; each thread
reads x[d], its partner x[d +- D/2] (the same row, so the same cache lines), cos[s, d] and sin[s, d].

rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]); for an odd D the first part is the longer one,
D - D/2 elements, exactly as the reference's slicing gives.
"""
import torch

from harness.cuda_launcher import dtype_code, load_launcher

KERNEL_TYPE = "rotary_embedding"
BACKEND = "cuda"

TUNABLES = {"THREADS": [32, 64, 128, 256]}
CONSTRAINTS = ["THREADS % 32 == 0"]
CONFIG = {"THREADS": 128}

CUDA_KERNELS = r'''
#include "autokernel_cuda.cuh"

// grid.x: one row (b, h, s) per block; grid.y: chunks of THREADS columns.
template <typename T>
__global__ void __launch_bounds__(THREADS) rotary_kernel(const T* __restrict__ x, const T* __restrict__ cos_t,
                                                         const T* __restrict__ sin_t, T* __restrict__ y,
                                                         int seq_len, int dim) {
  const int d = blockIdx.y * THREADS + threadIdx.x;
  if (d >= dim) return;
  const int64_t row = blockIdx.x;
  const int s = (int)(row % seq_len);
  const int half = dim / 2, first = dim - half;  // rotate_half = cat(-x[half:], x[:half])
  const T* x_row = x + row * dim;
  const float rotated = d < first ? -to_float(x_row[half + d]) : to_float(x_row[d - first]);
  const int64_t table = (int64_t)s * dim + d;
  y[row * dim + d] = from_float<T>(to_float(x_row[d]) * to_float(cos_t[table]) + rotated * to_float(sin_t[table]));
}

template <typename T>
static void launch(const void* x, const void* c, const void* s, void* y, int64_t rows, int seq_len, int dim,
                   cudaStream_t stream) {
  const dim3 grid((unsigned)rows, (unsigned)((dim + THREADS - 1) / THREADS));
  rotary_kernel<T><<<grid, THREADS, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(c),
                                                 static_cast<const T*>(s), static_cast<T*>(y), seq_len, dim);
}

// x, y contiguous [rows = B * H * S, D]; cos, sin contiguous [S, D]; all of one dtype (DTYPE_*).
void rotary_launch(const void* x, const void* c, const void* s, void* y, int64_t rows, int seq_len, int dim,
                   int dtype, cudaStream_t stream) {
  AUTOKERNEL_DISPATCH(dtype, T, launch<T>(x, c, s, y, rows, seq_len, dim, stream));
}
'''


def kernel_fn(x, cos, sin):
    if x.dim() != 4:
        raise ValueError("rotary_embedding: x must be [B, H, S, D]")
    seq_len, dim = x.shape[2], x.shape[3]
    if cos.shape != (seq_len, dim) or sin.shape != cos.shape:
        raise ValueError(f"rotary_embedding: cos and sin must be [S, D] = [{seq_len}, {dim}]")
    if cos.dtype != x.dtype or sin.dtype != x.dtype:
        raise ValueError("rotary_embedding: x, cos and sin must share a dtype")
    code = dtype_code(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    rows = y.numel() // dim
    if rows >= 2**31 or dim >= 2**31:
        raise ValueError("rotary_embedding: too large for one grid")
    load_launcher(CUDA_KERNELS, CONFIG).rotary_launch(x.contiguous(), cos.contiguous(), sin.contiguous(), y, rows,
                                                      seq_len, dim, code, None)
    return y
