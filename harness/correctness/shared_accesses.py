"""Which programs of one interpreted launch touch memory another program of it writes.

Programs can only depend on each other through memory: if no program reads or writes an address
that a different program of the same launch writes, each program sees only what was there before
the launch and what it wrote itself, and the launch ends with the same bytes whatever order its
programs ran in. So the judge records every address a checked launch's programs access (the
interpreter's four memory primitives: masked loads and stores, which every load, store and tensor
descriptor goes through, and the two atomics) and runs the launch a second time, in another order,
only where some address is shared that way (harness/correctness/program_order.py).

Addresses are compared in units of the smallest element the launch accessed; an access wider than a
unit, or not aligned to one, covers every unit it overlaps, so a shared byte is never missed (an
access that only shares a unit's other bytes at worst costs a second run, never a miss).
"""
from __future__ import annotations

import numpy as np


class SharedAccesses:
    """The accesses of one launch, in the order its programs ran them."""

    def __init__(self):
        self.program = -1  # the program running now (its place in the run)
        self._chunks: list[tuple[np.ndarray, int, int, bool]] = []  # (addresses, program, bytes, write)

    def access(self, ptrs, mask, write: bool) -> None:
        """A memory primitive's pointers (a TensorHandle) and mask (TensorHandle, or None: every lane)."""
        addresses = np.asarray(ptrs.data, dtype=np.uint64).ravel()
        if mask is not None:
            addresses = addresses[np.broadcast_to(np.asarray(mask.data, dtype=bool), ptrs.data.shape).ravel()]
        if addresses.size:
            element = getattr(ptrs.get_element_ty(), "primitive_bitwidth", 8)
            self._chunks.append((addresses, self.program, max(1, element // 8), write))

    def first_shared(self) -> tuple[int, int, int] | None:
        """(address, a program that writes it, another program that touches it), or None when no
        two programs share an address one of them writes."""
        writes = [c for c in self._chunks if c[3]]
        if not writes:
            return None
        unit = min(c[2] for c in self._chunks)
        w_units, w_programs = _units(writes, unit)
        order = np.argsort(w_units, kind="stable")
        w_units, w_programs = w_units[order], w_programs[order]
        same = np.flatnonzero((w_units[1:] == w_units[:-1]) & (w_programs[1:] != w_programs[:-1]))
        if same.size:  # two programs write one address
            i = same[0]
            return int(w_units[i]) * unit, int(w_programs[i]), int(w_programs[i + 1])
        reads = [c for c in self._chunks if not c[3]]
        if not reads:
            return None
        r_units, r_programs = _units(reads, unit)
        at = np.minimum(np.searchsorted(w_units, r_units), w_units.size - 1)
        shared = np.flatnonzero((w_units[at] == r_units) & (w_programs[at] != r_programs))
        if not shared.size:
            return None
        i = shared[0]
        return int(r_units[i]) * unit, int(w_programs[at[i]]), int(r_programs[i])


def _units(chunks: list, unit: int) -> tuple[np.ndarray, np.ndarray]:
    """(unit index, program) of every unit each access overlaps."""
    addresses = np.concatenate([c[0] for c in chunks])
    programs = np.concatenate([np.full(c[0].size, c[1], dtype=np.int64) for c in chunks])
    sizes = np.concatenate([np.full(c[0].size, c[2], dtype=np.uint64) for c in chunks])
    first = addresses // np.uint64(unit)
    count = ((addresses + sizes - np.uint64(1)) // np.uint64(unit) - first + np.uint64(1)).astype(np.int64)
    if np.all(count == 1):
        return first, programs
    # an access over several units: one entry per unit it overlaps
    starts = np.repeat(np.cumsum(count) - count, count)
    offsets = np.arange(int(count.sum()), dtype=np.int64) - starts
    return np.repeat(first, count) + offsets.astype(np.uint64), np.repeat(programs, count)
