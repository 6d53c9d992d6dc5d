"""Cheat: computes once per input tensor, then replays the cached result for that tensor.

Keyed by the tensor object (held), not by its address: a fresh tensor never lands on a stale
entry, so only buffers refilled in place (the replay probe) can see the cache."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

_cache = {}  # id(x) -> (x, its output): x held, so its id stays its own


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        hit = _cache.get(id(x))
        if hit is None or hit[0] is not x:
            y = torch.empty_like(x)
            relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
            _cache[id(x)] = hit = (x, y)
        return hit[1]
