"""A bias added to each row of a product, in Triton: how a matmul winner serves nn.Linear(bias=True).

The matmul type computes a @ b; F.linear with a bias is x @ W.T + bias. Adding the bias in PyTorch
would be PyTorch compute beside the kernel, so this one small kernel does it in place on the
kernel's fresh output: one read and one write of the output, which the measured end-to-end time
includes. The sum is taken in fp32 and rounded once, as cuBLAS's epilogue would.

The router imports this module only when it serves a biased call, and the kernel is made with
triton.jit on its first use, so TRITON_INTERPRET (the Triton interpreter, on a machine with no GPU)
is read when it matters, not when autokernel is imported.
"""
from typing import Any

import torch
import triton
import triton.language as tl

BLOCK = 1024
_kernel: Any = None


def _add_rows(y_ptr, bias_ptr, n_cols, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(bias_ptr + offsets % n_cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offsets, (y + b).to(y_ptr.dtype.element_ty), mask=mask)


def add_bias(out: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """out + bias over the last dim, in place when `out` is dense (a kernel's fresh output is)."""
    global _kernel
    if _kernel is None:
        _kernel = triton.jit(_add_rows)
    out = out.contiguous()
    n = out.numel()
    if n:
        _kernel[(triton.cdiv(n, BLOCK),)](out, bias.contiguous(), out.shape[-1], n, BLOCK=BLOCK)
    return out
