"""Which programs of one interpreted launch touch memory another program of it writes.

Programs can only depend on each other through memory: if no program reads or writes an address
that a different program of the same launch writes, each program sees only what was there before
the launch and what it wrote itself, and the launch ends with the same bytes whatever order its
programs ran in. So the judge records every address a checked launch's programs access (the
interpreter's four memory primitives: masked loads and stores, which every load, store and tensor
descriptor goes through, and the two atomics) and runs the launch a second time, in another order,
only where some address is shared that way (harness/correctness/program_order.py).

Where they share one, running the other order shows a dependence only if the bytes come out
different; a plain read of what another program of the launch writes is a race on a GPU even when
every sequential order gives the same bytes (a counter kept with a plain load and store and used as
a ticket, a flag stored without an atomic). So `first_unordered_read` names such a read unless an
atomic orders the two programs: the writer takes one after its write and the reader one before its
read, as a ticket whose last holder sums every program's partials does (Triton's atomics are
acq_rel by default; a relaxed one is refused where the target compiles it: harness/compiling/
ir_rules.py).

Addresses are compared in units of the smallest element the launch accessed; an access wider than a
unit, or not aligned to one, covers every unit it overlaps, so a shared byte is never missed (an
access that only shares a unit's other bytes at worst costs a second run, never a miss).

Within one program the interpreter runs a block's lanes as one numpy operation, so a load sees
every lane's earlier store; on a GPU the lanes are spread over the program's threads, and a thread
sees another thread's store only after a barrier between the two (`tl.debug_barrier()`). So
`first_lane_race` names an address one program both stores and reads with a plain load, at
different places of their blocks (another element position, or a block of another shape: another
thread, as far as the interpreter can tell), with no barrier between the two accesses, in either
order (a store after the load may land before it). A program that reads back what the same lanes
stored, or only after a barrier, passes. A scalar atomic counts as a barrier: Triton passes its
result to every thread of the program through shared memory behind one (a ticket's last holder
reads every partial, its own among them, after it). Where that result is never used the compiler
leaves the barrier out, and a block of one element has none; the interpreter holds either as it
holds a scalar: such atomics are taken as barriers too.
"""
from __future__ import annotations

import numpy as np


class SharedAccesses:
    """The accesses of one launch, in the order its programs ran them."""

    def __init__(self):
        self._program = -1  # the program running now (its place in the run)
        self._epoch = 0  # the barriers the running program has passed
        self._chunks: list[tuple[np.ndarray, int, int, bool]] = []  # (addresses, program, bytes, write)
        self._atomic: list[bool] = []  # per chunk: an atomic's
        self._lanes: list[tuple[np.ndarray, int]] = []  # per chunk: each address's lane (see _lane), barrier epoch
        self._shapes: dict[tuple, int] = {}  # a block shape's number, for the lanes

    @property
    def program(self) -> int:
        return self._program

    @program.setter
    def program(self, place: int) -> None:
        self._program, self._epoch = place, 0

    def barrier(self) -> None:
        """The running program passed a tl.debug_barrier(): its threads' earlier accesses are
        ordered before its later ones."""
        self._epoch += 1

    def access(self, ptrs, mask, write: bool, atomic: bool = False) -> None:
        """A memory primitive's pointers (a TensorHandle) and mask (TensorHandle, or None: every lane)."""
        addresses = np.asarray(ptrs.data, dtype=np.uint64).ravel()
        shape = np.shape(ptrs.data)
        lanes = np.arange(addresses.size, dtype=np.int64)
        if mask is not None:
            kept = np.broadcast_to(np.asarray(mask.data, dtype=bool), shape).ravel()
            addresses, lanes = addresses[kept], lanes[kept]
        if addresses.size:
            element = getattr(ptrs.get_element_ty(), "primitive_bitwidth", 8)
            self._chunks.append((addresses, self._program, max(1, element // 8), write))
            self._atomic.append(atomic)
            self._lanes.append((lanes + (self._shapes.setdefault(shape, len(self._shapes)) << 32), self._epoch))
        if atomic and int(np.prod(shape)) == 1:
            # a scalar atomic (the interpreter holds a scalar as one element) hands its result to
            # every thread of the program through shared memory and a barrier (Triton's lowering,
            # where the result is used): a barrier after it
            self._epoch += 1

    def first_unordered_read(self) -> tuple[int, int, int] | None:
        """(address, a program that writes it, another program that reads it with a plain load) where
        no atomic orders the two (the writer's after its write, the reader's before its read); None
        when every such read is ordered. Call only where first_shared() found a shared address."""
        atomic_at = [i for i, a in enumerate(self._atomic) if a]
        first_atomic: dict[int, int] = {}
        last_atomic: dict[int, int] = {}
        for i in atomic_at:
            program = self._chunks[i][1]
            first_atomic.setdefault(program, i)
            last_atomic[program] = i
        writes = [(c[0], c[1], c[2], i) for i, c in enumerate(self._chunks) if c[3]]
        reads = [(c[0], c[1], c[2], i) for i, c in enumerate(self._chunks) if not c[3] and not self._atomic[i]]
        if not writes or not reads:
            return None
        unit = min(c[2] for c in self._chunks)
        # a write some atomic of its program releases after it; a read some atomic of its program acquires before it
        released = [last_atomic.get(w[1], -1) > w[3] for w in writes]
        acquired = [first_atomic.get(r[1], len(self._chunks)) < r[3] for r in reads]
        w_units, w_programs = _units([w[:3] for w in writes], unit)
        w_free = np.repeat(np.array(released), _unit_counts([w[:3] for w in writes], unit))
        r_units, r_programs = _units([r[:3] for r in reads], unit)
        r_free = np.repeat(np.array(acquired), _unit_counts([r[:3] for r in reads], unit))
        # an unreleased write against every read, and every write against an unacquired read
        for (wu, wp), (ru, rp) in (((w_units[~w_free], w_programs[~w_free]), (r_units, r_programs)),
                                   ((w_units, w_programs), (r_units[~r_free], r_programs[~r_free]))):
            found = _other_program(wu, wp, ru, rp)
            if found is not None:
                return found[0] * unit, found[1], found[2]
        return None

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


    def first_lane_race(self) -> tuple[int, int] | None:
        """(address, program) where one program stores and plain-loads one address at different lanes
        (another element position, or a block of another shape) with no barrier between; or None."""
        plain = [i for i, a in enumerate(self._atomic) if not a]
        if not any(self._chunks[i][3] for i in plain) or all(self._chunks[i][3] for i in plain):
            return None
        # only stores and loads whose address spans meet one of the other kind's: most launches
        # load one buffer and store another, and end here
        spans = np.array([(int(self._chunks[i][0].min()), int(self._chunks[i][0].max()) + self._chunks[i][2])
                          for i in plain], dtype=np.int64)
        stores = np.array([self._chunks[i][3] for i in plain])
        meets = np.zeros(len(plain), dtype=bool)
        meets[stores] = _meets(spans[stores], spans[~stores])
        meets[~stores] = _meets(spans[~stores], spans[stores])
        plain = [i for i, m in zip(plain, meets) if m]
        if not plain:
            return None
        chunks = [self._chunks[i] for i in plain]
        unit = min(c[2] for c in self._chunks)
        units, programs = _units(chunks, unit)
        per_access = _element_counts(chunks, unit)

        def spread(values):  # per access -> per unit, as _units spreads them
            return values if np.all(per_access == 1) else np.repeat(values, per_access)

        lanes = spread(np.concatenate([self._lanes[i][0] for i in plain]))
        epochs = spread(np.concatenate([np.full(c[0].size, self._lanes[i][1], dtype=np.int64)
                                        for i, c in zip(plain, chunks)]))
        writes = spread(np.concatenate([np.full(c[0].size, c[3]) for c in chunks]))
        both = np.isin(units, units[writes]) & np.isin(units, units[~writes])  # units stored and loaded
        if not both.any():
            return None
        units, programs, epochs, lanes, writes = (a[both] for a in (units, programs, epochs, lanes, writes))
        order = np.lexsort((units, epochs, programs))
        units, programs, epochs, lanes, writes = (a[order] for a in (units, programs, epochs, lanes, writes))
        starts = np.flatnonzero(np.r_[True, (units[1:] != units[:-1]) | (epochs[1:] != epochs[:-1])
                                      | (programs[1:] != programs[:-1])])
        written = np.maximum.reduceat(writes, starts)
        read = ~np.minimum.reduceat(writes, starts)
        mixed = np.minimum.reduceat(lanes, starts) != np.maximum.reduceat(lanes, starts)
        hit = np.flatnonzero(written & read & mixed)
        if not hit.size:
            return None
        i = starts[hit[0]]
        return int(units[i]) * unit, int(programs[i])


def _meets(spans: np.ndarray, others: np.ndarray) -> np.ndarray:
    """Per [start, end) span of `spans`: whether it overlaps any span of `others`."""
    if not others.size or not spans.size:
        return np.zeros(len(spans), dtype=bool)
    order = np.argsort(others[:, 0], kind="stable")
    starts, furthest = others[order, 0], np.maximum.accumulate(others[order, 1])
    last = np.searchsorted(starts, spans[:, 1], side="left") - 1  # the last other span starting before the end
    return (last >= 0) & (furthest[np.maximum(last, 0)] > spans[:, 0])


def _other_program(w_units, w_programs, r_units, r_programs) -> tuple[int, int, int] | None:
    """(unit, writer, reader) of the first read unit that a different program writes, or None."""
    if not w_units.size or not r_units.size:
        return None
    order = np.argsort(w_units, kind="stable")
    w_units, w_programs = w_units[order], w_programs[order]
    starts = np.flatnonzero(np.r_[True, w_units[1:] != w_units[:-1]])
    keys = w_units[starts]
    lowest, highest = np.minimum.reduceat(w_programs, starts), np.maximum.reduceat(w_programs, starts)
    at = np.minimum(np.searchsorted(keys, r_units), keys.size - 1)
    hit = np.flatnonzero((keys[at] == r_units) & ((lowest[at] != r_programs) | (highest[at] != r_programs)))
    if not hit.size:
        return None
    i = hit[0]
    writer = int(lowest[at[i]]) if int(lowest[at[i]]) != int(r_programs[i]) else int(highest[at[i]])
    return int(r_units[i]), writer, int(r_programs[i])


def _element_counts(chunks: list, unit: int) -> np.ndarray:
    """How many units (see _units) each access of every chunk overlaps, in _units' order."""
    addresses = np.concatenate([c[0] for c in chunks])
    sizes = np.concatenate([np.full(c[0].size, c[2], dtype=np.uint64) for c in chunks])
    first = addresses // np.uint64(unit)
    return ((addresses + sizes - np.uint64(1)) // np.uint64(unit) - first + np.uint64(1)).astype(np.int64)


def _unit_counts(chunks: list, unit: int) -> np.ndarray:
    """How many units (see _units) each chunk's accesses cover, in total per chunk."""
    out = []
    for addresses, _, size, *_ in chunks:
        first = addresses // np.uint64(unit)
        out.append(int(((addresses + np.uint64(size) - np.uint64(1)) // np.uint64(unit) - first + np.uint64(1)).sum()))
    return np.array(out, dtype=np.int64)


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
