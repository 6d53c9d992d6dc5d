"""A chain: rotate-half rotary embedding on q [B, HQ, S, D] and k [B, HK, S, D] in one launch;
out [B, HQ + HK, S, D], q's heads first. cos and sin [S, D] are shared.

rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]), so with x = (x1, x2) split at D/2:
    y1 = x1 * cos1 - x2 * sin1,    y2 = x2 * cos2 + x1 * sin2.
Each program takes BLOCK_S positions of one (batch, head) pair, a head of q or of k, and loads both
halves once. One launch for both tensors, where two rotary calls would pay two launches and the
model's eager form writes and reads four intermediates per tensor (x * cos, -x2, the cat, the
product with sin).

Memory traffic. q and k read once, the output written once: 2 * B * (HQ + HK) * S * D *
elem_size bytes, plus the tables (re-read by every head, from L2); 3 FLOPs per element.

Numerics. Products and sums in fp32; the output rounded once, in the kernel.

Backward. y is linear in x: dx1 = g1 * cos1 + g2 * sin2, dx2 = g2 * cos2 - g1 * sin1, for q's
heads of grad_out into dq and k's into dk: the forward's kernel with the transposed rotation,
reading grad_out through its strides. Nothing is saved or recomputed.
"""
import triton
import triton.language as tl

KERNEL_TYPE = "rotary_qk"
BACKEND = "triton"

TUNABLES = {"BLOCK_S": [1, 2, 4, 8, 16, 32, 64, 128], "num_warps": [1, 2, 4, 8], "num_stages": [1, 2, 3],
            "BWD_BLOCK_S": [1, 2, 4, 8, 16, 32, 64, 128], "BWD_num_warps": [1, 2, 4, 8]}
# at least one position per warp, and at most 64 values of a half per thread at D = 128
CONSTRAINTS = ["BLOCK_S >= num_warps", "BLOCK_S <= 32 * num_warps",
               "BWD_BLOCK_S >= BWD_num_warps", "BWD_BLOCK_S <= 32 * BWD_num_warps"]
CONFIG = {"BLOCK_S": 32, "num_warps": 4, "num_stages": 2, "BWD_BLOCK_S": 32, "BWD_num_warps": 4}


@triton.jit
def _rotary_qk_kernel(a_ptr, b_ptr, oa_ptr, ob_ptr, heads_a, heads_b, seq_len, half,
                      sa_b, sa_h, sa_s, sa_d, sb_b, sb_h, sb_s, sb_d, soa_b, soa_h, sob_b, sob_h,
                      scos_s, scos_d, ssin_s, ssin_d, cos_ptr, sin_ptr,
                      BLOCK_S: tl.constexpr, BLOCK_HALF: tl.constexpr, BACKWARD: tl.constexpr):
    """Heads 0..heads_a-1 of each batch are a's (written to oa), the rest b's (written to ob); with
    BACKWARD, a and b are grad_out's two parts and the rotation is transposed."""
    pid_s = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    batch = bh // (heads_a + heads_b)
    head = bh % (heads_a + heads_b)
    pos = pid_s * BLOCK_S + tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_HALF)
    mask = (pos < seq_len)[:, None] & (dims < half)[None, :]
    inner = pos[:, None] * (2 * half) + dims[None, :]  # an output head's [S, D] is dense
    if head < heads_a:
        x_first = a_ptr + batch * sa_b + head * sa_h + pos[:, None] * sa_s + dims[None, :] * sa_d
        x1 = tl.load(x_first, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_first + half * sa_d, mask=mask, other=0.0).to(tl.float32)
        y_first = oa_ptr + batch * soa_b + head * soa_h + inner
    else:
        x_first = b_ptr + batch * sb_b + (head - heads_a) * sb_h + pos[:, None] * sb_s + dims[None, :] * sb_d
        x1 = tl.load(x_first, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_first + half * sb_d, mask=mask, other=0.0).to(tl.float32)
        y_first = ob_ptr + batch * sob_b + (head - heads_a) * sob_h + inner
    cos_first = cos_ptr + pos[:, None] * scos_s + dims[None, :] * scos_d
    cos1 = tl.load(cos_first, mask=mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_first + half * scos_d, mask=mask, other=0.0).to(tl.float32)
    sin_first = sin_ptr + pos[:, None] * ssin_s + dims[None, :] * ssin_d
    sin1 = tl.load(sin_first, mask=mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_first + half * ssin_d, mask=mask, other=0.0).to(tl.float32)
    out_ty = oa_ptr.dtype.element_ty
    if BACKWARD:
        tl.store(y_first, (x1 * cos1 + x2 * sin2).to(out_ty), mask=mask)
        tl.store(y_first + half, (x2 * cos2 - x1 * sin1).to(out_ty), mask=mask)
    else:
        tl.store(y_first, (x1 * cos1 - x2 * sin1).to(out_ty), mask=mask)
        tl.store(y_first + half, (x2 * cos2 + x1 * sin2).to(out_ty), mask=mask)


def _launch(a, b, oa, ob, cos, sin, backward: bool):
    batch, heads_a, seq_len, head_dim = a.shape
    heads_b = b.shape[1]
    if head_dim % 2:
        raise ValueError(f"rotary embedding needs an even head dim, got {head_dim}")
    if batch * (heads_a + heads_b) * seq_len * head_dim == 0:
        return
    cos2, sin2 = cos.reshape(seq_len, head_dim), sin.reshape(seq_len, head_dim)  # [S, D] or [1, 1, S, D]
    half = head_dim // 2
    prefix = "BWD_" if backward else ""
    block_s = min(CONFIG[prefix + "BLOCK_S"], triton.next_power_of_2(seq_len))
    grid = (triton.cdiv(seq_len, block_s), batch * (heads_a + heads_b))
    _rotary_qk_kernel[grid](
        a, b, oa, ob, heads_a, heads_b, seq_len, half, *a.stride(), *b.stride(), oa.stride(0), oa.stride(1),
        ob.stride(0), ob.stride(1), *cos2.stride(), *sin2.stride(), cos2, sin2,
        BLOCK_S=block_s, BLOCK_HALF=triton.next_power_of_2(half), BACKWARD=backward,
        num_warps=CONFIG[prefix + "num_warps"], num_stages=CONFIG["num_stages"])


def kernel_fn(q, k, cos, sin):
    heads_q = q.shape[1]
    out = q.new_empty((q.shape[0], heads_q + k.shape[1], *q.shape[2:]))
    # k's heads are out[:, HQ:]: the same strides, HQ heads further on
    _launch(q, k, out, out[:, heads_q:], cos, sin, backward=False)
    return out


def backward_fn(grad_out, out, q, k, cos, sin):
    heads_q = q.shape[1]
    dq, dk = q.new_empty(q.shape), k.new_empty(k.shape)
    _launch(grad_out[:, :heads_q], grad_out[:, heads_q:], dq, dk, cos, sin, backward=True)
    return dq, dk
