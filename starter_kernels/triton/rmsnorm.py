"""RMSNorm over the last dim: y = x * rsqrt(mean(x^2) + eps) * weight, one program per row.

Memory traffic. The minimum is one read of x, one write of y and the weight once:
(2 * M * N + N) * elem_size bytes, about 5 FLOPs per element, so memory-bound. A row that fits one
block (N <= BLOCK_N) is loaded once and kept in registers: exactly the minimum. A longer row is
swept twice in BLOCK_N-wide chunks (sum of squares, then scale and write); on a GPU the second read
comes mostly from L2.

Numerics. The sum of squares accumulates in fp32 per lane, then one tree reduction; the output is
rounded once, in the kernel.

Backward. With r = rsqrt(mean(x^2) + eps) and gw = grad_out * weight:
    dx = r * (gw - x * r^2 * mean(gw * x)),    dweight = sum over rows of grad_out * x * r.
The forward saves nothing: r, one fp32 value per row, is recomputed from x in the pass the
backward makes over the row anyway (with mean(gw * x), in the same sweep). Kernel 1 runs
BWD programs, each owning a contiguous range of rows: it writes dx for its rows and keeps its
partial dweight in fp32 (in registers when the row fits one block, else in its own row of an
fp32 [programs, N] buffer, no atomics); kernel 2 sums the programs' partials per column in a fixed
order and rounds once. Traffic: x, grad_out read once and dx written once (3 * M * N * elem_size),
plus programs * N * 4 bytes of partials written and read back, about 8 FLOPs per element, so
memory-bound. A row longer than BWD_BLOCK_N is swept twice (statistics, then dx).
"""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"
BACKEND = "triton"

TUNABLES = {"BLOCK_N": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3],
            "BWD_BLOCK_N": [256, 512, 1024, 2048, 4096, 8192], "BWD_num_warps": [1, 2, 4, 8, 16],
            "BWD_PROGRAMS_PER_SM": [1, 2, 4]}
# every lane busy, and at most 64 fp32 values of a block per thread (more spills registers); the
# backward holds x, grad_out, weight and the dweight partial per element: at most 32 per thread
CONSTRAINTS = ["BLOCK_N >= 32 * num_warps", "BLOCK_N <= 64 * 32 * num_warps",
               "BWD_BLOCK_N >= 32 * BWD_num_warps", "BWD_BLOCK_N <= 32 * 32 * BWD_num_warps"]
CONFIG = {"BLOCK_N": 4096, "num_warps": 8, "num_stages": 2, "BWD_BLOCK_N": 4096, "BWD_num_warps": 16,
          "BWD_PROGRAMS_PER_SM": 1}

CPU_PROGRAMS = 4  # the interpreter has no multiprocessors: a few programs, each walking many rows
COLUMN_BLOCK = 256  # the partial-sum reduction's columns per program


@triton.jit
def _rmsnorm_kernel(y_ptr, x_ptr, w_ptr, n_cols, x_row_stride, x_col_stride, w_stride, eps,
                    BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    y_row = y_ptr + row * n_cols
    cols = tl.arange(0, BLOCK_N)
    if ONE_BLOCK:
        mask = cols < n_cols
        x = tl.load(x_row + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + cols * w_stride, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + (start + cols) * w_stride, mask=mask, other=0.0).to(tl.float32)
            tl.store(y_row + start + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x, weight, eps=1e-6):
    n_cols = x.shape[-1]
    y = x.new_empty(x.shape)
    if y.numel() == 0:
        return y
    x2 = x.reshape(-1, n_cols)  # all leading dims are rows; a view whenever the layout allows
    block_n = min(CONFIG["BLOCK_N"], triton.next_power_of_2(n_cols))
    _rmsnorm_kernel[(x2.shape[0],)](
        y, x2, weight, n_cols, x2.stride(0), x2.stride(1), weight.stride(0), eps,
        BLOCK_N=block_n, ONE_BLOCK=n_cols <= block_n,
        num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return y


@triton.jit
def _rmsnorm_bwd_kernel(dx_ptr, part_ptr, g_ptr, x_ptr, w_ptr, n_rows, n_cols, rows_per_program,
                        x_row_stride, x_col_stride, g_row_stride, g_col_stride, w_stride, eps,
                        BLOCK_N: tl.constexpr, ONE_BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * rows_per_program  # int64 row offsets: M * N may pass 2^31
    last = tl.minimum(first + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_N)
    part_row = part_ptr + pid.to(tl.int64) * n_cols
    if ONE_BLOCK:
        mask = cols < n_cols
        w = tl.load(w_ptr + cols * w_stride, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK_N], tl.float32)
        for row in range(first, last):
            x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + row * g_row_stride + cols * g_col_stride, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
            gw = g * w
            dot = tl.sum(gw * x, axis=0) / n_cols
            dx = rstd * (gw - x * (rstd * rstd * dot))
            tl.store(dx_ptr + row * n_cols + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw += g * x * rstd
        tl.store(part_row + cols, dw, mask=mask)
    else:
        for start in range(0, n_cols, BLOCK_N):  # this program's partials start at zero
            tl.store(part_row + start + cols, tl.zeros([BLOCK_N], tl.float32), mask=start + cols < n_cols)
        for row in range(first, last):
            x_row = x_ptr + row * x_row_stride
            g_row = g_ptr + row * g_row_stride
            sq = tl.zeros([BLOCK_N], tl.float32)
            gwx = tl.zeros([BLOCK_N], tl.float32)
            for start in range(0, n_cols, BLOCK_N):
                mask = start + cols < n_cols
                x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(g_row + (start + cols) * g_col_stride, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + (start + cols) * w_stride, mask=mask, other=0.0).to(tl.float32)
                sq += x * x
                gwx += g * w * x
            rstd = tl.rsqrt(tl.sum(sq, axis=0) / n_cols + eps)
            dot = tl.sum(gwx, axis=0) / n_cols
            for start in range(0, n_cols, BLOCK_N):
                mask = start + cols < n_cols
                x = tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
                g = tl.load(g_row + (start + cols) * g_col_stride, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + (start + cols) * w_stride, mask=mask, other=0.0).to(tl.float32)
                dx = rstd * (g * w - x * (rstd * rstd * dot))
                tl.store(dx_ptr + row * n_cols + start + cols, dx.to(dx_ptr.dtype.element_ty), mask=mask)
                part = tl.load(part_row + start + cols, mask=mask, other=0.0)
                tl.store(part_row + start + cols, part + g * x * rstd, mask=mask)


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


def backward_fn(grad_out, out, x, weight, eps=1e-6):
    n_cols = x.shape[-1]
    dx = x.new_empty(x.shape)
    dw = weight.new_empty(weight.shape)
    x2 = x.reshape(-1, n_cols)
    g2 = grad_out.reshape(-1, n_cols)
    n_rows = x2.shape[0]
    programs = _programs(x.device, n_rows)
    part = torch.zeros((programs, n_cols), dtype=torch.float32, device=x.device)
    if n_rows and n_cols:
        block_n = min(CONFIG["BWD_BLOCK_N"], triton.next_power_of_2(n_cols))
        _rmsnorm_bwd_kernel[(programs,)](
            dx, part, g2, x2, weight, n_rows, n_cols, triton.cdiv(n_rows, programs),
            x2.stride(0), x2.stride(1), g2.stride(0), g2.stride(1), weight.stride(0), eps,
            BLOCK_N=block_n, ONE_BLOCK=n_cols <= block_n, num_warps=CONFIG["BWD_num_warps"])
    if n_cols:
        _column_sum_kernel[(triton.cdiv(n_cols, COLUMN_BLOCK),)](dw, part, programs, n_cols,
                                                                  BLOCK=COLUMN_BLOCK, num_warps=4)
    return dx, dw
