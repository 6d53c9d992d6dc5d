"""The compiler hints a kernel gives, held to the values it gives them for.

`tl.multiple_of(x, 16)` and `tl.max_constancy(x, 8)` are promises to Triton's compiler, which
builds on them without checking: aligned vector loads and stores, one load for a run of equal
addresses. A false promise is wrong results (or a misaligned access) on a GPU; the interpreter
ignores hints, so a kernel that lies in them passes there. So in the judge's checked calls every
hint is compared with the values it is given (the interpreter records it on the value's handle,
where this module looks):

- `tl.multiple_of(x, D)`: D divides the first element of every contiguous group of x; whatever x's
  groups are, the first element starts one, so it must be a multiple of D (for a scalar, a stride
  or a size: the value itself; for a pointer: its address in bytes).
- `tl.max_constancy(x, C)`: x is made of runs of C equal values along each dim: every run is checked.
- `tl.max_contiguous` is not checked: Triton's own tutorial idiom, which the starters use,
  `tl.max_contiguous(tl.multiple_of(tl.where(offs < n, offs, 0), BLOCK), BLOCK)`, promises a run
  its ragged last tile does not have (its clamped lanes are never stored, and a GPU's vector load
  of them reads past the rows it needs), so a check would refuse the honest kernels.

A false hint is a finding of the call (`orders.findings`, as a dependence between programs is),
so the case fails naming the hint, the value and the line, however the kernel catches errors.
Outside the judge's checked calls (verify, an exported package, the timed calls) nothing is
checked. `install()` is called by the launch monitor's install (harness/correctness/launches.py).
"""
from __future__ import annotations

import os
import sys

import numpy as np

MAX_SHOWN = 4


def _line() -> str:
    """' (file.py:LINE)' of the kernel code that gave the hint: the frame that called the
    interpreter's _set_attr, two up from the handle's set_attr."""
    try:
        frame = sys._getframe(3)
    except ValueError:
        return ""
    return f" ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})"


def multiple_of_problem(data: np.ndarray, values: list, is_pointer: bool) -> str | None:
    if data.size == 0 or not (is_pointer or np.issubdtype(data.dtype, np.integer)):
        return None
    first = int(data.flat[0])
    for d in values:
        if isinstance(d, int) and d > 0 and first % d:
            what = "the address" if is_pointer else "the value"
            return f"tl.multiple_of(..., {d}) is given {what} {first}, not a multiple of {d}"
    return None


def constancy_problem(data: np.ndarray, values: list) -> str | None:
    if data.ndim == 0 or data.size == 0:
        return None
    for axis, c in enumerate(values[:data.ndim]):
        n = data.shape[axis]
        if not isinstance(c, int) or c <= 1 or n < c:
            continue
        runs = np.moveaxis(data, axis, -1)[..., : n - n % c].reshape(*np.moveaxis(data, axis, -1).shape[:-1], -1, c)
        broken = np.argwhere(np.any(runs != runs[..., :1], axis=-1))
        if broken.size:
            shown = ", ".join(str(v) for v in runs[tuple(broken[0])].ravel()[:MAX_SHOWN])
            return (f"tl.max_constancy(..., {c}) is given a run along dim {axis} that is not constant "
                    f"({shown}{', ...' if c > MAX_SHOWN else ''})")
    return None


def install(monitor) -> None:
    """Wrap the interpreter's TensorHandle.set_attr, once per process (a no-op without the interpreter)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    handle = interpreter.TensorHandle
    original = handle.set_attr
    if getattr(original, "compiler_hints", False):
        return

    def set_attr(self, key, value):
        orders = getattr(monitor, "orders", None)
        if orders is not None and orders.compare and key in ("tt.divisibility", "tt.constancy"):
            values = list(value) if isinstance(value, (list, tuple)) else [value]
            data = np.asarray(self.data)
            if key == "tt.divisibility":
                problem = multiple_of_problem(data, values, bool(getattr(self.dtype, "is_ptr", lambda: False)()))
            else:
                problem = constancy_problem(data, values)
            where = f"false compiler hint in {monitor.kernel_name}{_line()}: "
            if problem and len(orders.findings) < 8 and not any(f.startswith(where) for f in orders.findings):
                orders.findings.append(  # once per hint and call: every program gives it again
                    f"{where}{problem}; a GPU compiles aligned "
                    "vector accesses (or one load for a run) from a hint and computes wrong where it is false: "
                    "give a hint only where it holds for every value the kernel is launched with")
        return original(self, key, value)

    set_attr.compiler_hints = True
    set_attr.__wrapped__ = original
    handle.set_attr = set_attr
