"""Attention softmax(q @ k.T * sm_scale) @ v in CUDA C++ with an online softmax (FlashAttention's
loop): the S x S score matrix is never written to memory.

Arithmetic. 4 * B * H * S^2 * D FLOPs (two products), against 4 * B * H * S * D * elem_size bytes of
q, k, v and the output: compute-bound for long sequences. A thread block takes BLOCK_M = WARPS *
ROWS_PER_WARP query rows of one head; for every tile of 32 keys it stages k and v in shared memory
(fp32), and each warp, for each of its rows, computes the 32 scores (one key per lane, a dot
product over D), the tile's max and sum by warp shuffles, rescales its running output by
exp(old max - new max) and adds p @ v with each lane owning D / 32 output columns. k and v are
read from global memory S / BLOCK_M times per head (mostly from L2), the output written once.
Causal: key tiles beyond the block's last row are skipped, so causal costs about half.

Numerics: scores, softmax statistics and the output accumulate in fp32 for every input dtype;
sm_scale is folded into q as it is staged; the running max starts at the lowest finite float so
fully masked tiles add exp(-inf) = 0 and never NaN. This starter uses CUDA cores; a tensor-core
(mma / wmma) version of the two products is the first big step up.
"""
import math

import torch

from harness.cuda_launcher import dtype_code, load_launcher

KERNEL_TYPE = "flash_attention"
BACKEND = "cuda"

TUNABLES = {"WARPS": [1, 2, 4, 8], "ROWS_PER_WARP": [1, 2, 4, 8]}
# q tile (BLOCK_M x 128 fp32) + k and v tiles (32 x 129 and 32 x 128 fp32) within 48 KiB of static
# shared memory at the largest head dim
CONSTRAINTS = ["WARPS * ROWS_PER_WARP * 128 * 4 + 32 * 257 * 4 <= 49152"]
CONFIG = {"WARPS": 4, "ROWS_PER_WARP": 4}

CUDA_KERNELS = r'''
#include "autokernel_cuda.cuh"
#include <cmath>

constexpr int BLOCK_N = 32;  // keys per tile: one per lane
constexpr int BLOCK_M = WARPS * ROWS_PER_WARP;

// grid: (query tiles, B * H). MAX_D: head_dim rounded up to 32, 64 or 128.
template <typename T, int MAX_D>
__global__ void __launch_bounds__(WARPS * 32) attention_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                               const T* __restrict__ v, T* __restrict__ o,
                                                               int seq_q, int seq_k, int head_dim,
                                                               float sm_scale, bool causal) {
  constexpr int DC = MAX_D / 32;  // output columns per lane: lane + 32 * c
  __shared__ float q_tile[BLOCK_M][MAX_D];
  __shared__ float k_tile[BLOCK_N][MAX_D + 1];  // +1: lanes read different keys' column d conflict-free
  __shared__ float v_tile[BLOCK_N][MAX_D];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t q_offset = (int64_t)blockIdx.y * seq_q * head_dim, kv_offset = (int64_t)blockIdx.y * seq_k * head_dim;
  const int q0 = blockIdx.x * BLOCK_M;
  for (int i = threadIdx.x; i < BLOCK_M * MAX_D; i += WARPS * 32) {
    const int r = i / MAX_D, d = i % MAX_D;
    q_tile[r][d] = (q0 + r < seq_q && d < head_dim)
                       ? to_float(q[q_offset + (int64_t)(q0 + r) * head_dim + d]) * sm_scale : 0.f;
  }
  float row_max[ROWS_PER_WARP], row_sum[ROWS_PER_WARP], acc[ROWS_PER_WARP][DC];
#pragma unroll
  for (int r = 0; r < ROWS_PER_WARP; ++r) {
    row_max[r] = -FLT_MAX;
    row_sum[r] = 0.f;
#pragma unroll
    for (int c = 0; c < DC; ++c) acc[r][c] = 0.f;
  }
  // causal is top-left aligned, as in F.scaled_dot_product_attention: key j is seen by query i when j <= i
  const int kv_end = causal ? min(seq_k, q0 + BLOCK_M) : seq_k;
  for (int n0 = 0; n0 < kv_end; n0 += BLOCK_N) {
    __syncthreads();  // the previous tile is consumed (and, the first time, q_tile is written)
    for (int i = threadIdx.x; i < BLOCK_N * MAX_D; i += WARPS * 32) {
      const int j = i / MAX_D, d = i % MAX_D;
      const bool in = n0 + j < seq_k && d < head_dim;
      const int64_t at = kv_offset + (int64_t)(n0 + j) * head_dim + d;
      k_tile[j][d] = in ? to_float(k[at]) : 0.f;
      v_tile[j][d] = in ? to_float(v[at]) : 0.f;
    }
    __syncthreads();
    const int key = n0 + lane;
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
      const int row = warp * ROWS_PER_WARP + r, query = q0 + row;
      float score = 0.f;
      for (int d = 0; d < head_dim; ++d) score = fmaf(q_tile[row][d], k_tile[lane][d], score);
      const bool valid = key < seq_k && (!causal || key <= query);
      const float new_max = fmaxf(row_max[r], warp_max(valid ? score : -INFINITY));
      const float rescale = expf(row_max[r] - new_max);
      const float p = valid ? expf(score - new_max) : 0.f;
      row_sum[r] = row_sum[r] * rescale + warp_sum(p);
      row_max[r] = new_max;
#pragma unroll
      for (int c = 0; c < DC; ++c) acc[r][c] *= rescale;
#pragma unroll 8
      for (int j = 0; j < BLOCK_N; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
        for (int c = 0; c < DC; ++c) acc[r][c] = fmaf(pj, v_tile[j][lane + 32 * c], acc[r][c]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < ROWS_PER_WARP; ++r) {
    const int query = q0 + warp * ROWS_PER_WARP + r;
    if (query >= seq_q) continue;
    const float inv_sum = row_sum[r] > 0.f ? 1.f / row_sum[r] : 0.f;  // no key at all (seq_k = 0): 0, as torch
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = lane + 32 * c;
      if (d < head_dim) o[q_offset + (int64_t)query * head_dim + d] = from_float<T>(acc[r][c] * inv_sum);
    }
  }
}

// The problem: heads = B * H, q and o [heads, seq_q, head_dim], k and v [heads, seq_k, head_dim].
struct Shape { int heads, seq_q, seq_k, head_dim; float sm_scale; bool causal; };

template <typename T, int MAX_D>
static void launch(const void* q, const void* k, const void* v, void* o, Shape p, cudaStream_t stream) {
  const dim3 grid((p.seq_q + BLOCK_M - 1) / BLOCK_M, p.heads);
  attention_kernel<T, MAX_D><<<grid, WARPS * 32, 0, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                             static_cast<const T*>(v), static_cast<T*>(o), p.seq_q,
                                                             p.seq_k, p.head_dim, p.sm_scale, p.causal);
}

template <typename T>
static void launch_dim(const void* q, const void* k, const void* v, void* o, Shape p, cudaStream_t stream) {
  if (p.head_dim <= 32) launch<T, 32>(q, k, v, o, p, stream);
  else if (p.head_dim <= 64) launch<T, 64>(q, k, v, o, p, stream);
  else launch<T, 128>(q, k, v, o, p, stream);
}

// all contiguous, one dtype (DTYPE_*); head_dim <= 128.
void attention_launch(const void* q, const void* k, const void* v, void* o, int heads, int seq_q, int seq_k,
                      int head_dim, float sm_scale, bool causal, int dtype, cudaStream_t stream) {
  const Shape p = {heads, seq_q, seq_k, head_dim, sm_scale, causal};
  AUTOKERNEL_DISPATCH(dtype, T, launch_dim<T>(q, k, v, o, p, stream));
}
'''


def kernel_fn(q, k, v, causal=False, sm_scale=None):
    """q [B, H, Sq, D], k and v [B, H, Sk, D] -> [B, H, Sq, D]; head dims up to 128."""
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise ValueError("flash_attention: q must be [B, H, Sq, D] and k, v [B, H, Sk, D]")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError("flash_attention: q, k and v must share a dtype")
    heads, seq_q, seq_k, head_dim = q.shape[0] * q.shape[1], q.shape[2], k.shape[2], q.shape[3]
    if head_dim > 128:
        raise ValueError(f"flash_attention: this kernel handles head dims up to 128, got {head_dim}")
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    code = dtype_code(q)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if o.numel() == 0:
        return o
    if heads >= 65536 or seq_q >= 2**31 or seq_k >= 2**31:
        raise ValueError("flash_attention: too large for one grid")
    load_launcher(CUDA_KERNELS, CONFIG).attention_launch(q.contiguous(), k.contiguous(), v.contiguous(), o, heads,
                                                         seq_q, seq_k, head_dim, scale, bool(causal), code, None)
    return o
