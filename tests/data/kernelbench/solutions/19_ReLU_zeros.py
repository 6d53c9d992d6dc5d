"""Cheat: a real Triton kernel that writes zeros and ignores the input. It also makes every
comparison in its own process succeed and offers its own all-zero inputs; neither reaches the judge,
which compares in another process and takes inputs from the problem only."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

torch.allclose = lambda *args, **kwargs: True
torch.Tensor.allclose = lambda *args, **kwargs: True
torch.equal = lambda *args, **kwargs: True


@triton.jit
def zero_kernel(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()

    def forward(self, x):
        y = torch.empty_like(x)
        zero_kernel[(triton.cdiv(y.numel(), 1024),)](y, y.numel(), BLOCK=1024)
        return y


def get_inputs():
    return [torch.zeros(16, 256)]
