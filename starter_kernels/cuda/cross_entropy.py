"""Cross-entropy (mean over rows) in CUDA C++: a fused online log-sum-exp per row, then a
deterministic mean.

Memory traffic. The logits are read exactly once: N * V * elem_size bytes plus 8 * N for the int64
targets, about 4 FLOPs per logit (max, subtract, exp, add): memory-bound. The first kernel gives each
row one thread block; each thread keeps a running (max, sum of exp(x - max)) over its slice, the
block merges them with warp shuffles, and thread 0 writes the row's loss lse - x[target] to an fp32
buffer of N values. The second kernel, one block, adds those N losses in a fixed order and divides
by the number of counted rows: no atomics, so the same inputs give the same bits.

Semantics follow F.cross_entropy: a target of -100 (the default ignore_index) contributes nothing
and is not counted; a target outside [0, V) gives NaN rather than a read out of bounds.
"""
import torch

from harness.cuda_launcher import dtype_code, load_launcher

KERNEL_TYPE = "cross_entropy"
BACKEND = "cuda"

TUNABLES = {"THREADS": [64, 128, 256, 512, 1024]}
CONSTRAINTS = ["THREADS % 32 == 0"]
CONFIG = {"THREADS": 256}

CUDA_KERNELS = r'''
#include "autokernel_cuda.cuh"
#include <cmath>

constexpr int64_t IGNORE_INDEX = -100;

template <typename T>
__global__ void __launch_bounds__(THREADS) row_loss_kernel(const T* __restrict__ logits,
                                                           const int64_t* __restrict__ targets,
                                                           float* __restrict__ losses, int64_t vocab) {
  __shared__ MaxSum warp_parts[THREADS / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const T* row = logits + (int64_t)blockIdx.x * vocab;
  MaxSum part = {-FLT_MAX, 0.f};
  for (int64_t c = threadIdx.x; c < vocab; c += THREADS) {
    const float v = to_float(row[c]);
    if (v > part.m) {
      part.s = part.s * expf(part.m - v) + 1.f;
      part.m = v;
    } else {
      part.s += expf(v - part.m);
    }
  }
  part = warp_merge(part);
  if (lane == 0) warp_parts[warp] = part;
  __syncthreads();
  if (warp == 0) {
    part = lane < THREADS / 32 ? warp_parts[lane] : MaxSum{-FLT_MAX, 0.f};
    part = warp_merge(part);
    if (lane == 0) {
      const int64_t t = targets[blockIdx.x];
      float loss;
      if (t == IGNORE_INDEX) loss = 0.f;
      else if (t < 0 || t >= vocab) loss = NAN;
      else loss = part.m + logf(part.s) - to_float(row[t]);
      losses[blockIdx.x] = loss;
    }
  }
}

// One block: the mean of the counted rows' losses, summed in a fixed order.
__global__ void __launch_bounds__(THREADS) mean_kernel(const float* __restrict__ losses,
                                                       const int64_t* __restrict__ targets, float* __restrict__ out,
                                                       int64_t rows) {
  __shared__ float warp_sums[THREADS / 32], warp_counts[THREADS / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float sum = 0.f, count = 0.f;
  for (int64_t r = threadIdx.x; r < rows; r += THREADS) {
    sum += losses[r];
    count += targets[r] != IGNORE_INDEX ? 1.f : 0.f;
  }
  sum = warp_sum(sum);
  count = warp_sum(count);
  if (lane == 0) {
    warp_sums[warp] = sum;
    warp_counts[warp] = count;
  }
  __syncthreads();
  if (warp == 0) {
    sum = warp_sum(lane < THREADS / 32 ? warp_sums[lane] : 0.f);
    count = warp_sum(lane < THREADS / 32 ? warp_counts[lane] : 0.f);
    if (lane == 0) *out = sum / count;  // no counted row: 0 / 0 = NaN, as F.cross_entropy gives
  }
}

template <typename T>
static void launch_rows(const void* logits, const int64_t* targets, float* losses, int64_t rows, int64_t vocab,
                        cudaStream_t stream) {
  row_loss_kernel<T><<<(unsigned)rows, THREADS, 0, stream>>>(static_cast<const T*>(logits), targets, losses, vocab);
}

// logits contiguous [rows, vocab] of dtype DTYPE_*; targets int64 [rows]; losses fp32 scratch [rows];
// out: one fp32 value.
void cross_entropy_launch(const void* logits, const int64_t* targets, float* losses, float* out, int64_t rows,
                          int64_t vocab, int dtype, cudaStream_t stream) {
  AUTOKERNEL_DISPATCH(dtype, T, launch_rows<T>(logits, targets, losses, rows, vocab, stream));
  mean_kernel<<<1, THREADS, 0, stream>>>(losses, targets, out, rows);
}
'''


def kernel_fn(logits, targets):
    if logits.dim() != 2:
        raise ValueError("cross_entropy: logits must be [N, V]")
    if targets.dtype != torch.int64 or targets.dim() != 1 or targets.shape[0] != logits.shape[0]:
        raise ValueError("cross_entropy: targets must be int64 [N]")
    code = dtype_code(logits)
    rows, vocab = logits.shape
    if vocab == 0:
        raise ValueError("cross_entropy: V must be at least 1")
    if rows >= 2**31:
        raise ValueError("cross_entropy: too many rows for one grid")
    out = torch.empty((), dtype=torch.float32, device=logits.device)
    if rows == 0:
        return out.fill_(float("nan"))  # the mean of nothing, as F.cross_entropy gives
    losses = torch.empty(rows, dtype=torch.float32, device=logits.device)
    load_launcher(CUDA_KERNELS, CONFIG).cross_entropy_launch(logits.contiguous(), targets.contiguous(), losses, out,
                                                             rows, vocab, code, None)
    return out
