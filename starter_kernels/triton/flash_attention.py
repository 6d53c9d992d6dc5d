"""Attention softmax(q k^T * sm_scale) v on [B, H, S, D], flash style: the S x S scores never
leave the chip.

FLOPs and traffic. Two matrix products of 2 * S * S * D FLOPs per (batch, head): 4 * B * H * S^2 * D
in all (half that when causal), against a minimum of 4 * B * H * S * D * elem_size bytes (read q,
k, v, write o). At S = 2048, D = 128 that is 1 k FLOPs per byte in fp16: compute-bound. Each program
holds one BLOCK_M x D tile of q and streams k and v through in BLOCK_N-row tiles (pipelined
num_stages deep), keeping a running row maximum m, a running denominator l and an unnormalised
output tile (the online softmax): when a new tile raises the maximum, the old l and accumulator
are rescaled by exp(m_old - m_new). Causal programs stop at the diagonal, skipping the masked half.

Numerics. Scores, softmax statistics and the accumulator are fp32. fp32 inputs multiply in IEEE
fp32 (input_precision="ieee": no silent TF32); fp16 inputs use the tensor cores, with the
probabilities rounded to fp16 for the second product as every fp16 flash kernel does. Head dims
that are not powers of two are padded to BLOCK_D and masked. The output is rounded once.
"""
import math

import triton
import triton.language as tl

KERNEL_TYPE = "flash_attention"
BACKEND = "triton"

TUNABLES = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4]}
# At most 64 fp32 scores per thread: BLOCK_M x BLOCK_N scores live in registers next to the
# BLOCK_M x D accumulator. Shared memory holds the q tile and num_stages k and v tiles; at D = 128
# in fp16 that must stay within 224 KiB (fp32 needs twice as much: a config over the limit fails
# to launch on the GPU, it never computes a wrong answer).
CONSTRAINTS = ["BLOCK_M * BLOCK_N <= 64 * 32 * num_warps", "(BLOCK_M + 2 * num_stages * BLOCK_N) * 128 * 2 <= 229376"]
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2}

LOG2_E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); exp2 is the hardware instruction
MIN_DOT_K = 16  # tl.dot needs a reduction dim of at least 16


@triton.jit
def _attention_kernel(o_ptr, q_ptr, k_ptr, v_ptr, qk_scale, n_heads, seq_q, seq_k, head_dim,
                      sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
                      CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_D: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    b = bh // n_heads
    h = bh % n_heads
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim

    q_ptrs = q_ptr + b * sq_b + h * sq_h + offs_m[:, None] * sq_s + offs_d[None, :] * sq_d
    q = tl.load(q_ptrs, mask=(offs_m < seq_q)[:, None] & d_ok[None, :], other=0.0)
    k_base = k_ptr + b * sk_b + h * sk_h
    v_base = v_ptr + b * sv_b + h * sv_h

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # key 0 is visible to every query row, so the first tile makes every row maximum finite and
    # no exp2(-inf - (-inf)) = NaN can arise
    end_n = tl.minimum(seq_k, start_m + BLOCK_M) if CAUSAL else seq_k
    for start_n in range(0, end_n, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < seq_k
        k_t = tl.load(k_base + cols[None, :] * sk_s + offs_d[:, None] * sk_d,
                      mask=col_ok[None, :] & d_ok[:, None], other=0.0)
        scores = tl.dot(q, k_t, input_precision="ieee") * qk_scale
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (offs_m[:, None] >= cols[None, :])
        scores = tl.where(visible, scores, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * sv_s + offs_d[None, :] * sv_d,
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        m_i = m_new

    out = acc / l_i[:, None]
    o_ptrs = o_ptr + bh * seq_q * head_dim + offs_m[:, None] * head_dim + offs_d[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=(offs_m < seq_q)[:, None] & d_ok[None, :])


def kernel_fn(q, k, v, causal=False, sm_scale=None):
    batch, n_heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    o = q.new_empty(q.shape)
    if o.numel() == 0:
        return o
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    block_m = min(CONFIG["BLOCK_M"], max(MIN_DOT_K, triton.next_power_of_2(seq_q)))
    block_n = min(CONFIG["BLOCK_N"], max(MIN_DOT_K, triton.next_power_of_2(seq_k)))
    grid = (triton.cdiv(seq_q, block_m), batch * n_heads)
    _attention_kernel[grid](
        o, q, k, v, scale * LOG2_E, n_heads, seq_q, seq_k, head_dim,
        *q.stride(), *k.stride(), *v.stride(),
        CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_D=max(MIN_DOT_K, triton.next_power_of_2(head_dim)),
        num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return o
