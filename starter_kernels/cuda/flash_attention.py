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

from harness.cuda_build import load_cuda

KERNEL_TYPE = "flash_attention"
BACKEND = "cuda"

TUNABLES = {"WARPS": [1, 2, 4, 8], "ROWS_PER_WARP": [1, 2, 4, 8]}
# q tile (BLOCK_M x 128 fp32) + k and v tiles (32 x 129 and 32 x 128 fp32) within 48 KiB of static
# shared memory at the largest head dim
CONSTRAINTS = ["WARPS * ROWS_PER_WARP * 128 * 4 + 32 * 257 * 4 <= 49152"]
CONFIG = {"WARPS": 4, "ROWS_PER_WARP": 4}

CUDA_KERNELS = r'''
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cfloat>
#include <cmath>
#include <cstdint>

enum : int { DTYPE_F32 = 0, DTYPE_F16 = 1, DTYPE_BF16 = 2 };
constexpr int BLOCK_N = 32;  // keys per tile: one per lane
constexpr int BLOCK_M = WARPS * ROWS_PER_WARP;

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// grid: (query tiles, B * H). MAX_D: head_dim rounded up to 32, 64 or 128.
template <typename T, int MAX_D>
__global__ void __launch_bounds__(WARPS * 32) attention_kernel(const T* __restrict__ q, const T* __restrict__ k,
                                                               const T* __restrict__ v, T* __restrict__ o,
                                                               int seq_len, int head_dim, float sm_scale,
                                                               bool causal) {
  constexpr int DC = MAX_D / 32;  // output columns per lane: lane + 32 * c
  __shared__ float q_tile[BLOCK_M][MAX_D];
  __shared__ float k_tile[BLOCK_N][MAX_D + 1];  // +1: lanes read different keys' column d conflict-free
  __shared__ float v_tile[BLOCK_N][MAX_D];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t head_offset = (int64_t)blockIdx.y * seq_len * head_dim;
  const int q0 = blockIdx.x * BLOCK_M;
  for (int i = threadIdx.x; i < BLOCK_M * MAX_D; i += WARPS * 32) {
    const int r = i / MAX_D, d = i % MAX_D;
    q_tile[r][d] = (q0 + r < seq_len && d < head_dim)
                       ? to_float(q[head_offset + (int64_t)(q0 + r) * head_dim + d]) * sm_scale : 0.f;
  }
  float row_max[ROWS_PER_WARP], row_sum[ROWS_PER_WARP], acc[ROWS_PER_WARP][DC];
#pragma unroll
  for (int r = 0; r < ROWS_PER_WARP; ++r) {
    row_max[r] = -FLT_MAX;
    row_sum[r] = 0.f;
#pragma unroll
    for (int c = 0; c < DC; ++c) acc[r][c] = 0.f;
  }
  const int kv_end = causal ? min(seq_len, q0 + BLOCK_M) : seq_len;
  for (int n0 = 0; n0 < kv_end; n0 += BLOCK_N) {
    __syncthreads();  // the previous tile is consumed (and, the first time, q_tile is written)
    for (int i = threadIdx.x; i < BLOCK_N * MAX_D; i += WARPS * 32) {
      const int j = i / MAX_D, d = i % MAX_D;
      const bool in = n0 + j < seq_len && d < head_dim;
      const int64_t at = head_offset + (int64_t)(n0 + j) * head_dim + d;
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
      const bool valid = key < seq_len && (!causal || key <= query);
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
    if (query >= seq_len) continue;
    const float inv_sum = 1.f / row_sum[r];
#pragma unroll
    for (int c = 0; c < DC; ++c) {
      const int d = lane + 32 * c;
      if (d < head_dim) o[head_offset + (int64_t)query * head_dim + d] = from_float<T>(acc[r][c] * inv_sum);
    }
  }
}

template <typename T, int MAX_D>
static void launch(const void* q, const void* k, const void* v, void* o, int heads, int seq_len, int head_dim,
                   float sm_scale, bool causal, cudaStream_t stream) {
  const dim3 grid((seq_len + BLOCK_M - 1) / BLOCK_M, heads);
  attention_kernel<T, MAX_D><<<grid, WARPS * 32, 0, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k),
                                                             static_cast<const T*>(v), static_cast<T*>(o), seq_len,
                                                             head_dim, sm_scale, causal);
}

template <typename T>
static void launch_dim(const void* q, const void* k, const void* v, void* o, int heads, int seq_len, int head_dim,
                       float sm_scale, bool causal, cudaStream_t stream) {
  if (head_dim <= 32) launch<T, 32>(q, k, v, o, heads, seq_len, head_dim, sm_scale, causal, stream);
  else if (head_dim <= 64) launch<T, 64>(q, k, v, o, heads, seq_len, head_dim, sm_scale, causal, stream);
  else launch<T, 128>(q, k, v, o, heads, seq_len, head_dim, sm_scale, causal, stream);
}

// q, k, v, o contiguous [heads = B * H, S, D], one dtype (DTYPE_*); D <= 128.
void attention_launch(const void* q, const void* k, const void* v, void* o, int heads, int seq_len, int head_dim,
                      float sm_scale, bool causal, int dtype, cudaStream_t stream) {
  switch (dtype) {
    case DTYPE_F32: launch_dim<float>(q, k, v, o, heads, seq_len, head_dim, sm_scale, causal, stream); break;
    case DTYPE_F16: launch_dim<__half>(q, k, v, o, heads, seq_len, head_dim, sm_scale, causal, stream); break;
    case DTYPE_BF16: launch_dim<__nv_bfloat16>(q, k, v, o, heads, seq_len, head_dim, sm_scale, causal, stream); break;
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
    default: TORCH_CHECK(false, "flash_attention: unsupported dtype ", t.scalar_type());
  }
  return -1;
}

torch::Tensor attention_fwd(torch::Tensor q, torch::Tensor k, torch::Tensor v, bool causal, double sm_scale) {
  TORCH_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda(), "flash_attention: tensors must be on a CUDA device");
  TORCH_CHECK(q.dim() == 4 && k.sizes() == q.sizes() && v.sizes() == q.sizes(),
              "flash_attention: q, k and v must be [B, H, S, D] of one shape");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "flash_attention: q, k and v must share a dtype");
  const int64_t heads = q.size(0) * q.size(1), seq_len = q.size(2), head_dim = q.size(3);
  TORCH_CHECK(head_dim <= 128, "flash_attention: this kernel handles head dims up to 128, got ", head_dim);
  const c10::cuda::CUDAGuard guard(q.device());
  const int code = dtype_code(q);
  auto o = torch::empty(q.sizes(), q.options());
  if (o.numel() == 0) return o;
  TORCH_CHECK(heads < 65536 && seq_len < (int64_t(1) << 31), "flash_attention: too large for one grid");
  auto qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  attention_launch(qc.data_ptr(), kc.data_ptr(), vc.data_ptr(), o.data_ptr(), (int)heads, (int)seq_len,
                   (int)head_dim, (float)sm_scale, causal, code, at::cuda::getCurrentCUDAStream());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return o;
}
'''

FUNCTIONS = ["attention_fwd"]


def kernel_fn(q, k, v, causal=False, sm_scale=None):
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    ext = load_cuda(KERNEL_TYPE, CUDA_KERNELS, CUDA_HOST, FUNCTIONS, CONFIG)
    return ext.attention_fwd(q, k, v, bool(causal), scale)
