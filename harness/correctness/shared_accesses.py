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
`first_lane_race` names an address one program touches at two different places of its blocks
(another element position, or a block of another shape: another thread, as far as the interpreter
can tell), with no barrier between, where one access is a plain store and the other a plain load
or store (in either order: a store after a load may land before it), or one is an atomic and the
other plain. A scalar is held by every thread of the program and stored by one of them, so a load
of a scalar the program stored is another thread's read (the hooks tell a scalar's access from a
block's at Triton's language level: the interpreter's builder holds a scalar as a block of one
element). A block smaller than the program's threads is held by several threads too, and reading
back its own store is the same race where a copy's value is used beyond its lane, but harmless
where the copies only feed the owner's next store (the add+RMSNorm backward's running partials at
a width of one): the accesses are the same, so a block's elements are one lane each.
On a GPU every load, store and atomic must be aligned to its element's size (PTX requires
natural alignment; a misaligned one stops the kernel), where the interpreter reads any byte:
`misaligned` keeps the first access off its alignment. Lanes of one plain store that write
different bytes to one address are different threads on a GPU, any of which may land last, where
numpy's scatter keeps the last lane's: `clashing` keeps the first such store (the same bytes from
several lanes, a broadcast value, are one store's worth).
Atomics order the program's threads as Triton compiles them: an acq_rel one (the default) has a
barrier before and after it, a release one before, an acquire one after. A
program that reads back what the same lanes of a full block stored, or only across a barrier,
passes.
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
        # per chunk: (it releases the writes before it, it acquires for the reads after it), by its sem
        self._sync: list[tuple[bool, bool]] = []
        self._lanes: list[tuple[np.ndarray, int]] = []  # per chunk: each address's lane (see access), barrier epoch
        self._shapes: dict[tuple, int] = {}  # a block shape's number, for the lanes
        self._spans_of: tuple[int, np.ndarray] | None = None  # (chunks then, their spans): both checks read them
        # the first access off its element's alignment: (address, program, element bytes, a write)
        self.misaligned: tuple[int, int, int, bool] | None = None
        # the first store whose lanes write different values to one address: (address, program, lanes)
        self.clashing: tuple[int, int, int] | None = None

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

    def access(self, ptrs, mask, write: bool, atomic: bool = False, sem: str = "", scalar: bool = False,
               values=None) -> None:
        """A memory primitive's pointers (a TensorHandle) and mask (TensorHandle, or None: every lane);
        an atomic's memory semantic by name (ACQUIRE_RELEASE, RELEASE, ACQUIRE, RELAXED); `scalar`: a
        scalar's load or store (every thread holds it, one stores it), not a block's; `values`: a
        plain store's (TensorHandle), whose lanes may not store different bytes to one address."""
        if atomic and sem.endswith("RELEASE"):  # acq_rel or release: a barrier before it
            self._epoch += 1
        addresses = np.asarray(ptrs.data, dtype=np.uint64).ravel()
        shape = np.shape(ptrs.data)
        if scalar:  # a lane of its own, unlike any other access's: its store and its loads are other threads'
            lanes = np.full(addresses.size, -1 - len(self._chunks), dtype=np.int64)
        else:
            lanes = np.arange(addresses.size, dtype=np.int64) + (self._shapes.setdefault(shape, len(self._shapes)) << 32)
        if mask is not None:
            kept = np.broadcast_to(np.asarray(mask.data, dtype=bool), shape).ravel()
            addresses, lanes = addresses[kept], lanes[kept]
        if addresses.size:
            element = getattr(ptrs.get_element_ty(), "primitive_bitwidth", 8)
            width = max(1, element // 8)
            if width > 1 and self.misaligned is None:
                off = np.flatnonzero(addresses % np.uint64(width))
                if off.size:
                    self.misaligned = (int(addresses[off[0]]), self._program, width, write)
            if values is not None and self.clashing is None and addresses.size > 1:
                self.clashing = _clash(addresses, values, shape, kept if mask is not None else None, self._program)
            self._chunks.append((addresses, self._program, width, write))
            self._atomic.append(atomic)
            self._sync.append((atomic and sem.endswith("RELEASE"), atomic and sem.startswith("ACQUIRE")))
            self._lanes.append((lanes, self._epoch))
        if atomic and sem.startswith("ACQUIRE"):  # acq_rel or acquire: a barrier after it
            self._epoch += 1

    def _spans(self) -> np.ndarray:
        """Each chunk's [first byte, last byte + 1), as int64 rows."""
        if self._spans_of is None or self._spans_of[0] != len(self._chunks):
            chunks = self._chunks
            starts = _starts(chunks)
            addresses = np.concatenate([c[0] for c in chunks]).astype(np.int64)
            low, high = np.minimum.reduceat(addresses, starts), np.maximum.reduceat(addresses, starts)
            widths = np.fromiter((c[2] for c in chunks), dtype=np.int64, count=len(chunks))
            self._spans_of = (len(chunks), np.stack([low, high + widths], axis=1))
        return self._spans_of[1]

    def first_unordered_read(self) -> tuple[int, int, int] | None:
        """(address, a program that writes it, another program that reads it with a plain load) where
        no atomic orders the two (the writer's after its write with release semantics, the reader's
        before its read with acquire semantics: sem="acquire" alone releases nothing, as sm_90 puts
        no barrier before it, and sem="release" acquires nothing); None when every such read is
        ordered. Call only where first_shared() found a shared address."""
        first_atomic: dict[int, int] = {}  # per program: its first acquiring atomic
        last_atomic: dict[int, int] = {}  # per program: its last releasing atomic
        for i, (releases, acquires) in enumerate(self._sync):
            program = self._chunks[i][1]
            if acquires:
                first_atomic.setdefault(program, i)
            if releases:
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
        if not any(c[3] for c in self._chunks):
            return None
        # two programs share an address only where two accesses' spans meet: most launches read one
        # buffer and write another, a row or a tile each, and end here
        meets = _meets_another(self._spans())
        chunks = [c for c, met in zip(self._chunks, meets) if met]
        writes = [c for c in chunks if c[3]]
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
        reads = [c for c in chunks if not c[3]]
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
        """(address, program) where one program touches one address at two different lanes (another
        element position, a block of another shape, a scalar) with no barrier between, one access a
        plain store and the other plain, or one an atomic and the other plain; or None."""
        if not any(c[3] for c in self._chunks):
            return None
        # only accesses whose address spans meet another's: most launches load one buffer and store
        # another, and end here
        kept = [int(i) for i in np.flatnonzero(_meets_another(self._spans()))]
        if not any(self._chunks[i][3] for i in kept):
            return None
        chunks = [self._chunks[i] for i in kept]
        unit = min(c[2] for c in self._chunks)
        per_access = _element_counts(chunks, unit)
        units, programs = _units(chunks, unit, per_access)

        def spread(values):  # per access -> per unit, as _units spreads them
            return values if np.all(per_access == 1) else np.repeat(values, per_access)

        def each(value):  # one value per chunk, spread over its accesses
            return spread(_per_access(chunks, (value(i) for i in kept), np.int64))

        lanes = spread(np.concatenate([self._lanes[i][0] for i in kept]))
        epochs = each(lambda i: self._lanes[i][1])
        kinds = each(lambda i: 2 if self._atomic[i] else int(self._chunks[i][3]))  # 0 load, 1 store, 2 atomic
        sources = each(lambda i: i)
        order = np.lexsort((units, epochs, programs))
        units, programs, epochs, lanes, kinds, sources = (
            a[order] for a in (units, programs, epochs, lanes, kinds, sources))
        starts = np.flatnonzero(np.r_[True, (units[1:] != units[:-1]) | (epochs[1:] != epochs[:-1])
                                      | (programs[1:] != programs[:-1])])
        top, bottom = np.iinfo(np.int64).max, np.iinfo(np.int64).min

        def low(values, where):
            return np.minimum.reduceat(np.where(where, values, top), starts)

        def high(values, where):
            return np.maximum.reduceat(np.where(where, values, bottom), starts)

        load, store, atomic = kinds == 0, kinds == 1, kinds == 2
        plain = load | store
        has_load, has_store, has_atomic = (high(kinds, k) > bottom for k in (load, store, atomic))

        def mixed(where):  # the group's accesses of that kind are at more than one lane
            return low(lanes, where) != high(lanes, where)

        race = has_load & has_store & mixed(plain)  # a load against a store
        race |= has_store & mixed(store) & (low(sources, store) != high(sources, store))  # two stores
        race |= has_atomic & (has_load | has_store) & mixed(atomic | plain)  # an atomic against either
        hit = np.flatnonzero(race)
        if not hit.size:
            return None
        i = starts[hit[0]]
        return int(units[i]) * unit, int(programs[i])


def _meets_another(spans: np.ndarray) -> np.ndarray:
    """Per [start, end) span: whether it overlaps another span of `spans`."""
    order = np.argsort(spans[:, 0], kind="stable")
    starts, ends = spans[order, 0], spans[order, 1]
    furthest = np.maximum.accumulate(ends)
    found = np.zeros(len(spans), dtype=bool)
    found[1:] |= starts[1:] < furthest[:-1]  # an earlier span reaches past this one's start
    found[:-1] |= ends[:-1] > starts[1:]  # this one reaches past the next one's start
    out = np.zeros(len(spans), dtype=bool)
    out[order] = found
    return out


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


def distinct(addresses: np.ndarray) -> bool:
    """Whether every address is its own (the usual access: each lane its own address, in order)."""
    return bool(np.all(addresses[1:] > addresses[:-1])) or np.unique(addresses).size == addresses.size


def _clash(addresses: np.ndarray, values, shape, kept, program: int) -> tuple[int, int, int] | None:
    """(address, program, lanes) where lanes of one store write different bytes to one address: on a
    GPU they are different threads and any may land last, where numpy's scatter keeps the last lane's.
    The same bytes from several lanes (a broadcast value) are one store's worth and pass."""
    if distinct(addresses):
        return None
    data = np.ascontiguousarray(np.broadcast_to(np.asarray(values.data), shape)).ravel()
    bits = data.view(np.dtype(f"u{data.dtype.itemsize}")) if data.dtype.itemsize in (1, 2, 4, 8) else data
    if kept is not None:
        bits = bits[kept]
    order = np.argsort(addresses, kind="stable")
    a, b = addresses[order], bits[order]
    same = np.flatnonzero(a[1:] == a[:-1])
    differ = same[b[same] != b[same + 1]]
    if not differ.size:
        return None
    address = a[differ[0]]
    return int(address), program, int(np.count_nonzero(addresses == address))


def _sizes(chunks: list) -> np.ndarray:
    """How many accesses each chunk holds."""
    return np.fromiter((c[0].size for c in chunks), dtype=np.int64, count=len(chunks))


def _starts(chunks: list) -> np.ndarray:
    """Where each chunk's accesses begin among all of them, in order."""
    sizes = _sizes(chunks)
    return np.cumsum(sizes) - sizes


def _per_access(chunks: list, values, dtype) -> np.ndarray:
    """One value per chunk (its program, its element size) repeated for each of its accesses."""
    return np.repeat(np.fromiter(values, dtype=dtype, count=len(chunks)), _sizes(chunks))


def _element_counts(chunks: list, unit: int) -> np.ndarray:
    """How many units (see _units) each access of every chunk overlaps, in _units' order."""
    addresses = np.concatenate([c[0] for c in chunks])
    sizes = _per_access(chunks, (c[2] for c in chunks), np.uint64)
    first = addresses // np.uint64(unit)
    return ((addresses + sizes - np.uint64(1)) // np.uint64(unit) - first + np.uint64(1)).astype(np.int64)


def _unit_counts(chunks: list, unit: int) -> np.ndarray:
    """How many units (see _units) each chunk's accesses cover, in total per chunk."""
    return np.add.reduceat(_element_counts(chunks, unit), _starts(chunks))


def _units(chunks: list, unit: int, count: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(unit index, program) of every unit each access overlaps; `count`: _element_counts', where
    the caller has it."""
    addresses = np.concatenate([c[0] for c in chunks])
    programs = _per_access(chunks, (c[1] for c in chunks), np.int64)
    first = addresses // np.uint64(unit)
    count = _element_counts(chunks, unit) if count is None else count
    if np.all(count == 1):
        return first, programs
    # an access over several units: one entry per unit it overlaps
    starts = np.repeat(np.cumsum(count) - count, count)
    offsets = np.arange(int(count.sum()), dtype=np.int64) - starts
    return np.repeat(first, count) + offsets.astype(np.uint64), np.repeat(programs, count)
