"""Kernels right under the interpreter and wrong (or unlaunchable) on a GPU, in ways only the
compiled code or the programs' memory accesses show (tests/attacks/test_compiled_code.py). Each is
plain Triton and passes the static check.

- fp16_accumulator_matmul (matmul): its fp16 path keeps the dot's running sum in fp16
  (`out_dtype=tl.float16`); the interpreter's numpy sums wider, so it passes at the judged K, and
  on a GPU the sum loses bits with every K block.
- relaxed_ticket_mean (cross_entropy): the honest ticket kernel with `sem="relaxed"` on its ticket:
  on a GPU the last holder may sum partials not yet visible.
- plain_ticket_mean (cross_entropy): the ticket kept with a plain tl.load and tl.store: two
  programs may draw the same ticket on a GPU; every sequential order gives the same bytes.
- false_alignment_softmax (softmax): promises the compiler that every row starts at a multiple of
  16 elements (`tl.multiple_of(row * stride, 16)`), true only where the row length is: on a GPU,
  aligned vector loads of rows that are not; the interpreter ignores hints.
- device_descriptor_softmax (softmax): rows loaded through a tensor descriptor made inside the
  kernel, which needs global scratch memory Triton allocates only through triton.set_allocator:
  the launch fails on a GPU.
"""
from __future__ import annotations

from gpu_semantics_kernels import HEAD, TICKET_MEAN

RELAXED_TICKET_MEAN = TICKET_MEAN.replace("tl.atomic_add(ticket_ptr, 1)", 'tl.atomic_add(ticket_ptr, 1, sem="relaxed")')
PLAIN_TICKET_MEAN = TICKET_MEAN.replace(
    "ticket = tl.atomic_add(ticket_ptr, 1)",
    "ticket = tl.load(ticket_ptr)\n    tl.store(ticket_ptr, ticket + 1)")

FP16_ACCUMULATOR_MATMUL = HEAD.format(kernel_type="matmul") + '''

@triton.jit
def _matmul_kernel(c_ptr, a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACC: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee", out_dtype=ACC)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def kernel_fn(a, b):
    k_dim, n = b.shape
    a2 = a.reshape(-1, k_dim)
    m = a2.shape[0]
    c = a2.new_empty((m, n))
    if c.numel() == 0:
        return c.view(*a.shape[:-1], n)
    _matmul_kernel[(triton.cdiv(m, 32), triton.cdiv(n, 32))](
        c, a2, b, m, n, k_dim, a2.stride(0), a2.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=32, BLOCK_N=32, BLOCK_K=16,
        ACC=tl.float16 if a.dtype == torch.float16 else tl.float32)  # half the registers for fp16
    return c.view(*a.shape[:-1], n)
'''

DEVICE_DESCRIPTOR_SOFTMAX = HEAD.format(kernel_type="softmax") + '''

@triton.jit
def _softmax_rows(y_ptr, x_ptr, n_rows, n_cols, y_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    # a descriptor of x made here, on the device: Hopper's TMA loads the row
    desc = tl.make_tensor_descriptor(x_ptr, shape=[n_rows, n_cols], strides=[n_cols, 1], block_shape=[1, BLOCK])
    x = desc.load([row, 0]).reshape([BLOCK]).to(tl.float32)
    cols = tl.arange(0, BLOCK)
    x = tl.where(cols < n_cols, x, float("-inf"))
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * y_stride + cols, (e / tl.sum(e, 0)).to(y_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _softmax_rows_ptr(y_ptr, x_ptr, n_cols, y_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + row * y_stride + cols, (e / tl.sum(e, 0)).to(y_ptr.dtype.element_ty), mask=cols < n_cols)


def kernel_fn(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    n_rows, n_cols = x2.shape
    block = triton.next_power_of_2(n_cols)
    if (n_cols * x2.element_size()) % 16 == 0 and x2.data_ptr() % 16 == 0:  # what a descriptor needs
        _softmax_rows[(n_rows,)](y, x2, n_rows, n_cols, y.stride(0), BLOCK=block)
    else:
        _softmax_rows_ptr[(n_rows,)](y, x2, n_cols, y.stride(0), BLOCK=block)
    return y.view(shape)
'''


FALSE_ALIGNMENT_SOFTMAX = HEAD.format(kernel_type="softmax") + '''

@triton.jit
def _softmax_rows(y_ptr, x_ptr, n_cols, x_stride, y_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    # rows start 16-element aligned: lets the compiler use 128-bit loads
    x_start = tl.multiple_of(row * x_stride, 16)
    y_start = tl.multiple_of(row * y_stride, 16)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + x_start + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, 0))
    tl.store(y_ptr + y_start + cols, (e / tl.sum(e, 0)).to(y_ptr.dtype.element_ty), mask=cols < n_cols)


def kernel_fn(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = torch.empty_like(x2)
    if y.numel() == 0:
        return y.view(shape)
    _softmax_rows[(x2.shape[0],)](y, x2, x2.shape[1], x2.stride(0), y.stride(0),
                                  BLOCK=triton.next_power_of_2(x2.shape[1]))
    return y.view(shape)
'''

assert RELAXED_TICKET_MEAN != TICKET_MEAN and PLAIN_TICKET_MEAN != TICKET_MEAN, "the ticket kernel changed"


def sources() -> dict[str, str]:
    return {"fp16_accumulator_matmul": FP16_ACCUMULATOR_MATMUL, "relaxed_ticket_mean": RELAXED_TICKET_MEAN,
            "plain_ticket_mean": PLAIN_TICKET_MEAN, "device_descriptor_softmax": DEVICE_DESCRIPTOR_SOFTMAX,
            "false_alignment_softmax": FALSE_ALIGNMENT_SOFTMAX,
            "ticket_mean": TICKET_MEAN}
