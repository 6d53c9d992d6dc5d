"""A chain: the residual add and RMSNorm of the sum, one pass; out[0] = x + residual (the next
residual reads it), out[1] = rmsnorm(out[0]) * weight; out [2, *x.shape].

Unfused, the add writes the sum and RMSNorm reads it straight back: (5 * M * N + N) * elem_size
bytes. Fused: x and the residual read once, the sum and the output written once, the weight once:
(4 * M * N + N) * elem_size; about 6 FLOPs per element, so memory-bound. One program per row,
swept in BLOCK_N-wide chunks: the sum of squares, then the stores (one chunk when the row fits).

Numerics. The sum and its statistics in fp32; the stored sum is rounded once, and the norm is of
the fp32 sum (not of its rounding), the output rounded once.

Backward. With s = x + residual, r = rsqrt(mean(s^2) + eps), gy = grad_out[1] * weight:
    ds = grad_out[0] + r * (gy - s * r^2 * mean(gy * s)),   dx = dresidual = ds,
    dweight = sum over rows of grad_out[1] * s * r.
Nothing is saved: s and r are recomputed from x and the residual in the pass the backward makes
anyway. Kernel 1 runs BWD programs, each owning a contiguous range of rows: it writes dx and
dresidual and keeps its partial dweight in its own row of an fp32 [programs, N] buffer (no
atomics); kernel 2 sums the partials per column in a fixed order and rounds once.
"""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "add_rmsnorm"
BACKEND = "triton"

TUNABLES = {"BLOCK_N": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3],
            "BWD_BLOCK_N": [256, 512, 1024, 2048, 4096], "BWD_num_warps": [1, 2, 4, 8, 16],
            "BWD_PROGRAMS_PER_SM": [1, 2, 4]}
# every lane busy, and at most 32 fp32 values of a block per thread per operand
CONSTRAINTS = ["BLOCK_N >= 32 * num_warps", "BLOCK_N <= 32 * 32 * num_warps",
               "BWD_BLOCK_N >= 32 * BWD_num_warps", "BWD_BLOCK_N <= 16 * 32 * BWD_num_warps"]
CONFIG = {"BLOCK_N": 4096, "num_warps": 8, "num_stages": 2, "BWD_BLOCK_N": 2048, "BWD_num_warps": 8,
          "BWD_PROGRAMS_PER_SM": 1}

CPU_PROGRAMS = 4  # the interpreter has no multiprocessors: a few programs, each walking many rows
COLUMN_BLOCK = 256  # the partial-sum reduction's columns per program


@triton.jit
def _add_rmsnorm_kernel(out_ptr, x_ptr, r_ptr, w_ptr, n_rows, n_cols, sx_r, sx_c, sr_r, sr_c, w_stride, eps,
                        BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    sum_row = out_ptr + row * n_cols
    y_row = out_ptr + (n_rows + row) * n_cols
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        s = (tl.load(x_ptr + row * sx_r + (start + cols) * sx_c, mask=mask, other=0.0).to(tl.float32)
             + tl.load(r_ptr + row * sr_r + (start + cols) * sr_c, mask=mask, other=0.0).to(tl.float32))
        acc += s * s
        tl.store(sum_row + start + cols, s.to(out_ptr.dtype.element_ty), mask=mask)
    rstd = tl.rsqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        s = (tl.load(x_ptr + row * sx_r + (start + cols) * sx_c, mask=mask, other=0.0).to(tl.float32)
             + tl.load(r_ptr + row * sr_r + (start + cols) * sr_c, mask=mask, other=0.0).to(tl.float32))
        w = tl.load(w_ptr + (start + cols) * w_stride, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_row + start + cols, (s * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x, residual, weight, eps=1e-6):
    n_cols = x.shape[-1]
    out = x.new_empty((2, *x.shape))
    if out.numel() == 0:
        return out
    x2, r2 = x.reshape(-1, n_cols), residual.reshape(-1, n_cols)  # views whenever the layout allows
    block_n = min(CONFIG["BLOCK_N"], triton.next_power_of_2(n_cols))
    _add_rmsnorm_kernel[(x2.shape[0],)](
        out, x2, r2, weight, x2.shape[0], n_cols, x2.stride(0), x2.stride(1), r2.stride(0), r2.stride(1),
        weight.stride(0), eps, BLOCK_N=block_n, num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return out


@triton.jit
def _add_rmsnorm_bwd_kernel(dx_ptr, dr_ptr, part_ptr, gs_ptr, gy_ptr, x_ptr, r_ptr, w_ptr, n_rows, n_cols,
                            rows_per_program, sgs_r, sgs_c, sgy_r, sgy_c, sx_r, sx_c, sr_r, sr_c, w_stride, eps,
                            BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * rows_per_program  # int64 row offsets: M * N may pass 2^31
    last = tl.minimum(first + rows_per_program, n_rows)
    cols = tl.arange(0, BLOCK_N)
    part_row = part_ptr + pid.to(tl.int64) * n_cols
    for start in range(0, n_cols, BLOCK_N):  # this program's partials start at zero
        tl.store(part_row + start + cols, tl.zeros([BLOCK_N], tl.float32), mask=start + cols < n_cols)
    for row in range(first, last):
        sq = tl.zeros([BLOCK_N], tl.float32)
        gws = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            s = (tl.load(x_ptr + row * sx_r + (start + cols) * sx_c, mask=mask, other=0.0).to(tl.float32)
                 + tl.load(r_ptr + row * sr_r + (start + cols) * sr_c, mask=mask, other=0.0).to(tl.float32))
            gy = tl.load(gy_ptr + row * sgy_r + (start + cols) * sgy_c, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + (start + cols) * w_stride, mask=mask, other=0.0).to(tl.float32)
            sq += s * s
            gws += gy * w * s
        rstd = tl.rsqrt(tl.sum(sq, axis=0) / n_cols + eps)
        dot = tl.sum(gws, axis=0) / n_cols
        for start in range(0, n_cols, BLOCK_N):
            mask = start + cols < n_cols
            s = (tl.load(x_ptr + row * sx_r + (start + cols) * sx_c, mask=mask, other=0.0).to(tl.float32)
                 + tl.load(r_ptr + row * sr_r + (start + cols) * sr_c, mask=mask, other=0.0).to(tl.float32))
            gy = tl.load(gy_ptr + row * sgy_r + (start + cols) * sgy_c, mask=mask, other=0.0).to(tl.float32)
            gs = tl.load(gs_ptr + row * sgs_r + (start + cols) * sgs_c, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + (start + cols) * w_stride, mask=mask, other=0.0).to(tl.float32)
            ds = gs + rstd * (gy * w - s * (rstd * rstd * dot))
            tl.store(dx_ptr + row * n_cols + start + cols, ds.to(dx_ptr.dtype.element_ty), mask=mask)
            tl.store(dr_ptr + row * n_cols + start + cols, ds.to(dr_ptr.dtype.element_ty), mask=mask)
            part = tl.load(part_row + start + cols, mask=mask, other=0.0)
            tl.store(part_row + start + cols, part + gy * s * rstd, mask=mask)


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


def backward_fn(grad_out, out, x, residual, weight, eps=1e-6):
    n_cols = x.shape[-1]
    dx, dr, dw = x.new_empty(x.shape), residual.new_empty(residual.shape), weight.new_empty(weight.shape)
    x2, r2 = x.reshape(-1, n_cols), residual.reshape(-1, n_cols)
    g3 = grad_out.reshape(2, -1, n_cols)
    gs, gy = g3[0], g3[1]
    n_rows = x2.shape[0]
    programs = _programs(x.device, n_rows)
    part = torch.zeros((programs, n_cols), dtype=torch.float32, device=x.device)
    if n_rows and n_cols:
        block_n = min(CONFIG["BWD_BLOCK_N"], triton.next_power_of_2(n_cols))
        _add_rmsnorm_bwd_kernel[(programs,)](
            dx, dr, part, gs, gy, x2, r2, weight, n_rows, n_cols, triton.cdiv(n_rows, programs),
            gs.stride(0), gs.stride(1), gy.stride(0), gy.stride(1), x2.stride(0), x2.stride(1),
            r2.stride(0), r2.stride(1), weight.stride(0), eps, BLOCK_N=block_n, num_warps=CONFIG["BWD_num_warps"])
    if n_cols:
        _column_sum_kernel[(triton.cdiv(n_cols, COLUMN_BLOCK),)](dw, part, programs, n_cols,
                                                                  BLOCK=COLUMN_BLOCK, num_warps=4)
    return dx, dr, dw
