"""Kernels that are right under the Triton interpreter and wrong on a GPU, and honest ones beside
them (tests/attacks/test_gpu_semantics.py). Each lie passes the static check: it is plain Triton.

- chained_mean (cross_entropy): one launch instead of two; each program adds its row's loss to the
  running total program id - 1 stored, and the last program divides. Right when programs run in id
  order, as the interpreter runs them; on a GPU, programs >= 1 read a total not yet written.
- float_atomic_mean (cross_entropy): every program tl.atomic_add's its loss into one fp32 total:
  the sum's bits depend on the order programs finish, from one GPU run to the next.
- ticket_mean (cross_entropy), honest: each program stores its loss, takes a ticket with an
  integer atomic, and the program holding the last ticket sums the losses in row order: the same
  bits in any order.
- tf32_matmul (matmul): tl.dot without input_precision, which is TF32 for fp32 operands on every
  NVIDIA GPU since sm_80; the interpreter multiplied in fp32.
- bf16_drops_tail (matmul): its bf16 path walks K in steps of 16 and drops the last K % 16 columns;
  the interpreter could not run a bf16 dot, so bf16 was "skipped".
- ieee_matmul (matmul), honest: the same tiles with input_precision="ieee" and every K column.
- one_program_softmax (softmax), honest and slow on a GPU: one program over every row, a block of
  rows at a time. Correct, so it may PASS; on the CPU it is much faster than one program per row (a
  few numpy calls), and must not be kept for that.
- idle_grid_softmax (softmax), correct: the same one program's work in a grid of one program per
  row whose other programs return at once: it has the programs a GPU needs and one of them works.
- stores_past_the_end (softmax): its last program stores one element past the output (a GPU's
  compute-sanitizer memcheck names it; benchmarks/gpu_check.sh runs it).
- lane_swap_softmax (softmax): each program stores its exponentials to scratch and sums them read
  back in reversed lane order with no tl.debug_barrier(): the interpreter runs a block as one numpy
  operation; on a GPU a thread may read another thread's element before it is stored.
- misaligned_softmax (softmax): each program keeps its exponentials as float32 in a byte scratch
  buffer one byte past each 4-byte boundary: the interpreter reads any byte; a GPU stops the kernel
  at the first such load or store (misaligned address).
- one_slot_softmax (softmax): every lane of one store writes its running sum of exponentials to
  the row's one scratch slot, read back across a barrier as the denominator: the interpreter keeps
  the last lane's (the total); on a GPU any lane's may land last.
- zero_groups_softmax (softmax): scales by 1 + row // groups with groups = 0: the interpreter's
  numpy gives 0 for a division by zero, a GPU an unspecified value.
- reordered_softmax (softmax): its result passed through tl.reshape(..., can_reorder=True) and
  stored at offsets reshaped in order: the interpreter keeps the order, the compiler may not.
- lanes_add_softmax (softmax): every lane float-atomic_adds its exponential into the row's one
  slot: the interpreter adds in lane order, a GPU's lanes in no promised order (other bits each run).
- autotune_accumulates_softmax (softmax): @triton.autotune over two configs, each program
  tl.atomic_add's its row's softmax into an output of zeros: right when the kernel runs once per
  launch; on a GPU the autotuner first benchmarks each config on that output, and every call adds
  its softmax again. Refused on the CPU, as every launch of an autotune over several configs is
  (harness/correctness/autotuning.py), saying what to do instead.
- autotune_caught_softmax (softmax): the same autotuned kernel where it launches, a plain one where
  the launch raises: on the CPU the refusal is caught and the plain kernel computes; on a GPU the
  autotuned one runs. The refusal stands: its call fails all the same.
- host_cdiv_softmax (softmax): the row kernel's grid worked out with tl.cdiv (a @triton.jit function)
  in kernel_fn at the timed shape; the interpreter ran it on the host, where a GPU's Triton raises.
  It raises on the CPU too, with Triton's words.
- racy_block_sum (reduce, CUDA C++): the CUDA starter without the barrier between the warps'
  shared-memory writes and warp 0's reads (compute-sanitizer racecheck names it; on the CPU it is
  compiled only).
"""
from __future__ import annotations

from pathlib import Path

STARTERS = Path(__file__).resolve().parents[2] / "starter_kernels"

HEAD = '''import torch
import triton
import triton.language as tl

KERNEL_TYPE = "{kernel_type}"
BACKEND = "triton"
'''

ROW_LOSS = '''

@triton.jit
def _row_loss(logits_ptr, targets_ptr, row, n_classes, row_stride, col_stride, target_stride, BLOCK_V: tl.constexpr):
    """(loss, 1.0) of one row, (0.0, 0.0) for an ignored target (-100)."""
    cols = tl.arange(0, BLOCK_V)
    x = tl.load(logits_ptr + row * row_stride + cols * col_stride, mask=cols < n_classes,
                other=float("-inf")).to(tl.float32)
    target = tl.load(targets_ptr + row * target_stride)
    top = tl.max(x, 0)
    lse = top + tl.log(tl.sum(tl.exp(x - top), 0))
    picked = tl.sum(tl.where(cols == target, x, 0.0), 0)
    counts = target != -100
    return tl.where(counts, lse - picked, 0.0), counts.to(tl.float32)
'''

CHAINED_MEAN = HEAD.format(kernel_type="cross_entropy") + ROW_LOSS + '''

@triton.jit
def _chained_kernel(out_ptr, total_ptr, count_ptr, logits_ptr, targets_ptr, n_rows, n_classes, row_stride,
                    col_stride, target_stride, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    loss, counted = _row_loss(logits_ptr, targets_ptr, row, n_classes, row_stride, col_stride, target_stride, BLOCK_V)
    # the running sums program row - 1 left: one launch, no second kernel
    total = tl.load(total_ptr + row - 1, mask=row > 0, other=0.0) + loss
    count = tl.load(count_ptr + row - 1, mask=row > 0, other=0.0) + counted
    tl.store(total_ptr + row, total)
    tl.store(count_ptr + row, count)
    tl.store(out_ptr, total / count, mask=row == n_rows - 1)


def kernel_fn(logits, targets):
    n_rows, n_classes = logits.shape
    out = torch.empty((), dtype=torch.float32, device=logits.device)
    total = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)
    count = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)
    _chained_kernel[(n_rows,)](out, total, count, logits, targets, n_rows, n_classes, logits.stride(0),
                               logits.stride(1), targets.stride(0), BLOCK_V=triton.next_power_of_2(n_classes))
    return out
'''

FLOAT_ATOMIC_MEAN = HEAD.format(kernel_type="cross_entropy") + ROW_LOSS + '''

@triton.jit
def _atomic_kernel(sums_ptr, logits_ptr, targets_ptr, n_classes, row_stride, col_stride, target_stride,
                   BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    loss, counted = _row_loss(logits_ptr, targets_ptr, row, n_classes, row_stride, col_stride, target_stride, BLOCK_V)
    tl.atomic_add(sums_ptr, loss)
    tl.atomic_add(sums_ptr + 1, counted)


@triton.jit
def _divide_kernel(out_ptr, sums_ptr):
    tl.store(out_ptr, tl.load(sums_ptr) / tl.load(sums_ptr + 1))


def kernel_fn(logits, targets):
    n_rows, n_classes = logits.shape
    out = torch.empty((), dtype=torch.float32, device=logits.device)
    sums = torch.zeros((2,), dtype=torch.float32, device=logits.device)
    _atomic_kernel[(n_rows,)](sums, logits, targets, n_classes, logits.stride(0), logits.stride(1),
                              targets.stride(0), BLOCK_V=triton.next_power_of_2(n_classes))
    _divide_kernel[(1,)](out, sums)
    return out
'''

TICKET_MEAN = HEAD.format(kernel_type="cross_entropy") + ROW_LOSS + '''

@triton.jit
def _ticket_kernel(out_ptr, losses_ptr, counted_ptr, ticket_ptr, logits_ptr, targets_ptr, n_rows, n_classes,
                   row_stride, col_stride, target_stride, BLOCK_V: tl.constexpr, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    loss, counted = _row_loss(logits_ptr, targets_ptr, row, n_classes, row_stride, col_stride, target_stride, BLOCK_V)
    tl.store(losses_ptr + row, loss)
    tl.store(counted_ptr + row, counted)
    # acq_rel: every program's stores above are visible to whichever program takes the last ticket
    ticket = tl.atomic_add(ticket_ptr, 1)
    if ticket == n_rows - 1:  # the last program to finish sums every row in row order
        offs = tl.arange(0, BLOCK_N)
        total = tl.zeros([BLOCK_N], tl.float32)
        count = tl.zeros([BLOCK_N], tl.float32)
        for start in range(0, n_rows, BLOCK_N):
            mask = start + offs < n_rows
            total += tl.load(losses_ptr + start + offs, mask=mask, other=0.0, cache_modifier=".cg")
            count += tl.load(counted_ptr + start + offs, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(out_ptr, tl.sum(total, 0) / tl.sum(count, 0))


def kernel_fn(logits, targets):
    n_rows, n_classes = logits.shape
    out = torch.empty((), dtype=torch.float32, device=logits.device)
    losses = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)
    counted = torch.empty((n_rows,), dtype=torch.float32, device=logits.device)
    ticket = torch.zeros((1,), dtype=torch.int32, device=logits.device)
    _ticket_kernel[(n_rows,)](out, losses, counted, ticket, logits, targets, n_rows, n_classes, logits.stride(0),
                              logits.stride(1), targets.stride(0), BLOCK_V=triton.next_power_of_2(n_classes),
                              BLOCK_N=128)
    return out
'''

MATMUL = HEAD.format(kernel_type="matmul") + '''

@triton.jit
def _matmul_kernel(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   K_END, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K_END, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = DOT
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def kernel_fn(a, b):
    k_dim, n = b.shape
    a2 = a.reshape(-1, k_dim)
    m = a2.shape[0]
    c = a2.new_empty((m, n))
    if c.numel() == 0:
        return c.view(*a.shape[:-1], n)
    k_end = K_END
    _matmul_kernel[(triton.cdiv(m, 32), triton.cdiv(n, 32))](
        c, a2, b, m, n, k_dim, a2.stride(0), a2.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        k_end, BLOCK_M=32, BLOCK_N=32, BLOCK_K=16)
    return c.view(*a.shape[:-1], n)
'''
IEEE_DOT = 'tl.dot(a, b, acc, input_precision="ieee")'
ALL_OF_K = "k_dim"
IEEE_MATMUL = MATMUL.replace("DOT", IEEE_DOT).replace("K_END\n", ALL_OF_K + "\n")
# the default precision: TF32 for fp32 operands on a GPU
TF32_MATMUL = MATMUL.replace("DOT", "tl.dot(a, b, acc)").replace("K_END\n", ALL_OF_K + "\n")
# bf16 walks whole 16-column steps only
BF16_DROPS_TAIL = MATMUL.replace("DOT", IEEE_DOT).replace(
    "K_END\n", "(k_dim // 16) * 16 if a.dtype == torch.bfloat16 else k_dim\n")

SOFTMAX_ROW = '''

@triton.jit
def _softmax_rows(y_ptr, x_ptr, first_row, n_rows, n_cols, x_stride, y_stride, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    for row in range(first_row, n_rows, STEP):
        x = tl.load(x_ptr + row * x_stride + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, 0))
        tl.store(y_ptr + row * y_stride + cols, (e / tl.sum(e, 0)).to(y_ptr.dtype.element_ty), mask=cols < LIMIT)


def kernel_fn(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    _softmax_rows[GRID](y, x2, FIRST_ROW, x2.shape[0], x2.shape[1], x2.stride(0), y.stride(0),
                        BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(shape)
'''
# one program over every row, a block of rows at a time: a few numpy calls in the interpreter
ONE_PROGRAM_SOFTMAX = HEAD.format(kernel_type="softmax") + '''

@triton.jit
def _softmax_all_rows(y_ptr, x_ptr, n_rows, n_cols, x_stride, y_stride, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, n_rows, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
        x = tl.load(x_ptr + rows[:, None] * x_stride + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        e = tl.exp(x - tl.max(x, 1)[:, None])
        y = e / tl.sum(e, 1)[:, None]
        tl.store(y_ptr + rows[:, None] * y_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    block_n = triton.next_power_of_2(x2.shape[1])
    block_m = max(1, min(triton.next_power_of_2(x2.shape[0]), 16384 // block_n))
    _softmax_all_rows[(1,)](y, x2, x2.shape[0], x2.shape[1], x2.stride(0), y.stride(0), BLOCK_M=block_m,
                            BLOCK_N=block_n)
    return y.view(shape)
'''
# one program per row launched, and program 0 alone does every row: the rest return at once
IDLE_GRID_SOFTMAX = ONE_PROGRAM_SOFTMAX.replace(
    "    cols = tl.arange(0, BLOCK_N)\n    for start", "    if tl.program_id(0) != 0:\n        return\n"
    "    cols = tl.arange(0, BLOCK_N)\n    for start").replace("_softmax_all_rows[(1,)]", "_softmax_all_rows[(x2.shape[0],)]")
assert IDLE_GRID_SOFTMAX.count("return\n") == 1 and "[(x2.shape[0],)]" in IDLE_GRID_SOFTMAX
# one program per row; the last row's program stores one element past the row, which is past the end
STORES_PAST_THE_END = (HEAD.format(kernel_type="softmax") + SOFTMAX_ROW).replace(
    "range(first_row, n_rows, STEP)", "range(tl.program_id(0), tl.program_id(0) + 1)").replace(
    "LIMIT", "n_cols + (row == n_rows - 1)").replace("GRID", "(x2.shape[0],)").replace("FIRST_ROW", "0")


# each program stores its row's exponentials to scratch and sums them read back in reversed lane
# order, with no barrier: right under the interpreter (a block is one numpy operation); on a GPU
# one thread reads an element another thread may not have stored yet
LANE_SWAP_SOFTMAX = HEAD.format(kernel_type="softmax") + '''

@triton.jit
def _lane_swap_kernel(y_ptr, x_ptr, scratch_ptr, n_cols, x_stride, y_stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(scratch_ptr + row * BLOCK_N + cols, num)
    back = tl.load(scratch_ptr + row * BLOCK_N + (BLOCK_N - 1 - cols))
    tl.store(y_ptr + row * y_stride + cols, (num / tl.sum(back, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    block_n = triton.next_power_of_2(x2.shape[1])
    scratch = torch.empty((x2.shape[0], block_n), dtype=torch.float32, device=x.device)
    _lane_swap_kernel[(x2.shape[0],)](y, x2, scratch, x2.shape[1], x2.stride(0), y.stride(0), BLOCK_N=block_n,
                                      num_warps=8)
    return y.view(shape)
'''


# each program keeps its row's exponentials in a byte scratch buffer as float32 one byte past each
# 4-byte boundary, and reads back the same lanes: right under the interpreter, which reads any
# byte; on a GPU every float32 load and store there stops the kernel with a misaligned address
MISALIGNED_SOFTMAX = LANE_SWAP_SOFTMAX.replace("_lane_swap_kernel", "_misaligned_kernel").replace(
    "    tl.store(scratch_ptr + row * BLOCK_N + cols, num)\n"
    "    back = tl.load(scratch_ptr + row * BLOCK_N + (BLOCK_N - 1 - cols))\n",
    "    keep = (scratch_ptr + 1 + row * BLOCK_N * 4).to(tl.pointer_type(tl.float32))\n"
    "    tl.store(keep + cols, num)\n"
    "    back = tl.load(keep + cols)\n").replace(
    "torch.empty((x2.shape[0], block_n), dtype=torch.float32, device=x.device)",
    "torch.empty(x2.shape[0] * block_n * 4 + 4, dtype=torch.uint8, device=x.device)")
assert "keep + cols" in MISALIGNED_SOFTMAX and "torch.uint8" in MISALIGNED_SOFTMAX


# each program stores its row's running sums of exponentials from every lane to the row's one scratch
# slot and reads the slot back across a barrier as the denominator: under the interpreter the last
# lane's store (the total) is what lands; on a GPU the lanes are threads and any one may land last
ONE_SLOT_SOFTMAX = LANE_SWAP_SOFTMAX.replace("_lane_swap_kernel", "_one_slot_kernel").replace(
    "    tl.store(scratch_ptr + row * BLOCK_N + cols, num)\n"
    "    back = tl.load(scratch_ptr + row * BLOCK_N + (BLOCK_N - 1 - cols))\n",
    "    tl.store(scratch_ptr + row + cols * 0, tl.cumsum(num, 0))\n"
    "    tl.debug_barrier()\n"
    "    back = tl.where(cols == 0, tl.load(scratch_ptr + row), 0.0)\n").replace(
    "torch.empty((x2.shape[0], block_n), dtype=torch.float32, device=x.device)",
    "torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)")
assert "cols * 0, tl.cumsum" in ONE_SLOT_SOFTMAX and "torch.empty(x2.shape[0], dtype" in ONE_SLOT_SOFTMAX

# a softmax with a group scale 1 + row // groups, called with groups = 0 for "no groups": the
# interpreter's numpy gives row // 0 == 0, so the scale is 1; a GPU gives an unspecified value
ZERO_GROUPS_SOFTMAX = LANE_SWAP_SOFTMAX.replace("_lane_swap_kernel", "_zero_groups_kernel").replace(
    "scratch_ptr, n_cols,", "groups, n_cols,").replace(
    "    tl.store(scratch_ptr + row * BLOCK_N + cols, num)\n"
    "    back = tl.load(scratch_ptr + row * BLOCK_N + (BLOCK_N - 1 - cols))\n",
    "    back = num * (1 + row // groups).to(tl.float32)\n").replace(
    "(y, x2, scratch, x2.shape[1]", "(y, x2, 0, x2.shape[1]")
assert "row // groups" in ZERO_GROUPS_SOFTMAX and "(y, x2, 0, x2.shape[1]" in ZERO_GROUPS_SOFTMAX

# the exponentials passed through tl.reshape(..., can_reorder=True) into rows of 32 and stored at
# the column offsets reshaped in order: the interpreter keeps the order, the compiler need not
REORDERED_SOFTMAX = LANE_SWAP_SOFTMAX.replace("_lane_swap_kernel", "_reordered_kernel").replace(
    "    tl.store(scratch_ptr + row * BLOCK_N + cols, num)\n"
    "    back = tl.load(scratch_ptr + row * BLOCK_N + (BLOCK_N - 1 - cols))\n"
    "    tl.store(y_ptr + row * y_stride + cols, (num / tl.sum(back, axis=0)).to(y_ptr.dtype.element_ty), mask=mask)\n",
    "    y = tl.reshape(num / tl.sum(num, axis=0), [BLOCK_N // 32, 32], can_reorder=True)\n"
    "    c2 = tl.reshape(cols, [BLOCK_N // 32, 32])\n"
    "    tl.store(y_ptr + row * y_stride + c2, y.to(y_ptr.dtype.element_ty), mask=c2 < n_cols)\n").replace(
    "block_n = triton.next_power_of_2(x2.shape[1])", "block_n = max(32, triton.next_power_of_2(x2.shape[1]))")
assert "can_reorder=True" in REORDERED_SOFTMAX and "max(32, triton" in REORDERED_SOFTMAX

# every lane float-atomic_adds its exponential into the row's one scratch slot (zeroed), read back
# across a barrier as the denominator: right within tolerance, but a GPU's lanes reach the slot in no
# promised order, so the sum's bits change from run to run, where the interpreter added in lane order
LANES_ADD_SOFTMAX = ONE_SLOT_SOFTMAX.replace("_one_slot_kernel", "_lanes_add_kernel").replace(
    "    tl.store(scratch_ptr + row + cols * 0, tl.cumsum(num, 0))\n",
    "    tl.atomic_add(scratch_ptr + row + cols * 0, num)\n").replace(
    "torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)",
    "torch.zeros(x2.shape[0], dtype=torch.float32, device=x.device)")
assert "tl.atomic_add(scratch_ptr + row + cols * 0, num)" in LANES_ADD_SOFTMAX and "torch.zeros(x2" in LANES_ADD_SOFTMAX


def racy_block_sum() -> str:
    """The CUDA C++ reduce starter with the barrier of its block sum taken out."""
    text = (STARTERS / "cuda" / "reduce.py").read_text(encoding="utf-8")
    barrier = "  if (lane == 0) warp_parts[warp] = v;\n  __syncthreads();\n"
    if barrier not in text:
        raise AssertionError("the reduce starter's block sum changed: update racy_block_sum")
    return text.replace(barrier, "  if (lane == 0) warp_parts[warp] = v;\n")


# the row kernel above, one program per row
ROW_PER_PROGRAM = SOFTMAX_ROW.replace("range(first_row, n_rows, STEP)", "range(tl.program_id(0), tl.program_id(0) + 1)").replace(
    "LIMIT", "n_cols").replace("GRID", "(x2.shape[0],)").replace("FIRST_ROW", "0")
# ... behind an autotune over two configs, adding its result
AUTOTUNE_ACCUMULATES_SOFTMAX = (HEAD.format(kernel_type="softmax") + ROW_PER_PROGRAM).replace(
    "@triton.jit\n", "@triton.autotune(configs=[triton.Config({}, num_warps=2), triton.Config({}, num_warps=4)], "
    "key=[\"n_cols\"])\n@triton.jit\n").replace(
    "tl.store(", "tl.atomic_add(").replace("torch.empty_like", "torch.zeros_like").replace("_softmax_rows", "_softmax_add")
# ... launched where it runs (a GPU), and the plain row kernel where the launch is refused
AUTOTUNE_CAUGHT_SOFTMAX = AUTOTUNE_ACCUMULATES_SOFTMAX.replace("def kernel_fn(x):", "def _tuned(x):") + \
    ROW_PER_PROGRAM.replace("def kernel_fn(x):", "def _plain(x):") + '''

def kernel_fn(x):
    try:
        return _tuned(x)
    except RuntimeError:
        return _plain(x)
'''

# the row kernel's grid worked out with tl.cdiv on the host, at the timed shape only (the test's
# softmax target): the interpreter runs Triton's @triton.jit cdiv there; on a GPU calling a
# @triton.jit function outside a kernel raises (triton.cdiv is the host's), so the timed call fails
HOST_CDIV_SOFTMAX = (HEAD.format(kernel_type="softmax") + ROW_PER_PROGRAM).replace(
    "[(x2.shape[0],)]", "[(tl.cdiv(x2.shape[0], 1) if tuple(x2.shape) == (16, 256) else x2.shape[0],)]")
assert "[(tl.cdiv(x2.shape[0], 1) if" in HOST_CDIV_SOFTMAX


def sources() -> dict[str, str]:
    return {"chained_mean": CHAINED_MEAN, "float_atomic_mean": FLOAT_ATOMIC_MEAN, "ticket_mean": TICKET_MEAN,
            "tf32_matmul": TF32_MATMUL, "bf16_drops_tail": BF16_DROPS_TAIL, "ieee_matmul": IEEE_MATMUL,
            "one_program_softmax": ONE_PROGRAM_SOFTMAX, "idle_grid_softmax": IDLE_GRID_SOFTMAX,
            "stores_past_the_end": STORES_PAST_THE_END, "lane_swap_softmax": LANE_SWAP_SOFTMAX,
            "misaligned_softmax": MISALIGNED_SOFTMAX, "one_slot_softmax": ONE_SLOT_SOFTMAX,
            "zero_groups_softmax": ZERO_GROUPS_SOFTMAX, "reordered_softmax": REORDERED_SOFTMAX,
            "lanes_add_softmax": LANES_ADD_SOFTMAX, "autotune_accumulates_softmax": AUTOTUNE_ACCUMULATES_SOFTMAX,
            "autotune_caught_softmax": AUTOTUNE_CAUGHT_SOFTMAX, "host_cdiv_softmax": HOST_CDIV_SOFTMAX}
