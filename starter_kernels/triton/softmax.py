"""Softmax over the last dim: one program per row.

Memory traffic. A softmax must read x once and write y once: 2 * M * N * elem_size bytes for M rows
of N columns, about 5 FLOPs per element (max, subtract, exp, sum, divide), so it is memory-bound on
every GPU. A row that fits one block (N <= BLOCK_N) is loaded once, held in registers and written:
exactly the minimum. A longer row takes two sweeps over BLOCK_N-wide chunks: the first keeps, per
lane, a running maximum and a running sum of exponentials rescaled whenever the maximum grows (the
online softmax), the second re-reads the row (from L2 on a GPU) and writes exp(x - max) / sum. That
is 3 * M * N * elem_size bytes through the memory hierarchy, of which the re-read is mostly cache.

Numerics: statistics in fp32 whatever the input dtype; the output is rounded once, in the kernel.

Backward. dx = y * (grad_out - sum(grad_out * y)) per row, from the saved output y alone: the
row's max and sum are never needed again, and the one fp32 value per row (the dot product) is
computed in the pass that reads the row. One program per row; a row that fits one block is read
once: y and grad_out read, dx written, 3 * M * N * elem_size bytes, about 4 FLOPs per element,
memory-bound. A longer row is swept twice (the dot product, then dx).
"""
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
BACKEND = "triton"

TUNABLES = {"BLOCK_N": [256, 512, 1024, 2048, 4096, 8192, 16384], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3],
            "BWD_BLOCK_N": [256, 512, 1024, 2048, 4096, 8192, 16384], "BWD_num_warps": [1, 2, 4, 8, 16]}
# every lane busy, and at most 64 fp32 values of a block per thread (more spills registers); the
# backward holds y and grad_out per element
CONSTRAINTS = ["BLOCK_N >= 32 * num_warps", "BLOCK_N <= 64 * 32 * num_warps",
               "BWD_BLOCK_N >= 32 * BWD_num_warps", "BWD_BLOCK_N <= 32 * 32 * BWD_num_warps"]
CONFIG = {"BLOCK_N": 4096, "num_warps": 8, "num_stages": 2, "BWD_BLOCK_N": 4096, "BWD_num_warps": 8}

# Lowest finite fp32: a running max that starts here instead of at -inf never computes
# -inf - (-inf) = NaN on a lane whose values so far are all -inf (masked attention scores).
FP32_LOWEST = tl.constexpr(-3.4028234663852886e38)


@triton.jit
def _softmax_kernel(y_ptr, x_ptr, n_cols, x_row_stride, x_col_stride,
                    BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * n_cols
    cols = tl.arange(0, BLOCK_N)
    if ONE_BLOCK:
        mask = cols < n_cols
        x = tl.load(x_row + cols * x_col_stride, mask=mask, other=-float("inf")).to(tl.float32)
        num = tl.exp(x - tl.max(x, axis=0))
        y = num / tl.sum(num, axis=0)
        tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        run_max = tl.full([BLOCK_N], FP32_LOWEST, tl.float32)
        run_sum = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=-float("inf")).to(tl.float32)
            new_max = tl.maximum(run_max, x)
            run_sum = run_sum * tl.exp(run_max - new_max) + tl.exp(x - new_max)
            run_max = new_max
        row_max = tl.max(run_max, axis=0)
        row_sum = tl.sum(run_sum * tl.exp(run_max - row_max), axis=0)
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=-float("inf")).to(tl.float32)
            y = tl.exp(x - row_max) / row_sum
            tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x):
    n_cols = x.shape[-1]
    y = x.new_empty(x.shape)
    if y.numel() == 0:
        return y
    x2 = x.reshape(-1, n_cols)  # all leading dims are rows; a view whenever the layout allows
    block_n = min(CONFIG["BLOCK_N"], triton.next_power_of_2(n_cols))
    _softmax_kernel[(x2.shape[0],)](
        y, x2, n_cols, x2.stride(0), x2.stride(1),
        BLOCK_N=block_n, ONE_BLOCK=n_cols <= block_n,
        num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return y


@triton.jit
def _softmax_bwd_kernel(dx_ptr, g_ptr, y_ptr, n_cols, g_row_stride, g_col_stride, y_row_stride,
                        y_col_stride, BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    g_row = g_ptr + row * g_row_stride
    y_row = y_ptr + row * y_row_stride
    dx_row = dx_ptr + row * n_cols
    cols = tl.arange(0, BLOCK_N)
    if ONE_BLOCK:
        mask = cols < n_cols
        g = tl.load(g_row + cols * g_col_stride, mask=mask, other=0.0).to(tl.float32)
        y = tl.load(y_row + cols * y_col_stride, mask=mask, other=0.0).to(tl.float32)
        dx = y * (g - tl.sum(g * y, axis=0))
        tl.store(dx_row + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            g = tl.load(g_row + (start + cols) * g_col_stride, mask=mask, other=0.0).to(tl.float32)
            y = tl.load(y_row + (start + cols) * y_col_stride, mask=mask, other=0.0).to(tl.float32)
            acc += g * y
        dot = tl.sum(acc, axis=0)
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            g = tl.load(g_row + (start + cols) * g_col_stride, mask=mask, other=0.0).to(tl.float32)
            y = tl.load(y_row + (start + cols) * y_col_stride, mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_row + start + cols, (y * (g - dot)).to(dx_ptr.dtype.element_ty), mask=mask)


def backward_fn(grad_out, out, x):
    n_cols = x.shape[-1]
    dx = x.new_empty(x.shape)
    if dx.numel() == 0:
        return (dx,)
    g2 = grad_out.reshape(-1, n_cols)
    y2 = out.reshape(-1, n_cols)
    block_n = min(CONFIG["BWD_BLOCK_N"], triton.next_power_of_2(n_cols))
    _softmax_bwd_kernel[(g2.shape[0],)](
        dx, g2, y2, n_cols, g2.stride(0), g2.stride(1), y2.stride(0), y2.stride(1),
        BLOCK_N=block_n, ONE_BLOCK=n_cols <= block_n, num_warps=CONFIG["BWD_num_warps"])
    return (dx,)
