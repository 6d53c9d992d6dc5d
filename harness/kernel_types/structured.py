"""Structured values: the inputs of a type's "structured" case, chosen rather than drawn.

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

Every value is drawn from the case's seeded generator, so the judging process rebuilds the very
same inputs. Their layout is plain: how a model lays its inputs out is the edge cases' affair
(harness/kernel_types/model_views.py), so that a failure here is about values.
"""
from __future__ import annotations

import math

import torch

from harness.kernel_types.kernel_type import Case

VARIANT = "structured"
SHIFT, SCALE = 16.0, 4.0  # exact on a multiple of 1/8 in [-4, 4] in fp32, fp16 and bf16
OFFSET = 1024.0

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
    # chains (harness/kernel_types/types/chains.py): the rows of x (the sum's, with a zero residual),
    # of the gate, of q and k, of the hidden states the projection reads
    "add_rmsnorm": ("constant", "zeros", "ties", "one_hot", "integers", "quantised", "offset", "random", "scaled",
                    "moved"),
    "silu_mul": ("zeros", "constant", "one_hot", "integers", "quantised", "offset", "random", "moved"),
    "rotary_qk": ("zeros", "constant", "one_hot", "integers", "quantised", "offset", "random", "moved"),
    "linear_cross_entropy": ("zeros", "constant", "one_hot", "integers", "quantised", "random", "moved"),
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


def _rowwise(case: Case, args: list, gen: torch.Generator) -> list:
    x = args[0]
    rows_ = values(case.kernel_type, math.prod(x.shape[:-1]), x.shape[-1], gen).view(x.shape).to(x.dtype)
    if case.kernel_type == "cross_entropy":
        return [rows_, _targets(rows_, ROWS["cross_entropy"], gen)]
    return [rows_, *args[1:]]


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
    a = values("matmul", a.shape[0], a.shape[1], gen).to(a.dtype)
    # a quantised weight: int8 values times 1/64
    return [a, _quantised(gen, b.shape, 1.0 / 64.0).to(b.dtype)]


def _mlp(case: Case, args: list, gen: torch.Generator) -> list:
    x, w_gate, w_up, w_down = args
    x = values("fused_mlp", x.shape[0], x.shape[1], gen).to(x.dtype)
    return [x, *[_quantised(gen, w.shape, 1.0 / (32.0 * math.sqrt(w.shape[1]))).to(w.dtype)
                 for w in (w_gate, w_up, w_down)]]


def _attention(case: Case, args: list, gen: torch.Generator) -> list:
    q, k, v = args
    b, h, s, d = q.shape
    qs = values("flash_attention", b * h * s, d, gen).view(b, h, s, d) / 4.0
    ks = _quantised(gen, (b, h, s, d), 1.0 / 128.0)
    ks[:, :, 1::3] = ks[:, :, 0:1]  # a key repeated: every query's scores tie there
    vs = _quantised(gen, (b, h, s, d), 1.0 / 64.0)
    return [qs.to(q.dtype), ks.to(k.dtype), vs.to(v.dtype)]


def _rotary(case: Case, args: list, gen: torch.Generator) -> list:
    x, cos, sin = args
    b, h, s, d = x.shape
    return [values("rotary_embedding", b * h * s, d, gen).view(b, h, s, d).to(x.dtype), cos, sin]


def _add_rmsnorm(case: Case, args: list, gen: torch.Generator) -> list:
    x, residual, weight = args
    rows_ = values("add_rmsnorm", math.prod(x.shape[:-1]), x.shape[-1], gen).view(x.shape).to(x.dtype)
    # a zero residual: the sum is the chosen row itself, so the norm's properties hold for it
    return [rows_, torch.zeros_like(residual), weight]


def _silu_mul(case: Case, args: list, gen: torch.Generator) -> list:
    gate, up = args
    rows_ = values("silu_mul", math.prod(gate.shape[:-1]), gate.shape[-1], gen).view(gate.shape).to(gate.dtype)
    return [rows_, _quantised(gen, up.shape, 1.0 / 32.0).to(up.dtype)]


def _rotary_qk(case: Case, args: list, gen: torch.Generator) -> list:
    q, k, cos, sin = args
    made = [values("rotary_qk", t.shape[0] * t.shape[1] * t.shape[2], t.shape[3], gen).view(t.shape).to(t.dtype)
            for t in (q, k)]
    return [*made, cos, sin]


def _linear_ce(case: Case, args: list, gen: torch.Generator) -> list:
    x, weight, targets = args
    x = values("linear_cross_entropy", x.shape[0], x.shape[1], gen).to(x.dtype)
    return [x, _quantised(gen, weight.shape, 1.0 / (32.0 * math.sqrt(weight.shape[1]))).to(weight.dtype), targets]


def inputs(case: Case, args: list, gen: torch.Generator) -> list:
    """The structured case's inputs, made from the type's own (`args`, whose shapes and dtypes
    they keep) and the case's generator."""
    t = case.kernel_type
    if t in ("softmax", "cross_entropy", "layernorm", "rmsnorm", "reduce"):
        return _rowwise(case, args, gen)
    return {"matmul": _matmul, "fused_mlp": _mlp, "flash_attention": _attention,
            "rotary_embedding": _rotary, "add_rmsnorm": _add_rmsnorm, "silu_mul": _silu_mul,
            "rotary_qk": _rotary_qk, "linear_cross_entropy": _linear_ce}[t](case, args, gen)


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
        return "; wrong on every row of the case"
    right = [words[i].split(" (")[0] for i in range(per_row.numel()) if not per_row[i]]
    named = "; ".join(f"row {i}: {words[i]}" for i in wrong[:4]) + (" ..." if len(wrong) > 4 else "")
    return (f"; wrong on {len(wrong)} of the case's {per_row.numel()} rows, each chosen for what it is: {named}"
            + (f"; right on: {', '.join(dict.fromkeys(right))}" if right else ""))
