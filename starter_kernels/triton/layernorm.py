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

Backward. With xhat = (x - mean) * rstd and gw = grad_out * weight:
    dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)),
    dweight = sum over rows of grad_out * xhat,    dbias = sum over rows of grad_out.
The forward saves nothing: mean and rstd, one fp32 value each per row, are recomputed from x as the
forward computes them (shifted by x[0], two passes), and mean(gw) and mean(gw * xhat) are summed in
the variance's pass. Kernel 1 runs BWD programs, each owning a contiguous range of rows: it writes
dx for its rows and keeps its partial dweight and dbias in fp32 (in registers when the row fits one
block, else in its own rows of an fp32 [2 * programs, N] buffer, no atomics); kernel 2, run once
per weight, sums the programs' partials per column in a fixed order and rounds once. Traffic: x and
grad_out read once, dx written once (3 * M * N * elem_size), plus 2 * programs * N * 4 bytes of
partials written and read back, about 12 FLOPs per element, so memory-bound. A row longer than
BWD_BLOCK_N is swept three times (mean; variance and the two sums; dx).
"""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "layernorm"
BACKEND = "triton"

TUNABLES = {"BLOCK_N": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3],
            "BWD_BLOCK_N": [256, 512, 1024, 2048, 4096, 8192], "BWD_num_warps": [1, 2, 4, 8, 16],
            "BWD_PROGRAMS_PER_SM": [1, 2, 4]}
# every lane busy, and at most 64 fp32 values of a block per thread (more spills registers); the
# backward holds x, grad_out, weight and two partials per element: at most 32 per thread
CONSTRAINTS = ["BLOCK_N >= 32 * num_warps", "BLOCK_N <= 64 * 32 * num_warps",
               "BWD_BLOCK_N >= 32 * BWD_num_warps", "BWD_BLOCK_N <= 32 * 32 * BWD_num_warps"]
CONFIG = {"BLOCK_N": 4096, "num_warps": 8, "num_stages": 2, "BWD_BLOCK_N": 4096, "BWD_num_warps": 16,
          "BWD_PROGRAMS_PER_SM": 1}

CPU_PROGRAMS = 4  # the interpreter has no multiprocessors: a few programs, each walking many rows
COLUMN_BLOCK = 256  # the partial-sum reduction's columns per program


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


@triton.jit
def _row_stats(x_row, g_row, w_ptr, cols, n_cols, x_col_stride, g_col_stride, w_stride, eps,
               BLOCK_N: tl.constexpr):
    """(shift + mean, rstd, mean(gw), mean(gw * xhat)) of a row swept in BLOCK_N chunks."""
    shift = tl.load(x_row).to(tl.float32)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        acc += tl.where(mask, x - shift, 0.0)
    mean_dev = tl.sum(acc, axis=0) / n_cols
    sq = tl.zeros([BLOCK_N], tl.float32)
    gw_sum = tl.zeros([BLOCK_N], tl.float32)
    gwc_sum = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_row + (start + cols) * g_col_stride, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + (start + cols) * w_stride, mask=mask, other=0.0).to(tl.float32)
        centred = tl.where(mask, (x - shift) - mean_dev, 0.0)
        sq += centred * centred
        gw_sum += g * w
        gwc_sum += g * w * centred
    rstd = tl.rsqrt(tl.sum(sq, axis=0) / n_cols + eps)
    return (shift + mean_dev, rstd, tl.sum(gw_sum, axis=0) / n_cols,
            tl.sum(gwc_sum, axis=0) * rstd / n_cols)


@triton.jit
def _layernorm_bwd_kernel(dx_ptr, part_ptr, g_ptr, x_ptr, w_ptr, n_rows, n_cols, rows_per_program,
                          x_row_stride, x_col_stride, g_row_stride, g_col_stride, w_stride, eps,
                          BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * rows_per_program  # int64 row offsets: M * N may pass 2^31
    last = tl.minimum(first + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_N)
    dw_row = part_ptr + pid.to(tl.int64) * n_cols
    db_row = part_ptr + (tl.num_programs(0) + pid).to(tl.int64) * n_cols
    if ONE_BLOCK:
        mask = cols < n_cols
        w = tl.load(w_ptr + cols * w_stride, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK_N], tl.float32)
        db = tl.zeros([BLOCK_N], tl.float32)
        for row in range(first, last):
            x_row = x_ptr + row * x_row_stride
            shift = tl.load(x_row).to(tl.float32)
            x = tl.load(x_row + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + row * g_row_stride + cols * g_col_stride, mask=mask, other=0.0).to(tl.float32)
            dev = tl.where(mask, x - shift, 0.0)
            centred = tl.where(mask, dev - tl.sum(dev, axis=0) / n_cols, 0.0)
            rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / n_cols + eps)
            xhat = centred * rstd
            gw = g * w
            dx = rstd * (gw - tl.sum(gw, axis=0) / n_cols - xhat * (tl.sum(gw * xhat, axis=0) / n_cols))
            tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw += g * xhat
            db += g
        tl.store(dw_row + cols, dw, mask=mask)
        tl.store(db_row + cols, db, mask=mask)
    else:
        for start in range(0, n_cols, BLOCK_N):  # this program's partials start at zero
            tl.store(dw_row + start + cols, tl.zeros([BLOCK_N], tl.float32), mask=start + cols < n_cols)
            tl.store(db_row + start + cols, tl.zeros([BLOCK_N], tl.float32), mask=start + cols < n_cols)
        for row in range(first, last):
            x_row = x_ptr + row * x_row_stride
            g_row = g_ptr + row * g_row_stride
            mean, rstd, gw_mean, gwx_mean = _row_stats(x_row, g_row, w_ptr, cols, n_cols, x_col_stride,
                                                      g_col_stride, w_stride, eps, BLOCK_N)
            for start in range(0, n_cols, BLOCK_N):
                mask = start + cols < n_cols
                x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(g_row + (start + cols) * g_col_stride, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + (start + cols) * w_stride, mask=mask, other=0.0).to(tl.float32)
                xhat = (x - mean) * rstd
                dx = rstd * (g * w - gw_mean - xhat * gwx_mean)
                tl.store(dx_ptr + row * n_cols + start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                dw = tl.load(dw_row + start + cols, mask=mask, other=0.0)
                tl.store(dw_row + start + cols, dw + g * xhat, mask=mask)
                db = tl.load(db_row + start + cols, mask=mask, other=0.0)
                tl.store(db_row + start + cols, db + g, mask=mask)


@triton.jit
def _column_sum_kernel(out_ptr, part_ptr, n_parts, n_cols, BLOCK: tl.constexpr):
    """out[c] = sum over p of part[p, c], in a fixed order (bitwise the same every run)."""
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    acc = tl.zeros([BLOCK], tl.float32)
    for p in range(0, n_parts):
        acc += tl.load(part_ptr + p * n_cols + cols, mask=mask, other=0.0)
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _programs(device, n_rows: int) -> int:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return max(1, min(n_rows, sms * CONFIG["BWD_PROGRAMS_PER_SM"]))
    return max(1, min(n_rows, CPU_PROGRAMS))


def backward_fn(grad_out, out, x, weight, bias, eps=1e-5):
    n_cols = x.shape[-1]
    dx = x.new_empty(x.shape)
    dw = weight.new_empty(weight.shape)
    db = bias.new_empty(bias.shape)
    x2 = x.reshape(-1, n_cols)
    g2 = grad_out.reshape(-1, n_cols)
    n_rows = x2.shape[0]
    programs = _programs(x.device, n_rows)
    part = torch.zeros((2 * programs, n_cols), dtype=torch.float32, device=x.device)
    if n_rows and n_cols:
        block_n = min(CONFIG["BWD_BLOCK_N"], triton.next_power_of_2(n_cols))
        _layernorm_bwd_kernel[(programs,)](
            dx, part, g2, x2, weight, n_rows, n_cols, triton.cdiv(n_rows, programs),
            x2.stride(0), x2.stride(1), g2.stride(0), g2.stride(1), weight.stride(0), eps,
            BLOCK_N=block_n, ONE_BLOCK=n_cols <= block_n, num_warps=CONFIG["BWD_num_warps"])
    if n_cols:
        grid = (triton.cdiv(n_cols, COLUMN_BLOCK),)
        _column_sum_kernel[grid](dw, part[:programs], programs, n_cols, BLOCK=COLUMN_BLOCK, num_warps=4)
        _column_sum_kernel[grid](db, part[programs:], programs, n_cols, BLOCK=COLUMN_BLOCK, num_warps=4)
    return dx, dw, db
