"""Sum over the last dim with fp32 accumulation: one program per row.

Memory traffic. Each element is read once and each row writes one value:
(M * N + M) * elem_size bytes for M rows of N, one FLOP per element, so purely memory-bound. A row
is swept once in BLOCK_N-wide chunks.

Numerics. Every lane keeps its own fp32 partial sum over the chunks (N / BLOCK_N additions each),
then one tree reduction combines the lanes: the error grows with log(N) rather than N, and fp16
rows whose sum exceeds fp16's range give inf only when the rounded fp32 sum does. The sum is
rounded to x.dtype once, in the kernel.
"""
import triton
import triton.language as tl

KERNEL_TYPE = "reduce"
BACKEND = "triton"

TUNABLES = {"BLOCK_N": [256, 512, 1024, 2048, 4096, 8192], "num_warps": [1, 2, 4, 8, 16], "num_stages": [1, 2, 3]}
# every lane busy, and at most 64 fp32 values of a block per thread (more spills registers)
CONSTRAINTS = ["BLOCK_N >= 32 * num_warps", "BLOCK_N <= 64 * 32 * num_warps"]
CONFIG = {"BLOCK_N": 4096, "num_warps": 8, "num_stages": 2}


@triton.jit
def _row_sum_kernel(y_ptr, x_ptr, n_cols, x_row_stride, x_col_stride, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * x_row_stride
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + cols < n_cols
        acc += tl.load(x_row + (start + cols) * x_col_stride, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row, tl.sum(acc, axis=0).to(y_ptr.dtype.element_ty))


def kernel_fn(x):
    n_cols = x.shape[-1]
    y = x.new_empty(x.shape[:-1])
    if y.numel() == 0:
        return y
    if n_cols == 0:
        return y.zero_()  # an empty sum is 0; no kernel needed for it
    x2 = x.reshape(-1, n_cols)  # all leading dims are rows; a view whenever the layout allows
    block_n = min(CONFIG["BLOCK_N"], triton.next_power_of_2(n_cols))
    _row_sum_kernel[(x2.shape[0],)](
        y, x2, n_cols, x2.stride(0), x2.stride(1), BLOCK_N=block_n,
        num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return y
