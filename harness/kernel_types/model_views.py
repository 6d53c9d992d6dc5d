"""Inputs laid out as a model passes them: the inputs of a type's "model_views" edge case.

A model rarely hands a kernel a fresh dense tensor. Attention's q, k and v are slices of one fused
projection (q = qkv[..., :d], its rows a stride apart that is three times their width; taken per
head for a QK-norm, rows N apart within a position and 3 * H * N apart across them), k and v
during decoding the first positions of a KV cache, a linear layer's weight is passed transposed,
a vocabulary is padded to a multiple of 64 and the logits are its first V columns, rotary's cos
and sin are the first rows of tables built for the longest sequence. A kernel that stores one
element past a row writes, there, into the neighbouring tensor (the k beside q); so this case
builds exactly those layouts, with the rest of every wider buffer holding values of its own, and
the judge compares the whole buffer after the call (harness/correctness/guards.py). The values
are the type's own random ones; the layout is the point.
"""
from __future__ import annotations

import torch

from harness.kernel_types.kernel_type import Case

VARIANT = "model_views"
VOCAB_PAD = 64


def slice_of(t: torch.Tensor, width: int, gen: torch.Generator, at: int = 0) -> torch.Tensor:
    """`t` [rows, n] as columns at..at+n of a wider [rows, width] buffer, the rest of it random."""
    wide = torch.randn(t.shape[0], width, generator=gen).to(t.dtype)
    wide[:, at:at + t.shape[1]] = t
    return wide[:, at:at + t.shape[1]]


def projection_slice(t: torch.Tensor, which: int, gen: torch.Generator) -> torch.Tensor:
    """`t` [B, H, S, D] as slice `which` of a fused projection laid out [B, S, 3, H, D] (the other
    two slices random): q = proj[:, :, 0].transpose(1, 2), as attention modules take it."""
    b, h, s, d = t.shape
    proj = torch.randn(b, s, 3, h, d, generator=gen).to(t.dtype)
    proj[:, :, which] = t.transpose(1, 2)
    return proj[:, :, which].transpose(1, 2)


def per_head_slice(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`t` [..., H, N] as the first of three [H, N] blocks of each position of a fused projection
    [..., 3, H, N] (the other two random)."""
    *lead, h, n = t.shape
    proj = torch.randn(*lead, 3, h, n, generator=gen).to(t.dtype)
    proj[..., 0, :, :] = t
    return proj[..., 0, :, :]


def cache_slice(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`t` [B, H, S, D] as the first S positions of a KV cache twice as long (the rest random)."""
    b, h, s, d = t.shape
    cache = torch.randn(b, h, 2 * s + 3, d, generator=gen).to(t.dtype)
    cache[:, :, :s] = t
    return cache[:, :, :s]


def _rowwise(case: Case, args: list, gen: torch.Generator) -> list:
    x = args[0].reshape(-1, args[0].shape[-1])
    n = x.shape[1]
    if case.kernel_type == "cross_entropy":
        # the model's logits: the first V columns of a vocabulary padded to a multiple of 64; the
        # targets a column of a wider integer buffer (labels kept beside their positions), stride 2
        targets = args[1]
        pairs = torch.randint(0, n, (targets.shape[0], 2), generator=gen, dtype=targets.dtype)
        pairs[:, 0] = targets
        return [slice_of(x, n + VOCAB_PAD - n % VOCAB_PAD, gen), pairs[:, 0], *args[2:]]
    if args[0].dim() >= 3:
        # per head, as a QK-norm takes q: [..., H, N] of a projection laid out [..., 3, H, N], so
        # the rows of one position are N apart and the positions 3 * H * N: no one row stride
        return [per_head_slice(args[0], gen), *args[1:]]
    # the q slice of a fused qkv projection: a store past a row's end lands in k
    return [slice_of(x, 3 * n, gen).view(args[0].shape), *args[1:]]


def _matmul(case: Case, args: list, gen: torch.Generator) -> list:
    a, b = args
    # a: a slice of a wider activation; b: an nn.Linear weight [N, K], passed transposed
    return [slice_of(a, 2 * a.shape[1], gen), b.t().contiguous().t()]


def _mlp(case: Case, args: list, gen: torch.Generator) -> list:
    x, *weights = args
    return [slice_of(x, 2 * x.shape[1], gen, at=x.shape[1]), *weights]


def _attention(case: Case, args: list, gen: torch.Generator) -> list:
    q, k, v = args
    return [projection_slice(q, 0, gen), cache_slice(k, gen), cache_slice(v, gen)]


def _rotary(case: Case, args: list, gen: torch.Generator) -> list:
    x, cos, sin = args
    s, d = cos.shape
    # the tables are built for a longer sequence: cos[:S] and sin[:S] are views of them
    longer = [torch.cat([t, torch.randn(5, d, generator=gen).to(t.dtype)]) for t in (cos, sin)]
    return [projection_slice(x, 1, gen), longer[0][:s], longer[1][:s]]


def _add_rmsnorm(case: Case, args: list, gen: torch.Generator) -> list:
    x, residual, weight = args
    n = x.shape[-1]
    # x a slice of a wider activation, the residual stream a slice of its own
    return [slice_of(x.reshape(-1, n), 3 * n, gen).view(x.shape),
            slice_of(residual.reshape(-1, n), 2 * n, gen, at=n).view(residual.shape), weight]


def _silu_mul(case: Case, args: list, gen: torch.Generator) -> list:
    gate, up = args
    n = gate.shape[-1]
    # gate and up the two halves of one fused gate_up projection [M, 2N]
    fused = torch.randn(gate.reshape(-1, n).shape[0], 2 * n, generator=gen).to(gate.dtype)
    fused[:, :n], fused[:, n:] = gate.reshape(-1, n), up.reshape(-1, n)
    return [fused[:, :n].view(gate.shape), fused[:, n:].view(up.shape)]


def _rotary_qk(case: Case, args: list, gen: torch.Generator) -> list:
    q, k, cos, sin = args
    s, d = cos.shape
    longer = [torch.cat([t, torch.randn(5, d, generator=gen).to(t.dtype)]) for t in (cos, sin)]
    return [projection_slice(q, 0, gen), projection_slice(k, 1, gen), longer[0][:s], longer[1][:s]]


def _linear_ce(case: Case, args: list, gen: torch.Generator) -> list:
    x, weight, targets = args
    v, d = weight.shape
    # the weight: the first V rows of a vocabulary padded to a multiple of 64
    padded = torch.randn(v + VOCAB_PAD - v % VOCAB_PAD, d, generator=gen).to(weight.dtype)
    padded[:v] = weight
    return [slice_of(x, 2 * x.shape[1], gen, at=x.shape[1]), padded[:v], targets]


def inputs(case: Case, args: list, gen: torch.Generator) -> list:
    """The case's inputs (`args`, the type's own) laid out as a model passes them."""
    t = case.kernel_type
    if t in ("softmax", "cross_entropy", "layernorm", "rmsnorm", "reduce"):
        return _rowwise(case, args, gen)
    return {"matmul": _matmul, "fused_mlp": _mlp, "flash_attention": _attention,
            "rotary_embedding": _rotary, "add_rmsnorm": _add_rmsnorm, "silu_mul": _silu_mul,
            "rotary_qk": _rotary_qk, "linear_cross_entropy": _linear_ce}[t](case, args, gen)
