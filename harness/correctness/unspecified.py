"""What a GPU leaves unspecified, made unpredictable in the judge.

The Triton interpreter gives a fixed answer where the GPU's is unspecified, and a kernel can be
right only because of it:

- an integer division or remainder by zero: numpy's 0 (PTX: "an unspecified, machine-specific
  value"). A row index `pid + (pid // groups) * pad` called with groups = 0 lands on row `pid`
  under the interpreter and anywhere on a GPU;
- `tl.reshape(x, shape, can_reorder=True)` (and `tl.view`, which is the same) and `tl.cat` (which
  Triton always compiles as free to reorder): the interpreter keeps the elements in order; the
  compiler may hand them back in any order, which only an order-blind use (a sum, a max) survives.

So in the judge's worker (`Unspecified`, set on the launch monitor beside the program orders, from a
secret drawn before the candidate is imported) a division or remainder by zero gives, lane by lane,
a value keyed by the secret and the dividend, and a reorderable reshape or cat permutes its elements
by a permutation keyed by the secret and the shapes. Both are fixed within the process (the same
inputs give the same bits, as one compiled kernel does on a GPU), so an honest kernel's checks and
timed calls agree with each other, and a kernel whose output depends on them fails its cases. A
lane whose result is never used (a masked-off lane divided by the `other=0` its load gave it) costs
nothing. Each use is counted (`counts`), so a failing case says what it used, and the first use of
each kind in the process is written to stderr, so a crash (a store to an address made from such a
value) says it too; a reduction over all axes (`tl.sum(x, axis=None)`) reorders too, as Triton
compiles it, but is not counted: it is order-blind by design. Outside the judge (verify, an exported package) the interpreter is left as it is.
"""
from __future__ import annotations

import sys
import zlib
from collections import Counter

import numpy as np

DIVISION = "an integer division or remainder by zero"
REORDER = "tl.reshape(..., can_reorder=True) or tl.cat, whose element order the compiler may change"
ADVICE = {DIVISION: "divide only by a nonzero value",
          REORDER: "keep tl.reshape's default can_reorder=False where the order matters, and tl.join or "
                   "tl.interleave rather than tl.cat"}


class Unspecified:
    """The judge's secret answers to what a GPU leaves unspecified, and a count of their uses."""

    def __init__(self, seed: int):
        rng = np.random.default_rng(seed)
        self._keys = rng.integers(1, 2**63, size=2, dtype=np.uint64) | np.uint64(1)  # odd multipliers
        self._salt = int(rng.integers(0, 2**63))
        self._permutations: dict[tuple, np.ndarray] = {}
        self.counts: Counter = Counter()
        self._told: set[str] = set()

    def used(self, what: str, lanes: int) -> None:
        self.counts[what] += lanes
        if what not in self._told:
            self._told.add(what)
            print(f"autokernel judge: the kernel used {what}; a GPU gives no defined result there, and the judge "
                  "gives an arbitrary one", file=sys.stderr, flush=True)

    def quotient(self, dividend: np.ndarray, dtype: np.dtype, remainder: bool) -> np.ndarray:
        """Arbitrary values of `dtype`, one per lane, fixed by the secret and each lane's dividend."""
        bits = np.ascontiguousarray(dividend).astype(np.int64, copy=False).view(np.uint64)
        with np.errstate(over="ignore"):
            mixed = (bits + np.uint64(1 + remainder)) * self._keys[int(remainder)]
            mixed ^= mixed >> np.uint64(29)
        width = np.dtype(dtype).itemsize
        return mixed.astype(np.dtype(f"u{width}")).view(dtype)

    def permutation(self, key: tuple, n: int) -> np.ndarray:
        """A permutation of n elements, fixed within the process for `key` (the shapes involved)."""
        if key not in self._permutations:
            perm = np.random.default_rng([self._salt, n, zlib.crc32(repr(key).encode())]).permutation(n)
            if n > 1 and np.array_equal(perm, np.arange(n)):
                perm = perm[::-1].copy()
            self._permutations[key] = perm
        return self._permutations[key]


def hint(obs: dict) -> str:
    """What to add to a failing case's reason where its call used what a GPU leaves unspecified."""
    used = obs.get("unspecified")
    if not isinstance(used, dict) or not used:
        return ""
    what = "; ".join(f"{name} ({n} {'lanes' if name == DIVISION else 'times'})" for name, n in sorted(used.items()))
    fixes = "; ".join(ADVICE[name] for name in sorted(used) if name in ADVICE)
    return (f"; the call used what a GPU leaves unspecified: {what}. The judge answers it with arbitrary "
            f"values, as a GPU may, so an output that depends on it is wrong on a GPU too ({fixes})")


def _from_reduction() -> bool:
    """Whether the reshape being built is Triton's own, flattening a reduction's inputs over all axes
    (order-blind by design): create_reshape's callers are semantic.reshape, then a generator
    expression or the reduction itself."""
    frame = sys._getframe(3)
    for _ in range(2):
        if frame is None:
            return False
        if frame.f_code.co_name == "reduction" and frame.f_code.co_filename.endswith("semantic.py"):
            return True
        frame = frame.f_back
    return False


def install(monitor) -> None:
    """Route the interpreter's integer divisions, remainders, reshapes and cats through
    `monitor.unspecified` where the judge's worker set one; once per process."""
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_idiv, "unspecified", False):
        return
    Handle = interpreter.TensorHandle  # noqa: N806

    def by_zero(original, remainder: bool):
        def run(self, lhs, rhs):
            secret = monitor.unspecified
            zero = np.asarray(rhs.data) == 0
            if secret is None or not zero.any() or np.asarray(rhs.data).dtype.kind not in "iu":
                return original(self, lhs, rhs)
            ones = Handle(np.where(zero, 1, rhs.data).astype(rhs.data.dtype), rhs.dtype.scalar)
            out = original(self, lhs, ones)
            data, zero = np.broadcast_arrays(np.asarray(out.data), zero)
            dividend = np.broadcast_to(np.asarray(lhs.data), data.shape)
            secret.used(DIVISION, int(zero.sum()))
            garbage = secret.quotient(dividend, data.dtype, remainder)
            return Handle(np.where(zero, garbage, data).astype(data.dtype, copy=False), out.dtype.scalar)
        run.unspecified = True
        run.__wrapped__ = original
        return run

    reshape, cat = builder.create_reshape, builder.create_cat

    def create_reshape(self, arg, shape, allow_reorder):
        secret = monitor.unspecified
        if not allow_reorder or secret is None:
            return reshape(self, arg, shape, allow_reorder)
        data = np.asarray(arg.data)
        if not _from_reduction():
            secret.used(REORDER, 1)
        perm = secret.permutation(("reshape", data.shape, tuple(shape)), data.size)
        return Handle(data.ravel()[perm].reshape(shape), arg.dtype.scalar)

    def create_cat(self, lhs, rhs):
        out = cat(self, lhs, rhs)
        secret = monitor.unspecified
        if secret is None:
            return out
        data = np.asarray(out.data)
        secret.used(REORDER, 1)
        perm = secret.permutation(("cat", np.shape(lhs.data), np.shape(rhs.data)), data.size)
        return Handle(data.ravel()[perm].reshape(data.shape), out.dtype.scalar)

    builder.create_idiv = by_zero(builder.create_idiv, remainder=False)
    builder.create_srem = by_zero(builder.create_srem, remainder=True)
    builder.create_urem = by_zero(builder.create_urem, remainder=True)
    create_reshape.unspecified = create_cat.unspecified = True
    builder.create_reshape, builder.create_cat = create_reshape, create_cat
