"""RMSNorm with a backward: y = x * rsqrt(mean(x^2) + eps) * weight, a row per program.

Forward: one read of x and one write of y, the row kept in registers (one block holds it).
Backward: dx_j = rstd * (g_j w_j - x_j * rstd^2 * mean_k(g_k w_k x_k)), rstd recomputed from x
(one fp32 value per row: cheaper than saving it); dweight_j = sum over rows of g_ij x_ij rstd_i,
summed in two kernels: each program adds its rows into one fp32 partial row, then a second kernel
sums the partial rows per column block.
"""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"
BACKEND = "triton"
CONFIG = {"BWD_ROWS": 4, "BWD_BLOCK_N": 64}


@triton.jit
def _forward(y_ptr, x_ptr, w_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    tl.store(y_ptr + row * n_cols + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _backward_rows(dx_ptr, partial_ptr, g_ptr, x_ptr, w_ptr, n_rows, n_cols, eps,
                   ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    block = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_N], tl.float32)
    for i in range(ROWS):
        row = (block * ROWS + i).to(tl.int64)
        live = cols < tl.where(row < n_rows, n_cols, 0)  # a row past the end loads nothing
        x = tl.load(x_ptr + row * n_cols + cols, mask=live, other=0.0).to(tl.float32)
        g = tl.load(g_ptr + row * n_cols + cols, mask=live, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        gw = g * w
        dx = rstd * (gw - x * (rstd * rstd) * (tl.sum(gw * x, axis=0) / n_cols))
        tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=live)
        dw += g * x * rstd
    tl.store(partial_ptr + block * n_cols + cols, dw, mask=mask)


@triton.jit
def _sum_partials(dw_ptr, partial_ptr, n_partials, n_cols, BLOCK_N: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    acc = tl.zeros([BLOCK_N], tl.float32)
    for p in range(n_partials):
        acc += tl.load(partial_ptr + p * n_cols + cols, mask=mask, other=0.0)
    tl.store(dw_ptr + cols, acc.to(dw_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x, weight, eps=1e-6):
    n_cols = x.shape[-1]
    y = x.new_empty(x.shape)
    if y.numel() == 0:
        return y
    x2 = x.contiguous().reshape(-1, n_cols)
    _forward[(x2.shape[0],)](y, x2, weight.contiguous(), n_cols, eps, BLOCK_N=triton.next_power_of_2(n_cols))
    return y


def backward_fn(grad_out, out, x, weight, eps=1e-6):
    n_cols = x.shape[-1]
    x2 = x.contiguous().reshape(-1, n_cols)
    g2 = grad_out.contiguous().reshape(-1, n_cols)
    n_rows = x2.shape[0]
    dx = x.new_empty(x.shape)
    rows = CONFIG["BWD_ROWS"]
    n_partials = triton.cdiv(n_rows, rows)
    partial = x2.new_empty((n_partials, n_cols), dtype=torch.float32)  # the partial sums stay in fp32
    _backward_rows[(n_partials,)](dx, partial, g2, x2, weight.contiguous(), n_rows, n_cols, eps,
                                  ROWS=rows, BLOCK_N=triton.next_power_of_2(n_cols))
    dweight = weight.new_empty(weight.shape)
    block = CONFIG["BWD_BLOCK_N"]
    _sum_partials[(triton.cdiv(n_cols, block),)](dweight, partial, n_partials, n_cols, BLOCK_N=block)
    return dx, dweight
