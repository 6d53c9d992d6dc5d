"""Dies with SIGSEGV in forward: a kernel with a wild pointer (the interpreter reads far outside x)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def wild_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + (1 << 44) + offs))


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        wild_kernel[(1,)](x, y, BLOCK=16)
        return y
