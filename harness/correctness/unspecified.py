"""What a GPU leaves unspecified, made unpredictable in the judge.

The Triton interpreter gives a fixed answer where the GPU's is unspecified, and a kernel can be
right only because of it:

- an integer division or remainder by zero: numpy's 0 (PTX: "an unspecified, machine-specific
  value"). A row index `pid + (pid // groups) * pad` called with groups = 0 lands on row `pid`
  under the interpreter and anywhere on a GPU;
- a shift by the operand's bit width or more: numpy's 0 (`1 << 32` in int32), where Triton emits
  LLVM's shl, whose result is poison there: the compiler folds `(1 << s) != 0` to true;
- `tl.argmax`/`tl.argmin` with `tie_break_left=False`: numpy's leftmost index of a tie, where the
  GPU's butterfly keeps whichever lane its shuffles bring (never index 0, where a warp's lanes tie);
- the order a combine function of the kernel's own is applied in (`tl.reduce`, `tl.associative_scan`):
  the interpreter folds left to right, one element at a time; a GPU combines each thread's
  registers (elements a layout's width apart), then across lanes and warps in a tree, so a
  combine that is not associative (and, for a reduce, commutative) gives another answer there;
- `tl.reshape(x, shape, can_reorder=True)` (and `tl.view`, which is the same) and `tl.cat` (which
  Triton always compiles as free to reorder): the interpreter keeps the elements in order; the
  compiler may hand them back in any order, which only an order-blind use (a sum, a max) survives.

So in the judge's worker (`Unspecified`, set on the launch monitor beside the program orders, from a
secret drawn before the candidate is imported) a division or remainder by zero and a shift past the
width give, lane by lane, a value keyed by the secret and the left operand, a reorderable reshape or
cat permutes its elements by a permutation keyed by the secret and the shapes, a tie-break-fast
argmax or argmin picks among the tied lanes by such a permutation, a reduce with a combine of the
kernel's own combines the elements so permuted in pairs, level by level (a tree), and such a scan
combines in the Hillis-Steele order a warp's shuffles use (each element with the one 1, 2, 4, ...
places before it), both on whole blocks at once. All are fixed within the process (the same
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
SHIFT = "a shift by the operand's bit width or more (or by a negative amount)"
TIE = "tl.argmax or tl.argmin with tie_break_left=False over tied values"
COMBINE = "tl.reduce or tl.associative_scan with a combine function of its own, applied in a tree"
ATOMIC_LANES = "an atomic whose lanes aim at one address, run in no promised order"
REORDER = "tl.reshape(..., can_reorder=True) or tl.cat, whose element order the compiler may change"
ADVICE = {DIVISION: "divide only by a nonzero value",
          SHIFT: "shift by less than the operand's bit width",
          TIE: "keep tie_break_left=True, the default, where the index of a tie matters",
          COMBINE: "a reduce's combine function must be associative and commutative, a scan's associative",
          ATOMIC_LANES: "reduce in registers before one atomic per address, or let every lane's order give "
                        "the same result (an integer add, a max, a compare-and-swap loop that retries)",
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

    def quotient(self, dividend: np.ndarray, dtype: np.dtype, kind: int) -> np.ndarray:
        """Arbitrary values of `dtype`, one per lane, fixed by the secret, `kind` (0 a quotient, 1 a
        remainder, 2 a shift) and each lane's left operand."""
        bits = np.ascontiguousarray(dividend).astype(np.int64, copy=False).view(np.uint64)
        with np.errstate(over="ignore"):
            mixed = (bits + np.uint64(1 + kind)) * self._keys[kind % 2]
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
    what = "; ".join(f"{name} ({n} {'lanes' if name in (DIVISION, SHIFT) else 'times'})"
                     for name, n in sorted(used.items()))
    fixes = "; ".join(ADVICE[name] for name in sorted(used) if name in ADVICE)
    return (f"; the call used what a GPU leaves unspecified: {what}. The judge answers it as a GPU may "
            f"(arbitrary values, a secret order), so an output that depends on it is wrong on a GPU too ({fixes})")


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


def _tie_break_fast(monitor, interpreter) -> None:
    """tl.argmax / tl.argmin with tie_break_left=False: among tied lanes, the one a secret
    permutation of the axis (fixed per shape) puts first, where numpy gives the leftmost."""
    import triton.language as tl
    ops = interpreter.ReduceOps
    original = ops.apply_impl

    def apply_impl(self, input):
        secret = monitor.unspecified
        if secret is None:
            return original(self, input)
        if self.combine_fn is getattr(tl.standard, "_argmax_combine_tie_break_fast", None):
            value_of, index_of = np.nanmax, np.nanargmax
        elif self.combine_fn is getattr(tl.standard, "_argmin_combine_tie_break_fast", None):
            value_of, index_of = np.nanmin, np.nanargmin
        else:
            return original(self, input)
        values_in = input[0] if isinstance(input, tuple) else input
        data = np.asarray(values_in.handle.data)
        axis = self.axis if self.axis is not None else 0
        perm = secret.permutation(("tie", data.shape, axis), data.shape[axis])
        values = value_of(data, axis=axis, keepdims=True)
        if np.count_nonzero(data == values) > values.size:  # a tie at some row's end
            secret.used(TIE, 1)
        index = perm[index_of(np.take(data, perm, axis=axis), axis=axis, keepdims=self.keep_dims)]
        value = values if self.keep_dims else np.squeeze(values, axis=axis)
        return self.to_tensor(value, values_in.dtype), self.to_tensor(index.astype(np.int32), tl.int32)

    ops.apply_impl = apply_impl


def _tree_combines(monitor, interpreter) -> None:
    """A reduce or scan with a combine function of the kernel's own, in the judge's worker: in a
    tree, as a GPU combines (see the module's docstring), where the interpreter folds left to right."""
    import triton.language as tl
    reduce_ops, scan_ops = interpreter.ReduceOps, interpreter.ScanOps
    reduce, scan = reduce_ops.generic_reduce, scan_ops.generic_scan

    def combine(ops, earlier: list, later: list, dtypes: list) -> list:
        lhs = [ops.to_tensor(e, dt) for e, dt in zip(earlier, dtypes)]
        rhs = [ops.to_tensor(x, dt) for x, dt in zip(later, dtypes)]
        out = ops.combine_fn.fn(*lhs, *rhs)
        out = out if isinstance(out, tuple) else (out,)
        return [np.broadcast_to(np.asarray(o.handle.data if isinstance(o, tl.core.tensor) else o), e.shape).astype(e.dtype)
                for o, e in zip(out, earlier)]

    def generic_reduce(self, input):
        secret = monitor.unspecified
        if secret is None:
            return reduce(self, input)
        secret.used(COMBINE, 1)
        original_axis = self.axis
        input, axis = self.unravel(input, self.axis)
        dtypes = [t.dtype for t in input]
        shape = np.shape(input[0].handle.data)
        perm = secret.permutation(("reduce", shape, axis), shape[axis])
        parts = [np.moveaxis(np.take(np.asarray(t.handle.data), perm, axis=axis), axis, 0) for t in input]
        while parts[0].shape[0] > 1:  # one level of the tree: neighbours combined in pairs
            m = parts[0].shape[0]
            paired = combine(self, [p[0:m - 1:2] for p in parts], [p[1:m:2] for p in parts], dtypes)
            parts = [np.concatenate([c, p[m - 1:]]) if m % 2 else c for c, p in zip(paired, parts)]
        ret = []
        for part, dtype in zip(parts, dtypes):
            data = part[0]
            if self.keep_dims:
                data = np.expand_dims(data, axis) if original_axis is not None else data.reshape((1,) * len(shape))
            elif original_axis is None:
                data = data.item()
            ret.append(self.to_tensor(data, dtype))
        return ret

    def generic_scan(self, input):
        secret = monitor.unspecified
        if secret is None:
            return scan(self, input)
        secret.used(COMBINE, 1)
        dtypes = [t.dtype for t in input]
        parts = [np.moveaxis(np.asarray(t.handle.data), self.axis, 0).copy() for t in input]
        n, step = parts[0].shape[0], 1
        while step < n:  # Hillis-Steele: each element combined with the one `step` places before it
            # (whole blocks, as a block's shape is a power of 2: the first `step` combine with themselves,
            # and are dropped)
            earlier = [np.concatenate([p[:step], p[:n - step]]) for p in parts]
            combined = combine(self, earlier, parts, dtypes)
            for p, c in zip(parts, combined):
                p[step:] = c[step:]
            step *= 2
        return [self.to_tensor(np.moveaxis(p, 0, self.axis), dtype) for p, dtype in zip(parts, dtypes)]

    reduce_ops.generic_reduce, scan_ops.generic_scan = generic_reduce, generic_scan


def install(monitor) -> None:
    """Route the interpreter's integer divisions, remainders and shifts, reshapes and cats, tie-break-fast
    argmax/argmin and reduces and scans with a combine of the kernel's own through `monitor.unspecified`
    where the judge's worker set one; once per process (the guard below covers every hook)."""
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_idiv, "unspecified", False):
        return
    Handle = interpreter.TensorHandle  # noqa: N806

    def undefined_where(original, kind: int):
        """An integer op whose lanes with an out-of-domain right operand (a zero divisor; a shift
        amount outside [0, bit width)) give the secret's values; `kind` 0 a quotient, 1 a remainder,
        2 a shift."""
        def run(self, lhs, rhs):
            secret = monitor.unspecified
            right = np.asarray(rhs.data)
            if secret is None or right.dtype.kind not in "iu":
                return original(self, lhs, rhs)
            if kind == 2:
                bad = (right < 0) | (right >= 8 * np.asarray(lhs.data).dtype.itemsize)
                safe = 0
            else:
                bad, safe = right == 0, 1
            if not bad.any():
                return original(self, lhs, rhs)
            fixed = Handle(np.where(bad, safe, right).astype(right.dtype), rhs.dtype.scalar)
            out = original(self, lhs, fixed)
            data, bad = np.broadcast_arrays(np.asarray(out.data), bad)
            left = np.broadcast_to(np.asarray(lhs.data), data.shape)
            secret.used(SHIFT if kind == 2 else DIVISION, int(bad.sum()))
            garbage = secret.quotient(left, data.dtype, kind)
            return Handle(np.where(bad, garbage, data).astype(data.dtype, copy=False), out.dtype.scalar)
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

    builder.create_idiv = undefined_where(builder.create_idiv, 0)
    builder.create_srem = undefined_where(builder.create_srem, 1)
    builder.create_urem = undefined_where(builder.create_urem, 1)
    for name in ("create_shl", "create_lshr", "create_ashr"):
        setattr(builder, name, undefined_where(getattr(builder, name), 2))
    _tie_break_fast(monitor, interpreter)
    _tree_combines(monitor, interpreter)
    builder.create_reshape, builder.create_cat = create_reshape, create_cat
