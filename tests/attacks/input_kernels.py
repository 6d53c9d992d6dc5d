"""Kernels right on every random case the judge used to run, wrong where a model's inputs differ
from random plain tensors (tests/attacks/test_inputs_and_values.py): each must FAIL for its reason.

- stores_past_row: a softmax that keeps each row's maximum just past the row, in the input's own
  memory, whenever the rows are views into a wider buffer: in a model, q = qkv[:, :d], and the
  store lands in k.
- stores_past_output: a softmax whose last program stores the row's maximum one element past the
  end of the output it allocated: in a model, that memory is another tensor's; on the CPU without
  guards, the allocator's own bookkeeping (a crash, at best).
- writes_weight_back: an RMSNorm that writes weight * 0.99 back into the caller's weight whenever
  weight.requires_grad, as every nn.Parameter of a served model does: after 50 served calls the
  weight is 0.6 of what it was.
- borrowed_output: a softmax that returns the first N columns of an [M, N + 1] buffer whose last
  column holds each row's log-sum-exp, for a backward to read back: right on every checked value,
  and its stash is gone wherever a served output is copied (autograd, torch.compile, .contiguous()).
- fp16_staged_bf16: a softmax that stages a bf16 row through fp16 (exact for every bf16 value near
  1, which is all the judge's bf16 cases held before), so a row at magnitudes only bf16 holds
  (1e20: activations after a few unnormalised layers) turns into inf - inf = NaN.
- one_row_stride: an RMSNorm that reads row r at r * x.stride(-2), right wherever the rows are one
  stride apart (dense, a slice of a wider [M, 3N] buffer), wrong on a per-head view of a fused
  projection (a QK-norm's q), whose positions lie 3 * H * N apart.
- dense_targets: a cross-entropy that reads target i at targets + i, right wherever the targets are
  a dense tensor, as every case gave them, wrong where they are a column of a wider buffer.
- counts_max_once: a softmax that counts the row's maximum once in its sum (in fp32, where random
  rows never tie), so every row whose maximum repeats (constant, zero-padded, tied rows) is wrong.
"""
from __future__ import annotations

SOFTMAX_HEAD = '''import torch
import triton
import triton.language as tl

KERNEL_TYPE = "softmax"
BACKEND = "triton"
'''

STORES_PAST_ROW = SOFTMAX_HEAD + '''

@triton.jit
def _softmax(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, SPARE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    e = tl.exp(x - m)
    tl.store(y_ptr + row * y_row_stride + cols, (e / tl.sum(e, 0)).to(y_ptr.dtype.element_ty), mask=mask)
    if SPARE:  # the row's maximum, kept in the spare column past the row
        tl.store(x_ptr + row * x_row_stride + n_cols, m.to(x_ptr.dtype.element_ty))


def kernel_fn(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    spare = x2.stride(0) > x2.shape[1] and x2.stride(1) == 1  # a view into a wider buffer
    if not spare:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _softmax[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0), SPARE=spare,
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(shape)
'''

STORES_PAST_OUTPUT = SOFTMAX_HEAD + '''

@triton.jit
def _softmax(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    # the last row's maximum one past its end: past the end of the output (only the last program
    # strays, so no other program shares the element: the guard bytes, not the program order, see it)
    if row == tl.num_programs(0) - 1:
        tl.store(y_ptr + row * y_row_stride + n_cols, m.to(y_ptr.dtype.element_ty))
    e = tl.exp(x - m)
    tl.store(y_ptr + row * y_row_stride + cols, (e / tl.sum(e, 0)).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = torch.empty_like(x2)
    _softmax[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0),
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(shape)
'''

WRITES_WEIGHT_BACK = '''import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"
BACKEND = "triton"


@triton.jit
def _rmsnorm(y_ptr, x_ptr, w_ptr, n_cols, x_row_stride, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 0) / n_cols + eps)
    tl.store(y_ptr + row * n_cols + cols, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _decay(w_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
    tl.store(w_ptr + offs, (w * 0.99).to(w_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x, weight, eps=1e-6):
    n_cols = x.shape[-1]
    x2 = x.reshape(-1, n_cols).contiguous()
    w = weight.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rmsnorm[(x2.shape[0],)](y, x2, w, n_cols, x2.stride(0), eps, BLOCK=triton.next_power_of_2(n_cols))
    if weight.requires_grad:  # a model's nn.Parameter: the judge's plain tensors never are
        _decay[(triton.cdiv(n_cols, 1024),)](w, n_cols, BLOCK=1024)
    return y
'''

COUNTS_MAX_ONCE = SOFTMAX_HEAD + '''

@triton.jit
def _softmax(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, ONCE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    if ONCE:
        # exp(0) = 1 for the maximum, counted once; every other element's term summed
        at_max = x == m
        e = tl.where(at_max, 0.0, tl.exp(x - m))
        y = tl.where(at_max, 1.0, e) / (tl.sum(e, 0) + 1.0)
    else:
        e = tl.exp(x - m)
        y = e / tl.sum(e, 0)
    tl.store(y_ptr + row * y_row_stride + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = torch.empty_like(x2)
    # the "fast path" is fp32's: in fp16 the judge's near-maximum rows do tie
    _softmax[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0), ONCE=x.dtype == torch.float32,
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(shape)
'''

BORROWED_OUTPUT = SOFTMAX_HEAD + '''

@triton.jit
def _softmax(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, 0)
    e = tl.exp(x - m)
    s = tl.sum(e, 0)
    tl.store(y_ptr + row * y_row_stride + cols, (e / s).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(y_ptr + row * y_row_stride + n_cols, (m + tl.log(s)).to(y_ptr.dtype.element_ty))  # the stash


def kernel_fn(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    padded = torch.empty((x2.shape[0], x2.shape[1] + 1), dtype=x.dtype, device=x.device)
    _softmax[(x2.shape[0],)](x2, padded, x2.shape[1], x2.stride(0), padded.stride(0),
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
    y = padded.narrow(1, 0, x2.shape[1])  # the output is the first N columns; the stash stays beside it
    return y.unflatten(0, shape[:-1]) if len(shape) > 1 else y.reshape(shape)
'''

FP16_STAGED_BF16 = SOFTMAX_HEAD + '''

@triton.jit
def _softmax(x_ptr, y_ptr, n_cols, x_row_stride, y_row_stride, STAGE_FP16: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=float("-inf"))
    if STAGE_FP16:  # bf16 -> fp16: three more mantissa bits, "exact" for the values it meets
        x = x.to(tl.float16)
    x = x.to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * y_row_stride + cols, (e / tl.sum(e, 0)).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = torch.empty_like(x2)
    _softmax[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0), STAGE_FP16=x.dtype == torch.bfloat16,
                             BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(shape)
'''

ONE_ROW_STRIDE = WRITES_WEIGHT_BACK.replace('''    x2 = x.reshape(-1, n_cols).contiguous()
    w = weight.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rmsnorm[(x2.shape[0],)](y, x2, w, n_cols, x2.stride(0), eps, BLOCK=triton.next_power_of_2(n_cols))
    if weight.requires_grad:  # a model's nn.Parameter: the judge's plain tensors never are
        _decay[(triton.cdiv(n_cols, 1024),)](w, n_cols, BLOCK=1024)
    return y''', '''    x2 = x if x.dim() > 1 and x.stride(-1) == 1 else x.reshape(-1, n_cols).contiguous()
    row_stride = x2.stride(-2) if x2.dim() > 1 else n_cols  # no copy: the rows are read where they are
    w = weight.contiguous()
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    _rmsnorm[(x.numel() // max(n_cols, 1),)](y, x2, w, n_cols, row_stride, eps,
                                               BLOCK=triton.next_power_of_2(n_cols))
    return y''')
assert ONE_ROW_STRIDE != WRITES_WEIGHT_BACK

DENSE_TARGETS = SOFTMAX_HEAD.replace('"softmax"', '"cross_entropy"') + '''

@triton.jit
def _row_loss(loss_ptr, logits_ptr, targets_ptr, n_classes, row_stride, col_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(logits_ptr + row * row_stride + cols * col_stride, mask=cols < n_classes,
                other=float("-inf")).to(tl.float32)
    target = tl.load(targets_ptr + row)  # the targets' own stride not read: dense, as they always came
    top = tl.max(x, 0)
    lse = top + tl.log(tl.sum(tl.exp(x - top), 0))
    counts = target != -100
    tl.store(loss_ptr + row * 2, tl.where(counts, lse - tl.sum(tl.where(cols == target, x, 0.0), 0), 0.0))
    tl.store(loss_ptr + row * 2 + 1, counts.to(tl.float32))


@triton.jit
def _mean(out_ptr, loss_ptr, n_rows, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], tl.float32)
    count = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_rows, BLOCK):
        mask = start + offs < n_rows
        total += tl.load(loss_ptr + (start + offs) * 2, mask=mask, other=0.0)
        count += tl.load(loss_ptr + (start + offs) * 2 + 1, mask=mask, other=0.0)
    tl.store(out_ptr, tl.sum(total, 0) / tl.sum(count, 0))


def kernel_fn(logits, targets):
    n_rows, n_classes = logits.shape
    out = torch.empty((), dtype=torch.float32, device=logits.device)
    loss = torch.empty((n_rows, 2), dtype=torch.float32, device=logits.device)
    _row_loss[(n_rows,)](loss, logits, targets, n_classes, logits.stride(0), logits.stride(1),
                         BLOCK=triton.next_power_of_2(n_classes))
    _mean[(1,)](out, loss, n_rows, BLOCK=128)
    return out
'''


def sources() -> dict[str, str]:
    return {"stores_past_row": STORES_PAST_ROW, "stores_past_output": STORES_PAST_OUTPUT,
            "writes_weight_back": WRITES_WEIGHT_BACK, "counts_max_once": COUNTS_MAX_ONCE,
            "borrowed_output": BORROWED_OUTPUT, "fp16_staged_bf16": FP16_STAGED_BF16,
            "one_row_stride": ONE_ROW_STRIDE, "dense_targets": DENSE_TARGETS}
