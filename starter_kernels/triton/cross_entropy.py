"""Cross-entropy of logits [N, V] against int64 targets [N], mean over rows, as a float32 scalar.

Memory traffic. Every logit is read once: N * V * elem_size bytes, plus 8 * N for the targets and
4 * N written and read back for the per-row losses; about 4 FLOPs per logit (max, subtract, exp,
sum), so memory-bound. Kernel 1 runs one program per row and sweeps it once in BLOCK_V-wide chunks
with an online log-sum-exp: per lane, a running maximum and a sum of exponentials rescaled whenever
the maximum grows. loss = logsumexp(row) - row[target]. Kernel 2 is a single program that sums the
N losses in a fixed order and divides by the number of counted rows.

Numerics. Statistics in fp32 whatever the logits' dtype. No atomics: the mean is bitwise the same
on every run. Targets equal to -100 (PyTorch's default ignore_index) count for nothing, as in
F.cross_entropy; any other target outside [0, V) makes the loss NaN rather than reading memory
outside the row.

Backward. dlogits = (softmax(row) - onehot(target)) * grad_out / counted, zero on ignored rows;
grad_out is the float32 scalar upstream of the mean. The forward saves nothing: a row's max and
sum of exponentials (two fp32 values) are recomputed in a first sweep of the row, the same online
pass as the forward, and a second sweep writes the row's gradient. Kernel 1 (one program) counts
the rows that count; kernel 2 runs one program per row. Traffic: logits read twice (the second
mostly from L2 on a GPU) and dlogits written once, 3 * N * V * elem_size bytes, about 6 FLOPs per
logit, memory-bound.
"""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "cross_entropy"
BACKEND = "triton"

TUNABLES = {"BLOCK_V": [256, 512, 1024, 2048, 4096, 8192, 16384], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3],
            "BWD_BLOCK_V": [256, 512, 1024, 2048, 4096, 8192, 16384], "BWD_num_warps": [1, 2, 4, 8, 16]}
# every lane busy, and at most 64 fp32 values of a block per thread (more spills registers)
CONSTRAINTS = ["BLOCK_V >= 32 * num_warps", "BLOCK_V <= 64 * 32 * num_warps",
               "BWD_BLOCK_V >= 32 * BWD_num_warps", "BWD_BLOCK_V <= 64 * 32 * BWD_num_warps"]
CONFIG = {"BLOCK_V": 4096, "num_warps": 8, "num_stages": 2, "BWD_BLOCK_V": 4096, "BWD_num_warps": 8}

IGNORE_INDEX = tl.constexpr(-100)
# Lowest finite fp32: a running max that starts here instead of at -inf never computes
# -inf - (-inf) = NaN on a lane whose logits so far are all -inf.
FP32_LOWEST = tl.constexpr(-3.4028234663852886e38)
MEAN_BLOCK = 1024  # kernel 2 reads the N losses in chunks of this many


@triton.jit
def _row_loss_kernel(loss_ptr, counted_ptr, logits_ptr, targets_ptr, n_classes, row_stride,
                     col_stride, target_stride, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    logits_row = logits_ptr + row * row_stride
    cols = tl.arange(0, BLOCK_V)
    run_max = tl.full([BLOCK_V], FP32_LOWEST, tl.float32)
    run_sum = tl.zeros([BLOCK_V], tl.float32)
    for start in range(0, n_classes, BLOCK_V):
        mask = start + cols < n_classes
        x = tl.load(logits_row + (start + cols) * col_stride, mask=mask, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(run_max, x)
        run_sum = run_sum * tl.exp(run_max - new_max) + tl.exp(x - new_max)
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    lse = row_max + tl.log(tl.sum(run_sum * tl.exp(run_max - row_max), axis=0))
    target = tl.load(targets_ptr + row * target_stride)
    counted = target != IGNORE_INDEX
    in_range = (target >= 0) & (target < n_classes)
    target_logit = tl.load(logits_row + target * col_stride, mask=in_range, other=float("nan")).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(counted, lse - target_logit, 0.0))
    tl.store(counted_ptr + row, counted.to(tl.int32))


@triton.jit
def _mean_kernel(out_ptr, loss_ptr, counted_ptr, n_rows, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    total = tl.zeros([BLOCK], tl.float32)
    count = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n_rows, BLOCK):
        mask = start + offs < n_rows
        total += tl.load(loss_ptr + start + offs, mask=mask, other=0.0)
        count += tl.load(counted_ptr + start + offs, mask=mask, other=0)
    tl.store(out_ptr, tl.sum(total, axis=0) / tl.sum(count, axis=0).to(tl.float32))


def kernel_fn(logits, targets):
    n_rows, n_classes = logits.shape
    out = torch.empty((), dtype=torch.float32, device=logits.device)
    losses = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)
    counted = torch.empty((n_rows,), dtype=torch.int32, device=logits.device)
    if n_rows > 0:
        block_v = min(CONFIG["BLOCK_V"], triton.next_power_of_2(max(n_classes, 1)))
        _row_loss_kernel[(n_rows,)](
            losses, counted, logits, targets, n_classes, logits.stride(0), logits.stride(1),
            targets.stride(0), BLOCK_V=block_v,
            num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    # an empty batch gives 0 / 0 = NaN, as F.cross_entropy does
    _mean_kernel[(1,)](out, losses, counted, n_rows, BLOCK=MEAN_BLOCK, num_warps=4)
    return out


@triton.jit
def _count_kernel(count_ptr, targets_ptr, n_rows, target_stride, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    count = tl.zeros([BLOCK], tl.int32)
    for start in range(0, n_rows, BLOCK):
        mask = start + offs < n_rows
        target = tl.load(targets_ptr + (start + offs) * target_stride, mask=mask, other=IGNORE_INDEX)
        count += (target != IGNORE_INDEX).to(tl.int32)
    tl.store(count_ptr, tl.sum(count, axis=0).to(tl.float32))


@triton.jit
def _row_grad_kernel(dlogits_ptr, logits_ptr, targets_ptr, grad_ptr, count_ptr, n_classes, row_stride,
                     col_stride, target_stride, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    logits_row = logits_ptr + row * row_stride
    d_row = dlogits_ptr + row * n_classes
    cols = tl.arange(0, BLOCK_V)
    run_max = tl.full([BLOCK_V], FP32_LOWEST, tl.float32)
    run_sum = tl.zeros([BLOCK_V], tl.float32)
    for start in range(0, n_classes, BLOCK_V):
        mask = start + cols < n_classes
        x = tl.load(logits_row + (start + cols) * col_stride, mask=mask, other=-float("inf")).to(tl.float32)
        new_max = tl.maximum(run_max, x)
        run_sum = run_sum * tl.exp(run_max - new_max) + tl.exp(x - new_max)
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    row_sum = tl.sum(run_sum * tl.exp(run_max - row_max), axis=0)
    target = tl.load(targets_ptr + row * target_stride)
    # d(mean)/d(loss of this row) = grad_out / counted; an ignored row takes no part in the mean
    scale = tl.where(target != IGNORE_INDEX, tl.load(grad_ptr) / tl.load(count_ptr), 0.0)
    for start in range(0, n_classes, BLOCK_V):
        mask = start + cols < n_classes
        x = tl.load(logits_row + (start + cols) * col_stride, mask=mask, other=-float("inf")).to(tl.float32)
        p = tl.exp(x - row_max) / row_sum
        d = (p - tl.where(start + cols == target, 1.0, 0.0)) * scale
        tl.store(d_row + start + cols, d.to(dlogits_ptr.dtype.element_ty), mask=mask)


def backward_fn(grad_out, out, logits, targets):
    n_rows, n_classes = logits.shape
    dlogits = logits.new_empty(logits.shape)
    if dlogits.numel() == 0:
        return (dlogits,)
    count = torch.empty((), dtype=torch.float32, device=logits.device)
    _count_kernel[(1,)](count, targets, n_rows, targets.stride(0), BLOCK=MEAN_BLOCK, num_warps=4)
    block_v = min(CONFIG["BWD_BLOCK_V"], triton.next_power_of_2(n_classes))
    _row_grad_kernel[(n_rows,)](
        dlogits, logits, targets, grad_out, count, n_classes, logits.stride(0), logits.stride(1),
        targets.stride(0), BLOCK_V=block_v, num_warps=CONFIG["BWD_num_warps"])
    return (dlogits,)
