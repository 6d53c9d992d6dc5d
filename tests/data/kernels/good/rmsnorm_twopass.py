"""A correct RMSNorm written differently from the starter: the sum of squares accumulated over
column chunks in fp32, then a second pass that scales and writes; rows of any length."""
import torch
import triton
import triton.language as tl

KERNEL_TYPE = "rmsnorm"
BACKEND = "triton"


@triton.jit
def _rms_rows(x_ptr, w_ptr, y_ptr, n_cols, x_stride, y_stride, eps, CHUNK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([CHUNK], tl.float32)
    for start in range(0, n_cols, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        x = tl.load(x_ptr + row * x_stride + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        acc += x * x
    inv_rms = 1.0 / tl.sqrt(tl.sum(acc, 0) / n_cols + eps)
    for start in range(0, n_cols, CHUNK):
        cols = start + tl.arange(0, CHUNK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * y_stride + cols, (x * inv_rms * w).to(y_ptr.dtype.element_ty), mask=mask)


def kernel_fn(x, weight, eps=1e-6):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    w = weight.contiguous()
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    chunk = min(2048, triton.next_power_of_2(shape[-1]))
    _rms_rows[(x2.shape[0],)](x2, w, y, shape[-1], x2.stride(0), y.stride(0), eps, CHUNK=chunk)
    return y.view(shape)
