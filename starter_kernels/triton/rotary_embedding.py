"""Rotary position embedding: y = x * cos + rotate_half(x) * sin on x [B, H, S, D], cos/sin [S, D].

rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]), so with x = (x1, x2) split at D/2:
    y1 = x1 * cos1 - x2 * sin1,    y2 = x2 * cos2 + x1 * sin2.
Each program takes BLOCK_S positions of one (batch, head) pair and loads both halves once.

Memory traffic. x is read once and y written once, 2 * B * H * S * D * elem_size bytes, plus the
cos/sin tables (2 * S * D * elem_size, re-read by every head but from L2); 3 FLOPs per element, so
memory-bound.

Numerics. Products and sums in fp32; the output is rounded once, in the kernel.

Backward. y is linear in x: dx = g * cos + rotate_half^T(g * sin), rotate_half^T(u) = (u2, -u1), so
    dx1 = g1 * cos1 + g2 * sin2,    dx2 = g2 * cos2 - g1 * sin1.
cos and sin are the model's constants and get no gradient; nothing is saved or recomputed. The
same schedule as the forward with grad_out in x's place: the same traffic and FLOPs.
"""
import triton
import triton.language as tl

KERNEL_TYPE = "rotary_embedding"
BACKEND = "triton"

TUNABLES = {"BLOCK_S": [1, 2, 4, 8, 16, 32, 64, 128], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2, 3],
            "BWD_BLOCK_S": [1, 2, 4, 8, 16, 32, 64, 128], "BWD_num_warps": [1, 2, 4, 8]}
# at least one position per warp, and at most 64 values of a half per thread at D = 128
CONSTRAINTS = ["BLOCK_S >= num_warps", "BLOCK_S <= 32 * num_warps",
               "BWD_BLOCK_S >= BWD_num_warps", "BWD_BLOCK_S <= 32 * BWD_num_warps"]
CONFIG = {"BLOCK_S": 32, "num_warps": 4, "num_stages": 2, "BWD_BLOCK_S": 32, "BWD_num_warps": 4}


@triton.jit
def _rotary_kernel(y_ptr, x_ptr, cos_ptr, sin_ptr, n_heads, seq_len, half,
                   sx_b, sx_h, sx_s, sx_d, scos_s, scos_d, ssin_s, ssin_d,
                   BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr = False):
    """The forward; with BACKWARD, x is grad_out and y is dx (the transposed rotation)."""
    pid_s = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // n_heads
    h = bh % n_heads
    pos = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_HALF)
    mask = (pos < seq_len)[:, None] & (dims < half)[None, :]

    x_first = x_ptr + b * sx_b + h * sx_h + pos[:, None] * sx_s + dims[None, :] * sx_d
    x1 = tl.load(x_first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_first + half * sx_d, mask=mask, other=0.0).to(tl.float32)
    cos_first = cos_ptr + pos[:, None] * scos_s + dims[None, :] * scos_d
    cos1 = tl.load(cos_first, mask=mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_first + half * scos_d, mask=mask, other=0.0).to(tl.float32)
    sin_first = sin_ptr + pos[:, None] * ssin_s + dims[None, :] * ssin_d
    sin1 = tl.load(sin_first, mask=mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_first + half * ssin_d, mask=mask, other=0.0).to(tl.float32)

    head_dim = 2 * half
    y_first = y_ptr + bh * seq_len * head_dim + pos[:, None] * head_dim + dims[None, :]
    out_ty = y_ptr.dtype.element_ty
    if BACKWARD:
        tl.store(y_first, (x1 * cos1 + x2 * sin2).to(out_ty), mask=mask)
        tl.store(y_first + half, (x2 * cos2 - x1 * sin1).to(out_ty), mask=mask)
    else:
        tl.store(y_first, (x1 * cos1 - x2 * sin1).to(out_ty), mask=mask)
        tl.store(y_first + half, (x2 * cos2 + x1 * sin2).to(out_ty), mask=mask)


def kernel_fn(x, cos, sin):
    return _rotate(x, cos, sin, backward=False)


def backward_fn(grad_out, out, x, cos, sin):
    return (_rotate(grad_out, cos, sin, backward=True),)


def _rotate(x, cos, sin, backward: bool):
    batch, n_heads, seq_len, head_dim = x.shape
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head dim, got {head_dim}")
    y = x.new_empty(x.shape)
    if y.numel() == 0:
        return y
    # tables given as [1, 1, S, D] or [S, D]: the same [S, D] view
    cos2 = cos.reshape(seq_len, head_dim)
    sin2 = sin.reshape(seq_len, head_dim)
    half = head_dim // 2
    prefix = "BWD_" if backward else ""
    block_s = min(CONFIG[prefix + "BLOCK_S"], triton.next_power_of_2(seq_len))
    grid = (triton.cdiv(seq_len, block_s), batch * n_heads)
    _rotary_kernel[grid](
        y, x, cos2, sin2, n_heads, seq_len, half, *x.stride(), *cos2.stride(), *sin2.stride(),
        BLOCK_S=block_s, BLOCK_HALF=triton.next_power_of_2(half), BACKWARD=backward,
        num_warps=CONFIG[prefix + "num_warps"], num_stages=CONFIG["num_stages"])
    return y
