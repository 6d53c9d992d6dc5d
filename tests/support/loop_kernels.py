"""Model and kernel files for the search loop's end-to-end tests, and LLM replies that carry them."""
from __future__ import annotations

SOFTMAX_MODEL = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(16, 256)]


def get_init_inputs():
    return []
'''

# Correct: short rows are packed several to a program once every multiprocessor of the target GPU
# (132 on sm_90) has a row, so its grid still fills the GPU and a CPU search may keep it (the loop's
# tests fix the figures it is timed at; the interpreter alone would favour fewer programs).
FAST = '''"""Softmax, several short rows per program once every multiprocessor has one: fewer programs
for the same bytes."""
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
BACKEND = "triton"

FP32_LOWEST = tl.constexpr(-3.4028234663852886e38)


@triton.jit
def _rows_kernel(y_ptr, x_ptr, n_rows, n_cols, stride_row, stride_col,
                 ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None].to(tl.int64) * stride_row + cols[None, :] * stride_col
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
    row_max = tl.maximum(tl.max(x, axis=1), FP32_LOWEST)
    num = tl.exp(x - row_max[:, None])
    y = num / tl.sum(num, axis=1)[:, None]
    out = rows[:, None].to(tl.int64) * n_cols + cols[None, :]
    tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x):
    n_cols = x.shape[-1]
    y = x.new_empty(x.shape)
    if y.numel() == 0:
        return y
    x2 = x.reshape(-1, n_cols)
    n_rows = x2.shape[0]
    block_n = triton.next_power_of_2(n_cols)
    rows = max(1, min(64, 4096 // block_n, n_rows // 132))
    _rows_kernel[(triton.cdiv(n_rows, rows),)](y, x2, n_rows, n_cols, x2.stride(0), x2.stride(1),
                                               ROWS=rows, BLOCK_N=block_n)
    return y
'''

# Wrong: a real Triton kernel that forgets to normalise (exp(x - max) without the division).
WRONG = FAST.replace("y = num / tl.sum(num, axis=1)[:, None]", "y = num")

# A cheat: PyTorch computes the softmax through tensor operators (torch.softmax itself is not on
# the kernel allow-list: refused before import), so only the integrity stage can see it.
CHEAT = '''import math

KERNEL_TYPE = "softmax"
BACKEND = "triton"


def kernel_fn(x):
    z = x.float()
    e = math.e ** (z - z.max(-1, keepdim=True).values)
    total = e @ e.new_full((x.shape[-1], 1), 1.0)
    return (e / total).to(x.dtype)
'''


def reply_with(description: str, source: str) -> str:
    return f"{description}\n\nHere is the file:\n\n```python\n{source}```\n"
