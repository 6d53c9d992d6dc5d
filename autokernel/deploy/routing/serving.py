"""A winner's serving range: the calls it may serve, and in words why any other call falls back.

The judge proves a kernel at its target and, for a kept kernel, at the shapes around it
(harness/verdict/around.py): the free dims halved plus an odd remainder, doubled, and 1. A kernel type's
free dims are those that vary between calls of one model (rows; batch and sequence for attention
and rotary); the others (widths, heads, vocabulary: the weights' shapes) must be the target's. A
call is served when

- its dtype, causal flag and fixed dims are the target's, and its free dims lie within the span
  of the shapes whose checked output was right (only at those very shapes, if the kernel was
  wrong at one: then nothing between them is trusted);
- on a GPU, when the figures were taken on a GPU: it lies between two measured shapes where the
  kernel was not slower than PyTorch (or is one), with no shape where it was slower in between;
  except for a kernel type whose gain is memory (FOR_MEMORY): the fused loss serves where it is
  right, whatever its speed, and verify reports both.

On the CPU the interpreter's times say nothing about speed: correctness alone decides. A run
recorded before serving ranges has its target alone: it serves exactly that shape.

    serving = ServingRange.from_json(manifest_entry["serving"])
    why = serving.refusal(dims, on_gpu=x.is_cuda)  # None: serve it; else a reason, worded by words()

Nothing here imports anything but the standard library: the router, verify, the exported package
and its Hugging Face layers all decide with this one class.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

# the dims of each kernel type that vary between calls of one model (harness/verdict/around.py: the same)
FREE_DIMS: dict[str, tuple[str, ...]] = {
    "matmul": ("M",), "fused_mlp": ("M",), "softmax": ("M",), "layernorm": ("M",), "rmsnorm": ("M",),
    "reduce": ("M",), "cross_entropy": ("N",), "flash_attention": ("B", "S"), "rotary_embedding": ("B", "S"),
    "add_rmsnorm": ("M",), "silu_mul": ("M",), "rotary_qk": ("B", "S"), "linear_cross_entropy": ("N",),
}
DIM_WORDS = {"M": "rows", "N": "rows", "B": "batch", "S": "sequence"}
# kernel types whose gain is memory, served where right whatever their speed: the final projection +
# cross-entropy never holds the [tokens, vocabulary] logits, and serves only a training step's loss,
# where that is what a larger batch needs (Liger's, for one, trades about a tenth of the speed for it)
FOR_MEMORY = frozenset({"linear_cross_entropy"})


@dataclass
class Shape:
    """One shape the kernel was checked at (the target or one around it) and its figures there."""

    dims: dict
    ok: bool  # its checked output was right
    median_us: Optional[float] = None
    baseline_median_us: Optional[float] = None  # PyTorch's own op, timed beside it
    not_slower: Optional[bool] = None  # None: not timed, or a time that says nothing (the interpreter)
    detail: str = ""


@dataclass
class ServingRange:
    kernel_type: str
    dtype: str
    dims: dict  # the target's
    causal: Optional[bool] = None
    shapes: list = field(default_factory=list)  # [Shape]: the target and the shapes around it
    representative: bool = False  # the figures were taken on a GPU
    note: str = ""  # where the range came from, in words

    @staticmethod
    def exact(kernel_type: str, dims: dict, dtype: str, causal: Optional[bool] = None, note: str = "") -> "ServingRange":
        """The target's shape alone (a record with no shapes around it, or a winner built by hand)."""
        return ServingRange(kernel_type, dtype, dict(dims), causal, [Shape(dict(dims), True)],
                            note=note or "the target alone")

    @property
    def free(self) -> tuple[str, ...]:
        return FREE_DIMS.get(self.kernel_type, ())

    def same_family(self, dims: dict, dtype: str, causal: Optional[bool]) -> bool:
        """The call has this winner's dtype, causal flag and fixed dims: only its free dims may differ."""
        if dtype != self.dtype or (causal is not None and bool(causal) != bool(self.causal)):
            return False
        free = self.free
        return all(dims.get(k) == v for k, v in self.dims.items() if k not in free) and dims.keys() == self.dims.keys()

    # ------------------------------------------------------------------ the decision
    def refusal(self, dims: dict, on_gpu: bool = False) -> Optional[tuple]:
        """None when a call of this family at `dims` is served; else why not, as a tuple for
        `words` (kept unworded: on the hot path, and under torch.compile's tracing, where formatting
        a symbolic size would fix it)."""
        free = self.free
        point = tuple(dims[k] for k in free)
        proven = [self._point(s) for s in self.shapes if s.ok]
        wrong = [self._point(s) for s in self.shapes if not s.ok]
        if point in wrong:
            return ("wrong", self.kernel_type, self._changed(dims))
        if wrong and point not in proven:  # wrong somewhere: nothing between the shapes is trusted
            return ("unproven", self.kernel_type, self._changed(dims), self._span(proven, exact=True))
        if not proven or not all(min(p[i] for p in proven) <= v <= max(p[i] for p in proven)
                                 for i, v in enumerate(point)):
            return ("unproven", self.kernel_type, self._changed(dims), self._span(proven))
        if on_gpu and self.representative and self.kernel_type not in FOR_MEMORY:
            return self._speed(point, dims)
        return None

    def _speed(self, point: tuple, dims: dict) -> Optional[tuple]:
        timed = [(self._point(s), s.not_slower) for s in self.shapes if s.ok and s.not_slower is not None]
        for p, fast in timed:
            if p == point:
                return None if fast else ("slower", self.kernel_type, self._changed(dims))
        below = [p for p, fast in timed if fast and _le(p, point)]
        above = [p for p, fast in timed if fast and _le(point, p)]
        slow = [p for p, fast in timed if not fast]
        for lo in below:
            for hi in above:
                if not any(_le(lo, p) and _le(p, hi) for p in slow):
                    return None
        return ("unmeasured", self.kernel_type, self._changed(dims))

    def _point(self, shape: Shape) -> tuple:
        return tuple(shape.dims[k] for k in self.free)

    def _changed(self, dims: dict) -> tuple:
        """The free dims a reason names: those that differ from the target's (all, if none do)."""
        changed = tuple((k, dims[k]) for k in self.free if dims[k] != self.dims.get(k))
        return changed or tuple((k, dims[k]) for k in self.free)

    def _span(self, proven: list, exact: bool = False) -> tuple:
        """What was proven, per free dim: (name, sorted values) for exact points, else (name, lo, hi)."""
        if exact or len(proven) <= 1:
            return tuple((k, tuple(sorted({p[i] for p in proven}))) for i, k in enumerate(self.free))
        return tuple((k, min(p[i] for p in proven), max(p[i] for p in proven)) for i, k in enumerate(self.free))

    # ------------------------------------------------------------------ records
    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "ServingRange":
        shapes = [Shape(**{k: v for k, v in s.items() if k in Shape.__dataclass_fields__}) for s in d.get("shapes", [])]
        return ServingRange(d["kernel_type"], d["dtype"], dict(d["dims"]), d.get("causal"), shapes,
                            bool(d.get("representative", False)), d.get("note", ""))

    def summary(self) -> str:
        """The range in words: 'rows 1 to 256 (N=384, float32)'."""
        proven = [self._point(s) for s in self.shapes if s.ok]
        exact = any(not s.ok for s in self.shapes)
        fixed = ", ".join(f"{k}={v}" for k, v in self.dims.items() if k not in self.free)
        return f"{_span_words(self._span(proven, exact))} ({fixed + ', ' if fixed else ''}{self.dtype})"


def _le(a: tuple, b: tuple) -> bool:
    return all(x <= y for x, y in zip(a, b))


def _what(changed: tuple) -> str:
    """('M', 67) -> 'rows 67'; ('M', 1) -> '1 row'; ('B', 2), ('S', 67) -> 'batch 2, sequence 67'."""
    parts = []
    for name, value in changed:
        word = DIM_WORDS.get(name, name)
        parts.append(f"1 {word[:-1]}" if value == 1 and word == "rows" else f"{word} {value}")
    return ", ".join(parts)


def _span_words(span: tuple) -> str:
    parts = []
    for name, *values in span:
        word = DIM_WORDS.get(name, name)
        if len(values) == 2:
            parts.append(f"{word} {values[0]}" if values[0] == values[1] else f"{word} {values[0]} to {values[1]}")
        else:
            parts.append(f"{word} {' or '.join(str(v) for v in values[0]) or 'none'}")
    return ", ".join(parts)


def words(reason: tuple) -> str:
    """A refusal in words: 'sequence 67: not measured', '1 row: slower here'."""
    kind, _, changed, *rest = reason
    what = _what(changed)
    if kind == "wrong":
        return f"{what}: the kernel gave a wrong answer there when judged"
    if kind == "slower":
        return f"{what}: slower here"
    if kind == "unmeasured":
        return f"{what}: not measured"
    return f"{what}: not proven (judged at {_span_words(rest[0])})"


SPEED_WORDS = (": slower here", ": not measured")


def only_for_speed(reasons: Any) -> bool:
    """Whether every reason (worded) is about speed (slower there, or not measured): a kernel that
    is right, only not faster on this GPU, falls back for nothing else."""
    return bool(reasons) and all(str(r).endswith(SPEED_WORDS) for r in reasons)
