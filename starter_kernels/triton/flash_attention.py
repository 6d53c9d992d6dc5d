"""Attention softmax(q k^T * sm_scale) v on [B, H, S, D], flash style: the S x S scores never
leave the chip.

FLOPs and traffic. Two matrix products of 2 * S_q * S_k * D FLOPs per (batch, head): 4 * B * H *
S^2 * D in all (half that when causal), against a minimum of 4 * B * H * S * D * elem_size bytes
(read q, k, v, write o). At S = 2048, D = 128 that is 1 k FLOPs per byte in fp16: compute-bound.

Schedule (the layout of Triton's fused-attention tutorial). Each program holds one BLOCK_M x D
tile of q in registers and streams k and v through in BLOCK_N-row tiles, pipelined num_stages deep,
keeping a running row maximum m, a running denominator l and an unnormalised output tile (the
online softmax): when a tile raises the maximum, l and the accumulator are rescaled by
2^(m_old - m_new). The key range is walked in two stages:
- the blocks every row of the tile sees whole, without any mask: all full key blocks when not
  causal; when causal, the blocks left of the diagonal (keys before the tile's first query);
- then the blocks that need a mask: the diagonal blocks when causal (key j visible to query i when
  j <= i, the top-left alignment of SDPA's is_causal), and the key tail past the last full block
  (any sequence length works). Causal programs never visit the blocks right of the diagonal.
Query and key lengths may differ. Head dims 64 and 128 (any power of two from 16) load without a
mask; other head dims are padded to the next power of two and masked.

Numerics. Scores, softmax statistics and the accumulator are fp32; the scores are scaled by
sm_scale * log2(e) once, so the exponentials are exp2, the hardware instruction. fp32 inputs
multiply in IEEE fp32 (input_precision="ieee": no silent TF32); fp16 and bf16 inputs use the tensor
cores, with the probabilities rounded to the input dtype for the second product as every 16-bit
flash kernel does. The output is divided by l and rounded once.

Backward (the flash-attention-2 form, recomputing rather than saving). The forward saves nothing
but its inputs and o. With P = softmax(q k^T * sm_scale) row by row and upstream dO:
    dV = P^T dO,  dP = dO V^T,  dS = P * (dP - delta),  delta = rowsum(dO * O),
    dQ = dS K * sm_scale,  dK = dS^T Q * sm_scale.
Kernel B1, one program per query block: recomputes each query row's logsumexp (one fp32 value per
row, in exp2 units) from q and k with the online max and sum of the forward, and delta from o and dO;
both into fp32 [B * H, S_q] buffers (8 bytes per query row). Kernel B2, one program per key block:
holds its k and v tiles and the dK, dV accumulators, walks the query blocks that can see it
(causal: from the diagonal on), recomputes P = exp2(q k^T * scale - lse) tile by tile and
accumulates; no atomics. Kernel B3, one program per query block: walks the key blocks it sees and
accumulates dQ. The scores are computed three times (B1, B2, B3): 8 products of 2 * S_q * S_k * D
FLOPs per (batch, head) against the forward's 2 (half of each when causal), slower than one pass
accumulating dQ with atomics, and deterministic. Every key and query block
is loaded with masks (the sequence tails, the padded head dim, the causal diagonal): simpler and
slower than the forward's split into whole and masked blocks. fp16 and bf16 operands are rounded
to the input dtype before each product (P and dS), as in the forward.
"""
import math

import torch
import triton
import triton.language as tl

KERNEL_TYPE = "flash_attention"
BACKEND = "triton"

TUNABLES = {"BLOCK_M": [16, 32, 64, 128], "BLOCK_N": [16, 32, 64, 128], "num_warps": [2, 4, 8], "num_stages": [1, 2, 3, 4],
            "BWD_BLOCK_M": [16, 32, 64, 128], "BWD_BLOCK_N": [16, 32, 64, 128], "BWD_num_warps": [2, 4, 8], "BWD_num_stages": [1, 2, 3]}
# At most 64 fp32 scores per thread, and at D = 128 the accumulator (BLOCK_M x 128 fp32), the q
# tile (BLOCK_M x 128, two per register), the scores and the probabilities within about 240
# registers per thread (past that ptxas spills). Key blocks no wider than query blocks, so the causal diagonal starts on
# a key-block boundary. Shared memory holds the k and v tiles of the pipeline; at D = 128 in 16-bit
# dtypes that stays within sm_80's 163 KiB.
# The backward's B2 holds two BWD_BLOCK_N x 128 fp32 accumulators (dK, dV), its k and v tiles, and
# per step a P and a dS tile of BWD_BLOCK_M x BWD_BLOCK_N.
CONSTRAINTS = ["BLOCK_M * BLOCK_N <= 64 * 32 * num_warps", "BLOCK_M * (192 + 3 * BLOCK_N // 2) <= 240 * 32 * num_warps", "BLOCK_N <= BLOCK_M", "(BLOCK_M + 2 * num_stages * BLOCK_N) * 128 * 2 <= 160 * 1024",
               "BWD_BLOCK_M * BWD_BLOCK_N <= 32 * 32 * BWD_num_warps", "BWD_BLOCK_N * (2 * 128 + 128) + 2 * BWD_BLOCK_M * BWD_BLOCK_N <= 240 * 32 * BWD_num_warps", "BWD_num_stages * 2 * BWD_BLOCK_M * 128 * 2 <= 160 * 1024"]
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3,
          "BWD_BLOCK_M": 64, "BWD_BLOCK_N": 64, "BWD_num_warps": 8, "BWD_num_stages": 1}

LOG2_E = 1.4426950408889634  # exp(x) = exp2(x * log2(e)); exp2 is the hardware instruction
MIN_DOT_K = 16  # tl.dot needs a reduction dim of at least 16


@triton.jit
def _attend(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, lo, hi, seq_k, head_dim,
            qk_scale, sk_s, sk_d, sv_s, sv_d, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
            PAD_D: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold key blocks [lo, hi) into the online softmax. MASKED blocks hide keys past seq_k and,
    when CAUSAL, keys after the query; unmasked blocks are whole and visible to every row."""
    d_ok = offs_d < head_dim
    for start_n in tl.range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k_ptrs = k_base + cols[:, None] * sk_s + offs_d[None, :] * sk_d
        v_ptrs = v_base + cols[:, None] * sv_s + offs_d[None, :] * sv_d
        if MASKED:
            kv_ok = (cols < seq_k)[:, None] & d_ok[None, :]
            k = tl.load(k_ptrs, mask=kv_ok, other=0.0)
            v = tl.load(v_ptrs, mask=kv_ok, other=0.0)
        elif PAD_D:
            k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        if MASKED:
            visible = (cols < seq_k)[None, :]
            if CAUSAL:
                visible = visible & (offs_m[:, None] >= cols[None, :])
            scores = tl.where(visible, scores, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        p = tl.exp2(scores - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attention_kernel(o_ptr, q_ptr, k_ptr, v_ptr, qk_scale, n_heads, seq_q, seq_k, head_dim,
                      sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, sv_b, sv_h, sv_s, sv_d,
                      so_b, so_h, so_s, so_d, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PAD_D: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    b = bh // n_heads
    h = bh % n_heads
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ok = (offs_m < seq_q)[:, None] & (offs_d < head_dim)[None, :]
    q = tl.load(q_ptr + b * sq_b + h * sq_h + offs_m[:, None] * sq_s + offs_d[None, :] * sq_d,
                mask=q_ok, other=0.0)
    k_base = k_ptr + b * sk_b + h * sk_h
    v_base = v_ptr + b * sv_b + h * sv_h

    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # Whole blocks first: all of them, or when causal those left of the diagonal (start_m is a
    # multiple of BLOCK_N, as BLOCK_N divides BLOCK_M). Then the masked ones: the diagonal and the
    # key tail. Each row's first block holds key 0, visible to it, so every running maximum is
    # finite after it and no exp2(-inf - (-inf)) = NaN arises.
    full_end = (seq_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        full_end = tl.minimum(full_end, start_m)
        end = tl.minimum(seq_k, start_m + BLOCK_M)
    else:
        end = seq_k
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, 0, full_end,
                            seq_k, head_dim, qk_scale, sk_s, sk_d, sv_s, sv_d, False, CAUSAL, PAD_D,
                            BLOCK_N)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_base, v_base, offs_m, offs_n, offs_d, full_end, end,
                            seq_k, head_dim, qk_scale, sk_s, sk_d, sv_s, sv_d, True, CAUSAL, PAD_D,
                            BLOCK_N)
    out = acc / l_i[:, None]
    o_ptrs = o_ptr + b * so_b + h * so_h + offs_m[:, None] * so_s + offs_d[None, :] * so_d
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=q_ok)


def kernel_fn(q, k, v, causal=False, sm_scale=None):
    batch, n_heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    o = q.new_empty(q.shape)
    if o.numel() == 0:
        return o
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    block_m = min(CONFIG["BLOCK_M"], max(MIN_DOT_K, triton.next_power_of_2(seq_q)))
    # never wider than the query block: the causal diagonal must start on a key-block boundary
    block_n = min(CONFIG["BLOCK_N"], block_m, max(MIN_DOT_K, triton.next_power_of_2(seq_k)))
    block_d = max(MIN_DOT_K, triton.next_power_of_2(head_dim))
    grid = (triton.cdiv(seq_q, block_m), batch * n_heads)
    _attention_kernel[grid](
        o, q, k, v, scale * LOG2_E, n_heads, seq_q, seq_k, head_dim,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
        PAD_D=block_d != head_dim, num_warps=CONFIG["num_warps"], num_stages=CONFIG["num_stages"])
    return o


@triton.jit
def _probabilities(q, k, lse, offs_m, cols, seq_q, seq_k, qk_scale, CAUSAL: tl.constexpr):
    """P = exp2(q k^T * scale - lse) for a BLOCK_M x BLOCK_N tile, 0 where the key is not visible or
    the query is past the end."""
    scores = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
    visible = (offs_m < seq_q)[:, None] & (cols < seq_k)[None, :]
    if CAUSAL:
        visible = visible & (offs_m[:, None] >= cols[None, :])
    return tl.exp2(tl.where(visible, scores - lse[:, None], -float("inf")))


@triton.jit
def _bwd_stats_kernel(lse_ptr, delta_ptr, q_ptr, k_ptr, o_ptr, do_ptr, qk_scale, n_heads, seq_q, seq_k,
                      head_dim, sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d, so_b, so_h, so_s, so_d,
                      sdo_b, sdo_h, sdo_s, sdo_d, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    b = bh // n_heads
    h = bh % n_heads
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q_ok = (offs_m < seq_q)[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + b * sq_b + h * sq_h + offs_m[:, None] * sq_s + offs_d[None, :] * sq_d, mask=q_ok, other=0.0)
    m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    end = tl.minimum(seq_k, start_m + BLOCK_M) if CAUSAL else seq_k
    for start_n in tl.range(0, end, BLOCK_N):
        cols = start_n + offs_n
        k = tl.load(k_ptr + b * sk_b + h * sk_h + cols[:, None] * sk_s + offs_d[None, :] * sk_d,
                    mask=(cols < seq_k)[:, None] & d_ok[None, :], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        visible = (cols < seq_k)[None, :]
        if CAUSAL:
            visible = visible & (offs_m[:, None] >= cols[None, :])
        scores = tl.where(visible, scores, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(scores - m_new[:, None]), axis=1)
        m_i = m_new
    o = tl.load(o_ptr + b * so_b + h * so_h + offs_m[:, None] * so_s + offs_d[None, :] * so_d, mask=q_ok, other=0.0)
    do = tl.load(do_ptr + b * sdo_b + h * sdo_h + offs_m[:, None] * sdo_s + offs_d[None, :] * sdo_d,
                 mask=q_ok, other=0.0)
    row_ok = offs_m < seq_q
    tl.store(lse_ptr + bh * seq_q + offs_m, m_i + tl.log2(l_i), mask=row_ok)
    tl.store(delta_ptr + bh * seq_q + offs_m, tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1), mask=row_ok)


@triton.jit
def _bwd_dkdv_kernel(dk_ptr, dv_ptr, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, qk_scale, sm_scale,
                     n_heads, seq_q, seq_k, head_dim, sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d,
                     sv_b, sv_h, sv_s, sv_d, sdo_b, sdo_h, sdo_s, sdo_d, CAUSAL: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    bh = tl.program_id(1).to(tl.int64)
    b = bh // n_heads
    h = bh % n_heads
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_ok = (cols < seq_k)[:, None] & (offs_d < head_dim)[None, :]
    k = tl.load(k_ptr + b * sk_b + h * sk_h + cols[:, None] * sk_s + offs_d[None, :] * sk_d, mask=kv_ok, other=0.0)
    v = tl.load(v_ptr + b * sv_b + h * sv_h + cols[:, None] * sv_s + offs_d[None, :] * sv_d, mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # causal: query i sees key j only when j <= i, so the query blocks before this key block see none
    lo = (start_n // BLOCK_M) * BLOCK_M if CAUSAL else 0
    for start_m in tl.range(lo, seq_q, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q_ok = (offs_m < seq_q)[:, None] & (offs_d < head_dim)[None, :]
        q = tl.load(q_ptr + b * sq_b + h * sq_h + offs_m[:, None] * sq_s + offs_d[None, :] * sq_d, mask=q_ok, other=0.0)
        do = tl.load(do_ptr + b * sdo_b + h * sdo_h + offs_m[:, None] * sdo_s + offs_d[None, :] * sdo_d,
                     mask=q_ok, other=0.0)
        lse = tl.load(lse_ptr + bh * seq_q + offs_m, mask=offs_m < seq_q, other=0.0)
        delta = tl.load(delta_ptr + bh * seq_q + offs_m, mask=offs_m < seq_q, other=0.0)
        p = _probabilities(q, k, lse, offs_m, cols, seq_q, seq_k, qk_scale, CAUSAL)
        dv = tl.dot(tl.trans(p.to(do.dtype)), do, dv, input_precision="ieee")
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        dk = tl.dot(tl.trans(ds.to(q.dtype)), q, dk, input_precision="ieee")
    out = bh * seq_k * head_dim + cols[:, None] * head_dim + offs_d[None, :]
    tl.store(dk_ptr + out, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=kv_ok)
    tl.store(dv_ptr + out, dv.to(dv_ptr.dtype.element_ty), mask=kv_ok)


@triton.jit
def _bwd_dq_kernel(dq_ptr, q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, qk_scale, sm_scale,
                   n_heads, seq_q, seq_k, head_dim, sq_b, sq_h, sq_s, sq_d, sk_b, sk_h, sk_s, sk_d,
                   sv_b, sv_h, sv_s, sv_d, sdo_b, sdo_h, sdo_s, sdo_d, CAUSAL: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    b = bh // n_heads
    h = bh % n_heads
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q_ok = (offs_m < seq_q)[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + b * sq_b + h * sq_h + offs_m[:, None] * sq_s + offs_d[None, :] * sq_d, mask=q_ok, other=0.0)
    do = tl.load(do_ptr + b * sdo_b + h * sdo_h + offs_m[:, None] * sdo_s + offs_d[None, :] * sdo_d,
                 mask=q_ok, other=0.0)
    lse = tl.load(lse_ptr + bh * seq_q + offs_m, mask=offs_m < seq_q, other=0.0)
    delta = tl.load(delta_ptr + bh * seq_q + offs_m, mask=offs_m < seq_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    end = tl.minimum(seq_k, start_m + BLOCK_M) if CAUSAL else seq_k
    for start_n in tl.range(0, end, BLOCK_N):
        cols = start_n + offs_n
        kv_ok = (cols < seq_k)[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + b * sk_b + h * sk_h + cols[:, None] * sk_s + offs_d[None, :] * sk_d, mask=kv_ok, other=0.0)
        v = tl.load(v_ptr + b * sv_b + h * sv_h + cols[:, None] * sv_s + offs_d[None, :] * sv_d, mask=kv_ok, other=0.0)
        p = _probabilities(q, k, lse, offs_m, cols, seq_q, seq_k, qk_scale, CAUSAL)
        ds = p * (tl.dot(do, tl.trans(v), input_precision="ieee") - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision="ieee")
    out = bh * seq_q * head_dim + offs_m[:, None] * head_dim + offs_d[None, :]
    tl.store(dq_ptr + out, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=q_ok)


def backward_fn(grad_out, out, q, k, v, causal=False, sm_scale=None):
    batch, n_heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    if q.numel() == 0 or k.numel() == 0:
        return dq, dk, dv
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)
    lse = torch.empty((batch * n_heads, seq_q), dtype=torch.float32, device=q.device)
    delta = torch.empty((batch * n_heads, seq_q), dtype=torch.float32, device=q.device)
    block_m = min(CONFIG["BWD_BLOCK_M"], max(MIN_DOT_K, triton.next_power_of_2(seq_q)))
    block_n = min(CONFIG["BWD_BLOCK_N"], max(MIN_DOT_K, triton.next_power_of_2(seq_k)))
    block_d = max(MIN_DOT_K, triton.next_power_of_2(head_dim))
    strides = (*q.stride(), *k.stride(), *v.stride(), *grad_out.stride())
    meta = dict(CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                num_warps=CONFIG["BWD_num_warps"], num_stages=CONFIG["BWD_num_stages"])
    q_blocks = (triton.cdiv(seq_q, block_m), batch * n_heads)
    _bwd_stats_kernel[q_blocks](lse, delta, q, k, out, grad_out, scale * LOG2_E, n_heads, seq_q, seq_k,
                                head_dim, *q.stride(), *k.stride(), *out.stride(), *grad_out.stride(), **meta)
    args = (q, k, v, grad_out, lse, delta, scale * LOG2_E, scale, n_heads, seq_q, seq_k, head_dim, *strides)
    _bwd_dkdv_kernel[(triton.cdiv(seq_k, block_n), batch * n_heads)](dk, dv, *args, **meta)
    _bwd_dq_kernel[q_blocks](dq, *args, **meta)
    return dq, dk, dv
