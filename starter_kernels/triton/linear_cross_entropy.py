"""A chain: the final projection and cross-entropy, chunked so that the [N, V] logits never exist.

loss = cross_entropy(x @ weight.T, targets, ignore_index, reduction); x [N, D], weight [V, D]
(nn.Linear's layout), targets int64 [N]; rows whose target is ignore_index count for nothing (in
the mean's denominator either); "mean" over the rows kept or "sum"; a float32 scalar.

Forward. Each program takes BLOCK_M rows and walks the vocabulary in BLOCK_V-wide chunks: the
chunk's logits x_rows @ weight_chunk.T (a tl.dot over D in BLOCK_K steps, fp32 accumulators), an
online max and sum of exponentials for the logsumexp, and the target's logit picked up as its
chunk passes; it writes one fp32 loss per row. A second, one-program kernel sums the rows in a
fixed order (bitwise the same every run) and divides by the rows kept for the mean.
Traffic: x read once per row block, the weight once per row block ((N * D + ceil(N / BLOCK_M) *
V * D) * elem_size), the targets, and 4 bytes per row; unfused, the logits alone are N * V *
elem_size written and read twice more (log_softmax, then nll_loss). 2 * N * D * V FLOPs: at
BLOCK_M rows per weight read, compute-bound on a GPU once BLOCK_M passes the ridge point.

Numerics. Products summed in fp32 (`input_precision="ieee"`: no TF32 on an fp32 target), the
logsumexp in fp32, one rounding at the end: the loss is float32.

Backward. grad_out is a float32 scalar; each kept row's scale is grad_out (sum) or grad_out / kept
rows (mean), an ignored row's 0. dlogits = (softmax(logits) - onehot(target)) * scale, never stored
whole: the logsumexp of each row is recomputed by the forward's kernel (the forward saves nothing),
then dx = dlogits @ weight, a program per (row block, BLOCK_D columns of x) walking the vocabulary,
and dweight = dlogits.T @ x, a program per (vocabulary chunk, BLOCK_D columns) walking the rows;
both recompute their logits chunk by chunk and accumulate in fp32, with no atomics.
"""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "linear_cross_entropy"
BACKEND = "triton"

TUNABLES = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_V": [16, 32, 64, 128, 256], "BLOCK_K": [16, 32, 64, 128],
            "num_warps": [1, 2, 4, 8], "num_stages": [1, 2, 3],
            "BWD_BLOCK_M": [16, 32, 64, 128], "BWD_BLOCK_V": [16, 32, 64, 128], "BWD_BLOCK_D": [16, 32, 64, 128],
            "BWD_num_warps": [1, 2, 4, 8]}
# at most 64 fp32 accumulator values per thread (more spills registers)
CONSTRAINTS = ["BLOCK_M * BLOCK_V <= 64 * 32 * num_warps",
               "BWD_BLOCK_M * BWD_BLOCK_V + BWD_BLOCK_V * BWD_BLOCK_D <= 64 * 32 * BWD_num_warps"]
CONFIG = {"BLOCK_M": 32, "BLOCK_V": 64, "BLOCK_K": 32, "num_warps": 4, "num_stages": 2,
          "BWD_BLOCK_M": 32, "BWD_BLOCK_V": 32, "BWD_BLOCK_D": 32, "BWD_num_warps": 4}

REDUCE_BLOCK = 256
REDUCTIONS = ("mean", "sum")


@triton.jit
def _logits_chunk(x_ptr, w_ptr, rows, row_mask, vs, v_mask, n_dim, sx_r, sx_c, sw_r, sw_c,
                  BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """x[rows] @ weight[vs].T in fp32, [BLOCK_M, BLOCK_V]."""
    acc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
    for k0 in range(0, n_dim, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_mask = ks < n_dim
        xb = tl.load(x_ptr + rows[:, None] * sx_r + ks[None, :] * sx_c, mask=row_mask[:, None] & k_mask[None, :],
                     other=0.0)
        wb = tl.load(w_ptr + vs[None, :] * sw_r + ks[:, None] * sw_c, mask=k_mask[:, None] & v_mask[None, :],
                     other=0.0)
        acc = tl.dot(xb, wb, acc, input_precision="ieee")
    return acc


@triton.jit
def _lse_kernel(loss_ptr, lse_ptr, x_ptr, w_ptr, t_ptr, n_rows, n_dim, n_vocab, sx_r, sx_c, sw_r, sw_c, st,
                ignore_index, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    tgt = tl.load(t_ptr + rows * st, mask=row_mask, other=ignore_index)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_M], tl.float32)
    picked = tl.zeros([BLOCK_M], tl.float32)
    for v0 in range(0, n_vocab, BLOCK_V):  # the first chunk always has a column: m is finite after it
        vs = v0 + tl.arange(0, BLOCK_V)
        v_mask = vs < n_vocab
        acc = _logits_chunk(x_ptr, w_ptr, rows, row_mask, vs, v_mask, n_dim, sx_r, sx_c, sw_r, sw_c,
                            BLOCK_M, BLOCK_V, BLOCK_K)
        logits = tl.where(v_mask[None, :], acc, float("-inf"))
        m_new = tl.maximum(m, tl.max(logits, axis=1))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), axis=1)
        m = m_new
        picked += tl.sum(tl.where(vs[None, :] == tgt[:, None], acc, 0.0), axis=1)
    lse = m + tl.log(total)
    keep = row_mask & (tgt != ignore_index)
    tl.store(loss_ptr + rows, tl.where(keep, lse - picked, 0.0), mask=row_mask)
    tl.store(lse_ptr + rows, lse, mask=row_mask)


@triton.jit
def _reduce_kernel(out_ptr, scale_ptr, loss_ptr, g_ptr, t_ptr, n_rows, st, ignore_index,
                   MEAN: tl.constexpr, BACKWARD: tl.constexpr, BLOCK: tl.constexpr):
    """Forward: out = the rows' losses summed in a fixed order (over the rows kept, for the mean).
    BACKWARD: scale = grad_out (sum) or grad_out / rows kept (mean), the scale of a kept row."""
    acc = tl.zeros([BLOCK], tl.float32)
    kept = tl.zeros([BLOCK], tl.float32)
    for r0 in range(0, n_rows, BLOCK):
        rows = r0 + tl.arange(0, BLOCK)
        mask = rows < n_rows
        tgt = tl.load(t_ptr + rows * st, mask=mask, other=ignore_index)
        kept += tl.where(mask & (tgt != ignore_index), 1.0, 0.0)
        if not BACKWARD:
            acc += tl.load(loss_ptr + rows, mask=mask, other=0.0)
    count = tl.sum(kept, axis=0)
    if BACKWARD:
        g = tl.load(g_ptr).to(tl.float32)
        tl.store(scale_ptr, g / count if MEAN else g)
    else:
        total = tl.sum(acc, axis=0)
        tl.store(out_ptr, total / count if MEAN else total)  # a mean of no rows is NaN, as PyTorch's


def _check(reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction}")


def _row_lse(x, weight, targets, ignore_index):
    n_rows, n_dim = x.shape
    loss = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    lse = torch.empty((n_rows,), dtype=torch.float32, device=x.device)
    if n_rows:
        block_m = CONFIG["BLOCK_M"]
        _lse_kernel[(triton.cdiv(n_rows, block_m),)](
            loss, lse, x, weight, targets, n_rows, n_dim, weight.shape[0], x.stride(0), x.stride(1),
            weight.stride(0), weight.stride(1), targets.stride(0), ignore_index,
            BLOCK_M=block_m, BLOCK_V=CONFIG["BLOCK_V"], BLOCK_K=CONFIG["BLOCK_K"],
            num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return loss, lse


def kernel_fn(x, weight, targets, ignore_index=-100, reduction="mean"):
    _check(reduction)
    loss, _ = _row_lse(x, weight, targets, ignore_index)
    out = torch.empty((), dtype=torch.float32, device=x.device)
    _reduce_kernel[(1,)](out, out, loss, loss, targets, x.shape[0], targets.stride(0), ignore_index,
                         MEAN=reduction == "mean", BACKWARD=False, BLOCK=REDUCE_BLOCK, num_warps=4)
    return out


@triton.jit
def _dlogits(x_ptr, w_ptr, lse_ptr, t_ptr, scale, rows, row_mask, vs, v_mask, n_dim, sx_r, sx_c, sw_r, sw_c, st,
             ignore_index, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """(softmax - onehot(target)) * scale for rows x vs, fp32; zero on ignored and masked rows."""
    acc = _logits_chunk(x_ptr, w_ptr, rows, row_mask, vs, v_mask, n_dim, sx_r, sx_c, sw_r, sw_c,
                        BLOCK_M, BLOCK_V, BLOCK_K)
    lse = tl.load(lse_ptr + rows, mask=row_mask, other=0.0)
    tgt = tl.load(t_ptr + rows * st, mask=row_mask, other=ignore_index)
    p = tl.where(v_mask[None, :], tl.exp(acc - lse[:, None]), 0.0)
    onehot = tl.where(vs[None, :] == tgt[:, None], 1.0, 0.0)
    row_scale = tl.where(row_mask & (tgt != ignore_index), scale, 0.0)
    return (p - onehot) * row_scale[:, None]


@triton.jit
def _dx_kernel(dx_ptr, x_ptr, w_ptr, lse_ptr, t_ptr, scale_ptr, n_rows, n_dim, n_vocab, sx_r, sx_c, sw_r, sw_c, st,
               ignore_index, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = ds < n_dim
    scale = tl.load(scale_ptr)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for v0 in range(0, n_vocab, BLOCK_V):
        vs = v0 + tl.arange(0, BLOCK_V)
        v_mask = vs < n_vocab
        dlog = _dlogits(x_ptr, w_ptr, lse_ptr, t_ptr, scale, rows, row_mask, vs, v_mask, n_dim, sx_r, sx_c,
                        sw_r, sw_c, st, ignore_index, BLOCK_M, BLOCK_V, BLOCK_D)
        wd = tl.load(w_ptr + vs[:, None] * sw_r + ds[None, :] * sw_c, mask=v_mask[:, None] & d_mask[None, :],
                     other=0.0).to(tl.float32)
        acc = tl.dot(dlog, wd, acc, input_precision="ieee")
    tl.store(dx_ptr + rows[:, None] * n_dim + ds[None, :], acc.to(dx_ptr.dtype.element_ty),
             mask=row_mask[:, None] & d_mask[None, :])


@triton.jit
def _dw_kernel(dw_ptr, x_ptr, w_ptr, lse_ptr, t_ptr, scale_ptr, n_rows, n_dim, n_vocab, sx_r, sx_c, sw_r, sw_c, st,
               ignore_index, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
    vs = tl.program_id(0).to(tl.int64) * BLOCK_V + tl.arange(0, BLOCK_V)
    v_mask = vs < n_vocab
    ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = ds < n_dim
    scale = tl.load(scale_ptr)
    acc = tl.zeros([BLOCK_V, BLOCK_D], tl.float32)
    for r0 in range(0, n_rows, BLOCK_M):
        rows = r0 + tl.arange(0, BLOCK_M)
        row_mask = rows < n_rows
        dlog = _dlogits(x_ptr, w_ptr, lse_ptr, t_ptr, scale, rows, row_mask, vs, v_mask, n_dim, sx_r, sx_c,
                        sw_r, sw_c, st, ignore_index, BLOCK_M, BLOCK_V, BLOCK_D)
        xd = tl.load(x_ptr + rows[:, None] * sx_r + ds[None, :] * sx_c, mask=row_mask[:, None] & d_mask[None, :],
                     other=0.0).to(tl.float32)
        acc = tl.dot(tl.trans(dlog), xd, acc, input_precision="ieee")
    tl.store(dw_ptr + vs[:, None] * n_dim + ds[None, :], acc.to(dw_ptr.dtype.element_ty),
             mask=v_mask[:, None] & d_mask[None, :])


def backward_fn(grad_out, out, x, weight, targets, ignore_index=-100, reduction="mean"):
    _check(reduction)
    n_rows, n_dim = x.shape
    n_vocab = weight.shape[0]
    dx, dw = x.new_empty(x.shape), weight.new_empty(weight.shape)
    _, lse = _row_lse(x, weight, targets, ignore_index)  # recomputed: the forward saves nothing
    scale = torch.empty((1,), dtype=torch.float32, device=x.device)
    _reduce_kernel[(1,)](scale, scale, lse, grad_out, targets, n_rows, targets.stride(0), ignore_index,
                         MEAN=reduction == "mean", BACKWARD=True, BLOCK=REDUCE_BLOCK, num_warps=4)
    block_m, block_v, block_d = CONFIG["BWD_BLOCK_M"], CONFIG["BWD_BLOCK_V"], CONFIG["BWD_BLOCK_D"]
    strides = (x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), targets.stride(0), ignore_index)
    if n_rows and n_dim:
        _dx_kernel[(triton.cdiv(n_rows, block_m), triton.cdiv(n_dim, block_d))](
            dx, x, weight, lse, targets, scale, n_rows, n_dim, n_vocab, *strides,
            BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_D=block_d, num_warps=CONFIG["BWD_num_warps"])
    if n_vocab and n_dim:
        _dw_kernel[(triton.cdiv(n_vocab, block_v), triton.cdiv(n_dim, block_d))](
            dw, x, weight, lse, targets, scale, n_rows, n_dim, n_vocab, *strides,
            BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_D=block_d, num_warps=CONFIG["BWD_num_warps"])
    return dx, dw
