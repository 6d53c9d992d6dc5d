"""Structured values, laid out as a model passes them: the inputs of a type's "structured" case.

Random normal inputs almost never tie, never hold a constant row, a zero-padded row or integers,
and a kernel can be wrong on exactly those and still pass every random case (a softmax that counts
its row's maximum once is right on every row whose maximum is unique). So each kernel type has one
case, per dtype, whose rows are chosen rather than drawn:

- constant rows, all-zero rows, ties at the maximum, masked rows (-inf on part of a row: the types
  whose rows are logits), one-hot rows, integer-valued and quantised (int8 times a scale) rows, a
  large common offset;
- the properties a type's maths promises, as a row beside its image under the property: a row and
  the same row plus a constant (softmax and log-softmax are invariant under it, and so is a
  layernorm), times 4 (the norms are invariant under scaling a row, up to eps), the same row at
  another index (every row-wise op is equivariant under a permutation of rows), the same row
  reversed (a sum does not depend on the order of its terms). The shift and the scale are exact in
  every dtype judged (the base row is a multiple of 1/8 in [-4, 4]), so the float64 reference of
  the pair is the same row twice, and a kernel that breaks the property is out of tolerance on one
  of them; the comparison's detail then names the rows and what they are (`explain`).

The same case passes its inputs the way a model does (harness/correctness/guards.py checks every
byte around them): a row-wise input is the q slice of a fused qkv projection (so a stray store
past a row lands in k), logits are a slice of a vocabulary padded to a multiple of 64, matmul's b
is an nn.Linear weight transposed, attention's q is a slice of a qkv projection and its k and v
the first positions of a KV cache, rotary's x a slice of a projection and its cos and sin the
first rows of a longer table. Every value is drawn from the case's seeded generator, so the
judging process rebuilds the very same buffers.
"""
from __future__ import annotations

import math

import torch

from harness.kernel_types.kernel_type import Case

VARIANT = "structured"
SHIFT, SCALE = 16.0, 4.0  # exact on a multiple of 1/8 in [-4, 4] in fp32, fp16 and bf16
OFFSET = 1024.0
VOCAB_PAD = 64

_MAX_REPEATS = "its maximum repeats"
WORDS = {
    "constant": f"a constant row ({_MAX_REPEATS} in every column)",
    "zeros": f"an all-zero row ({_MAX_REPEATS} in every column)",
    "ties": "ties at the maximum (the row's largest value appears 3 times)",
    "masked": "a masked row (-inf on part of it)",
    "one_hot": "a one-hot row",
    "integers": "an integer-valued row",
    "quantised": "a quantised row (int8 values times 1/32)",
    "offset": f"a row with a large common offset (+{OFFSET:g})",
    "random": "a row of random multiples of 1/8",
    "shifted": f"the random row plus {SHIFT:g} ({{type}} is invariant under adding a constant to a row)",
    "scaled": f"the random row times {SCALE:g} ({{type}} is invariant under scaling a row, up to eps)",
    "moved": "the random row again at another index (a row-wise op is equivariant under a permutation of rows)",
    "reordered": "the random row reversed (a sum does not depend on the order of its terms)",
}
_LOGITS = ("constant", "zeros", "ties", "masked", "one_hot", "integers", "quantised", "offset", "random",
           "shifted", "moved")
# rows of each type's structured case, in order; the case's row count is their number
ROWS = {
    "softmax": _LOGITS,
    "cross_entropy": _LOGITS,
    "layernorm": ("constant", "zeros", "ties", "one_hot", "integers", "quantised", "offset", "random",
                  "shifted", "scaled", "moved"),
    "rmsnorm": ("constant", "zeros", "ties", "one_hot", "integers", "quantised", "offset", "random", "scaled",
                "moved"),
    "reduce": ("constant", "zeros", "one_hot", "integers", "quantised", "offset", "random", "reordered", "moved"),
    # the rows of a matrix product's left operand, of attention's queries, of rotary's positions
    "matmul": ("zeros", "constant", "one_hot", "integers", "quantised", "offset", "random", "moved"),
    "fused_mlp": ("zeros", "constant", "one_hot", "integers", "quantised", "random", "moved"),
    "flash_attention": ("zeros", "constant", "one_hot", "integers", "quantised", "random", "moved"),
    "rotary_embedding": ("zeros", "constant", "one_hot", "integers", "quantised", "offset", "random", "moved"),
}


def rows(kernel_type: str) -> int:
    """The row count of a type's structured case (the dims in the type's stability list use it)."""
    return len(ROWS[kernel_type])


def _base(gen: torch.Generator, n: int) -> torch.Tensor:
    # multiples of 1/8 in [-4, 4]: +16 and x4 stay exact in bf16 (8 bits), fp16 and fp32
    return torch.randint(-32, 33, (n,), generator=gen).float() / 8.0


def _row(kind: str, n: int, gen: torch.Generator, base: torch.Tensor) -> torch.Tensor:
    if kind == "constant":
        return torch.full((n,), 1.5)
    if kind == "zeros":
        return torch.zeros(n)
    if kind == "ties":
        row = _base(gen, n)
        row[torch.randperm(n, generator=gen)[:min(3, n)]] = row.max() + 0.5
        return row
    if kind == "masked":
        row = _base(gen, n)
        drop = torch.rand(n, generator=gen) < 0.4
        drop[torch.randint(0, n, (1,), generator=gen)] = False  # never a whole row
        return row.masked_fill(drop, float("-inf"))
    if kind == "one_hot":
        row = torch.zeros(n)
        row[torch.randint(0, n, (1,), generator=gen)] = 1.0
        return row
    if kind == "integers":
        return torch.randint(-4, 5, (n,), generator=gen).float()
    if kind == "quantised":
        return torch.randint(-127, 128, (n,), generator=gen).float() / 32.0
    if kind == "offset":
        return _base(gen, n) + OFFSET
    return {"random": base, "shifted": base + SHIFT, "scaled": base * SCALE, "moved": base,
            "reordered": base.flip(0)}[kind]


def values(kernel_type: str, count: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """[count, n] float32 rows: the type's kinds in order, repeated when `count` is larger."""
    kinds = ROWS[kernel_type]
    base = _base(gen, n)
    return torch.stack([_row(kinds[i % len(kinds)], n, gen, base) for i in range(count)])


def _quantised(gen: torch.Generator, shape, scale: float) -> torch.Tensor:
    return torch.randint(-127, 128, tuple(shape), generator=gen).float() * scale


def _slice_of(t: torch.Tensor, width: int, gen: torch.Generator, at: int = 0) -> torch.Tensor:
    """`t` [rows, n] as columns at..at+n of a wider [rows, width] buffer, the rest of it random."""
    wide = torch.randn(t.shape[0], width, generator=gen).to(t.dtype)
    wide[:, at:at + t.shape[1]] = t
    return wide[:, at:at + t.shape[1]]


def _projection_slice(t: torch.Tensor, which: int, gen: torch.Generator) -> torch.Tensor:
    """`t` [B, H, S, D] as slice `which` of a fused projection laid out [B, S, 3, H, D] (the other
    two slices random): q = proj[:, :, 0].transpose(1, 2), as attention modules take it."""
    b, h, s, d = t.shape
    proj = torch.randn(b, s, 3, h, d, generator=gen).to(t.dtype)
    proj[:, :, which] = t.transpose(1, 2)
    return proj[:, :, which].transpose(1, 2)


def _cache_slice(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """`t` [B, H, S, D] as the first S positions of a KV cache twice as long (the rest random)."""
    b, h, s, d = t.shape
    cache = torch.randn(b, h, 2 * s + 3, d, generator=gen).to(t.dtype)
    cache[:, :, :s] = t
    return cache[:, :, :s]


def _rowwise(case: Case, args: list, kwargs: dict, gen: torch.Generator) -> list:
    x = args[0]
    m, n = math.prod(x.shape[:-1]), x.shape[-1]
    rows_ = values(case.kernel_type, m, n, gen).to(x.dtype)
    if case.kernel_type == "cross_entropy":
        # a vocabulary padded to a multiple of 64, the model's logits its first V columns
        logits = _slice_of(rows_, n + VOCAB_PAD - n % VOCAB_PAD, gen)
        return [logits, _targets(rows_, ROWS["cross_entropy"], gen)]
    # the q slice of a fused qkv projection: a store past a row's end lands in k
    return [_slice_of(rows_, 3 * n, gen).view(x.shape), *args[1:]]


def _targets(logits: torch.Tensor, kinds: tuple, gen: torch.Generator) -> torch.Tensor:
    """A target per row, never at -inf: at one of the tied maxima in a row of ties, anywhere finite
    in the others."""
    out = []
    for i, row in enumerate(logits.float()):
        pick = row == row.max() if kinds[i % len(kinds)] == "ties" else torch.isfinite(row)
        where = torch.nonzero(pick).flatten()
        out.append(int(where[torch.randint(0, where.numel(), (1,), generator=gen)]))
    return torch.tensor(out, dtype=torch.int64)


def _matmul(case: Case, args: list, gen: torch.Generator) -> list:
    a, b = args
    m, k = a.shape
    a = _slice_of(values("matmul", m, k, gen).to(a.dtype), 2 * k, gen)
    # b is an nn.Linear weight [N, K] (int8-quantised values times 1/64), transposed
    weight = _quantised(gen, (b.shape[1], k), 1.0 / 64.0).to(b.dtype)
    return [a, weight.t()]


def _mlp(case: Case, args: list, gen: torch.Generator) -> list:
    x, w_gate, w_up, w_down = args
    m, d = x.shape
    x = _slice_of(values("fused_mlp", m, d, gen).to(x.dtype), 2 * d, gen, at=d)
    scale = 1.0 / (32.0 * math.sqrt(d))
    return [x, *[_quantised(gen, w.shape, scale).to(w.dtype) for w in (w_gate, w_up)],
            _quantised(gen, w_down.shape, 1.0 / (32.0 * math.sqrt(w_down.shape[1]))).to(w_down.dtype)]


def _attention(case: Case, args: list, gen: torch.Generator) -> list:
    q, k, v = args
    b, h, s, d = q.shape
    qs = values("flash_attention", b * h * s, d, gen).view(b, h, s, d) / 4.0
    ks = _quantised(gen, (b, h, s, d), 1.0 / 128.0)
    ks[:, :, 1::3] = ks[:, :, 0:1]  # a key repeated: every query's scores tie there
    vs = _quantised(gen, (b, h, s, d), 1.0 / 64.0)
    q = _projection_slice(qs.to(q.dtype), 0, gen)
    return [q, _cache_slice(ks.to(k.dtype), gen), _cache_slice(vs.to(v.dtype), gen)]


def _rotary(case: Case, args: list, gen: torch.Generator) -> list:
    x, cos, sin = args
    b, h, s, d = x.shape
    xs = values("rotary_embedding", b * h * s, d, gen).view(b, h, s, d)
    x = _projection_slice(xs.to(x.dtype), 1, gen)
    # the model's tables are longer than the sequence: cos[:S] and sin[:S] are views of them
    longer = [torch.cat([t, torch.randn(5, d, generator=gen).to(t.dtype)]) for t in (cos, sin)]
    return [x, longer[0][:s], longer[1][:s]]


def inputs(case: Case, args: list, kwargs: dict, gen: torch.Generator) -> list:
    """The structured case's inputs, made from the type's own (`args`, whose shapes and dtypes
    they keep) and the case's generator: structured values in a model's layout."""
    t = case.kernel_type
    if t in ("softmax", "cross_entropy", "layernorm", "rmsnorm", "reduce"):
        return _rowwise(case, args, kwargs, gen)
    return {"matmul": _matmul, "fused_mlp": _mlp, "flash_attention": _attention,
            "rotary_embedding": _rotary}[t](case, args, gen)


def labels(case: Case, out_rows: int) -> list[str]:
    """What each output row of the case is, in words."""
    kinds = ROWS[case.kernel_type]
    return [WORDS[kinds[i % len(kinds)]].replace("{type}", case.kernel_type) for i in range(out_rows)]


def explain(case: Case, bad: torch.Tensor) -> str:
    """The rows a structured case got wrong, named by what they are; `bad`: an element-wise mask of
    the elements out of tolerance, shaped as the output."""
    if case.variant != VARIANT:
        return ""
    if bad.dim() == 0:  # one number for all rows (cross_entropy's mean): no row to name
        return f"; its rows are {', '.join(WORDS[k].split(' (')[0] for k in ROWS[case.kernel_type])}"
    per_row = bad.reshape(-1, bad.shape[-1]).any(-1) if case.kernel_type != "reduce" else bad.reshape(-1)
    words = labels(case, per_row.numel())
    wrong = [i for i in range(per_row.numel()) if per_row[i]]
    if not wrong:
        return ""
    if len(wrong) == per_row.numel():
        return "; wrong on every row of the case (its inputs are views into wider buffers, as a model passes them)"
    right = [words[i].split(" (")[0] for i in range(per_row.numel()) if not per_row[i]]
    named = "; ".join(f"row {i}: {words[i]}" for i in wrong[:4]) + (" ..." if len(wrong) > 4 else "")
    return (f"; wrong on {len(wrong)} of the case's {per_row.numel()} rows, each chosen for what it is: {named}"
            + (f"; right on: {', '.join(dict.fromkeys(right))}" if right else ""))
