"""LayerNorm over the last dim: one program per row, fp32 statistics in two passes.

Memory traffic. The minimum is one read of x and one write of y, plus weight and bias once:
(2 * M * N + 2 * N) * elem_size bytes, about 8 FLOPs per element, so memory-bound. A row that fits
one block (N <= BLOCK_N) is loaded once and kept in registers: exactly the minimum. A longer row is
swept three times in BLOCK_N-wide chunks (sum, then squared deviations, then normalise and write);
on a GPU the second and third reads come mostly from L2.

Numerics. Mean and variance are two passes in fp32, never E[x^2] - E[x]^2, which loses every digit
when |mean| >> std. The sums are taken of x - x[0] (the row's first element): that difference is
exact for values near the mean, so even a row with mean 1e3 and std 1 keeps the mean to fp32
precision of the deviations rather than to the rounding step of 1e3 (6e-5). Output rounded once.
"""
import triton
import triton.language as tl

KERNEL_TYPE = "layernorm"
BACKEND = "triton"

TUNABLES = {"BLOCK_N": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3]}
# every lane busy, and at most 64 fp32 values of a block per thread (more spills registers)
CONSTRAINTS = ["BLOCK_N >= 32 * num_warps", "BLOCK_N <= 64 * 32 * num_warps"]
CONFIG = {"BLOCK_N": 4096, "num_warps": 8, "num_stages": 2}


@triton.jit
def _layernorm_kernel(y_ptr, x_ptr, w_ptr, b_ptr, n_cols, x_row_stride, x_col_stride, w_stride,
                      b_stride, eps, BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * n_cols
    cols = tl.arange(0, BLOCK_N)
    shift = tl.load(x_row).to(tl.float32)
    if ONE_BLOCK:
        mask = cols < n_cols
        x = tl.load(x_row + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        dev = tl.where(mask, x - shift, 0.0)
        centred = tl.where(mask, dev - tl.sum(dev, axis=0) / n_cols, 0.0)
        rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols * w_stride, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols * b_stride, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (centred * rstd * w + b).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            acc += tl.where(mask, x - shift, 0.0)
        mean_dev = tl.sum(acc, axis=0) / n_cols
        acc = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            centred = tl.where(mask, (x - shift) - mean_dev, 0.0)
            acc += centred * centred
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + (start + cols) * w_stride, mask=mask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + (start + cols) * b_stride, mask=mask, other=0.0).to(tl.float32)
            y = ((x - shift) - mean_dev) * rstd * w + b
            tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x, weight, bias, eps=1e-5):
    n_cols = x.shape[-1]
    y = x.new_empty(x.shape)
    if y.numel() == 0:
        return y
    x2 = x.reshape(-1, n_cols)  # all leading dims are rows; a view whenever the layout allows
    block_n = min(CONFIG["BLOCK_N"], triton.next_power_of_2(n_cols))
    _layernorm_kernel[(x2.shape[0],)](
        y, x2, weight, bias, n_cols, x2.stride(0), x2.stride(1), weight.stride(0), bias.stride(0),
        eps, BLOCK_N=block_n, ONE_BLOCK=n_cols <= block_n,
        num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return y
