"""A judged Triton launch run as a GPU may run it: its programs in an order nobody promised.

A GPU runs the programs of one launch concurrently, in no promised order; the Triton interpreter
runs them one after another in id order (its GridExecutor loops over x, y, z). A launch whose
programs read what other programs of the same launch wrote (a running sum carried from program to
program, a flag program 0 sets) is right under the interpreter and wrong on a GPU. So in the
judge's worker (`ProgramOrders`, set on the launch monitor before the candidate is imported):

- every interpreted launch runs its programs in a secret order: reversed, or shuffled, drawn per
  launch by a generator seeded from a secret the worker drew before the import, held here where no
  kernel can reach it (the timed calls too, which run once);
- a checked call's launch (`compared()`: the stages' calls) runs in its secret order with every
  memory access recorded (harness/correctness/shared_accesses.py). Where some program touches an
  address another program of the launch writes, the launch runs again, every byte it was handed put
  back as it was, in id order, and every byte of every tensor passed to it must come out the same;
  a difference is a dependence between its programs, recorded with the launch, the argument, the
  byte and the shared address (the worker fails the case with it). Where no program touches what
  another writes, no program can see another's work: the two orders would agree by construction,
  and the second run is not made;
- the same record names a race between the lanes of one program: one address touched at different
  places of its blocks with no tl.debug_barrier() (or acq_rel atomic) between, a plain store
  against a plain load or store, or an atomic against either (`SharedAccesses.first_lane_race`),
  which the interpreter, running a block as one numpy operation, would never show; and, first of
  the launch's findings, an access off its element's alignment, then a store whose lanes write
  different values to one address.

The comparison is bitwise, atomics included: a float atomic_add summed in another order gives other
bits, as it does from one GPU run to the next (which the determinism stage refuses too); integer
atomics, a max or a min, a counter whose last holder sums in a fixed order, give the same bits in
any order and pass. Memory a launch reaches only through an address passed as an integer is not put
back between the two runs. Cost: the record of a checked launch's accesses; a second run only where
programs share memory. Outside the judge (verify, an exported package) no orders are set and the
interpreter runs in id order, recording nothing.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable

import numpy as np

from .shared_accesses import SharedAccesses, distinct
from .unspecified import ATOMIC_LANES

MAX_FINDINGS = 8  # a call's findings kept: the first names the launch; the rest are the same story


class ProgramOrders:
    """The secret order of each launch's programs, and the findings of compared launches."""

    def __init__(self, seed: int):
        self._rng = np.random.default_rng(seed)
        self.compare = False  # set by compared(): a checked call's launches, compared across orders
        self.findings: list[str] = []
        self.atomics = 0  # atomic operations run in the launch in progress (its finding says so)
        self._mode = "id"
        self._permutation: np.ndarray | None = None
        self._dims = (1, 1, 1)
        self.last_order = "id order"
        self.accesses: SharedAccesses | None = None  # a compared launch's memory accesses, while it runs

    @contextmanager
    def compared(self):
        """Within: every interpreted launch runs in its secret order and, where its programs share
        memory, again in id order, the two compared bitwise."""
        was, self.compare = self.compare, True
        try:
            yield self
        finally:
            self.compare = was

    def lane_order(self, n: int) -> np.ndarray:
        """A secret order of n lanes, drawn anew at each call."""
        return self._rng.permutation(n)

    def take_findings(self) -> list[str]:
        found, self.findings = self.findings, []
        return found

    # -- the interpreter's grid, re-ordered (called from the hooks install_hooks puts in place) --
    def grid_dims(self, nx: int, ny: int, nz: int) -> None:
        """A launch's grid is set: draw the order its programs run in."""
        self._dims = (nx, ny, nz)
        n = nx * ny * nz
        self._permutation = None
        self.last_order = "id order"
        if self._mode == "id" or n < 2:
            return
        if self._rng.random() < 0.5:
            self._permutation, self.last_order = np.arange(n - 1, -1, -1), "reversed order"
            return
        perm = self._rng.permutation(n)
        if np.array_equal(perm, np.arange(n)):
            perm = perm[::-1].copy()
        self._permutation, self.last_order = perm, "a shuffled order"

    def program(self, x: int, y: int, z: int) -> tuple[int, int, int]:
        """The program that runs in the interpreter's (x, y, z)-th place."""
        if self._permutation is None:
            return x, y, z
        _, ny, nz = self._dims
        k = int(self._permutation[(x * ny + y) * nz + z])
        x, rest = divmod(k, ny * nz)
        return (x, *divmod(rest, nz))

    @contextmanager
    def _order(self, mode: str):
        was, self._mode = self._mode, mode
        try:
            yield
        finally:
            self._mode = was

    # -- one launch ----------------------------------------------------------------------------
    def run(self, launch: Callable[[], Any], kernel, args: tuple, kwargs: dict) -> Any:
        """Run `launch` (the interpreter's own run of this launch) as the judge runs it."""
        if not self.compare:
            with self._order("secret"):
                return launch()
        buffers = _storages(_arg_names(kernel, args, kwargs))
        before = [b.clone() for _, b in buffers]
        self.atomics, self.accesses = 0, SharedAccesses()
        accesses = self.accesses
        try:
            with self._order("secret"):
                result = launch()
            shared = accesses.first_shared()
            unordered = accesses.first_unordered_read() if shared is not None else None
        finally:
            self.accesses = None
        # first: on a GPU the launch stops there, whatever its programs share
        if accesses.misaligned is not None and len(self.findings) < MAX_FINDINGS:
            self.findings.append(_describe_misaligned(kernel, accesses.misaligned, buffers))
        if accesses.clashing is not None and len(self.findings) < MAX_FINDINGS:
            self.findings.append(_describe_clash(kernel, accesses.clashing, buffers))
        other, atomics = self.last_order, self.atomics
        if other == "id order" or shared is None:  # one program, or none reads what another writes
            if unordered is not None and len(self.findings) < MAX_FINDINGS:
                self.findings.append(_describe_race(kernel, unordered, buffers))
            self._lane_race(accesses, kernel, buffers)
            return result
        after = [b.clone() for _, b in buffers]
        for (_, b), saved in zip(buffers, before):
            b.copy_(saved)
        with self._order("id"):
            result = launch()
        for (names, b), theirs in zip(buffers, after):
            found = _first_difference(b, theirs)
            if found is not None and len(self.findings) < MAX_FINDINGS:
                self.findings.append(_describe(kernel, names, found, other, atomics, shared, buffers))
                break
        else:  # the same bytes in both orders: a read no atomic orders is still a race on a GPU
            if unordered is not None and len(self.findings) < MAX_FINDINGS:
                self.findings.append(_describe_race(kernel, unordered, buffers))
        self._lane_race(accesses, kernel, buffers)
        return result

    def _lane_race(self, accesses: SharedAccesses, kernel, buffers) -> None:
        """After the findings between programs (the first names the launch's deeper fault): one
        between the lanes of a program."""
        race = accesses.first_lane_race()
        if race is not None and len(self.findings) < MAX_FINDINGS:
            self.findings.append(_describe_lane_race(kernel, race, buffers))

    def program_started(self, place: int) -> None:
        if self.accesses is not None:
            self.accesses.program = place

    def barrier(self) -> None:
        if self.accesses is not None:
            self.accesses.barrier()


def install_hooks(monitor) -> None:
    """Route the interpreter's grid through the launch monitor, once per process: its set_grid_dim
    tells the monitor the launch's grid and draws the launch's order where `monitor.orders` is set,
    its set_grid_idx maps the loop's place to the program that runs, its atomics are counted."""
    from triton.runtime import interpreter
    builder = interpreter.InterpreterBuilder
    if getattr(builder.set_grid_idx, "program_order", False):
        return
    set_dim, set_idx = builder.set_grid_dim, builder.set_grid_idx
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas
    barrier = builder.create_barrier
    # whether the load or store being built is a scalar's (a pointer, not a block of them): the
    # builder sees a scalar as a block of one element, which a scalar is not on a GPU
    from triton.language.semantic import TritonSemantic
    scalar = {"now": False}

    def _scalar_aware(method):
        def wrapped(self, ptr, *rest, **named):
            ty = getattr(ptr, "type", None)
            element = getattr(ty, "element_ty", None)
            was, scalar["now"] = scalar["now"], ty is not None and not ty.is_block() \
                and not (element is not None and element.is_block())  # a block pointer's is a block
            try:
                return method(self, ptr, *rest, **named)
            finally:
                scalar["now"] = was
        wrapped.__wrapped__ = method
        return wrapped

    TritonSemantic.load, TritonSemantic.store = _scalar_aware(TritonSemantic.load), _scalar_aware(TritonSemantic.store)

    def set_grid_dim(self, nx, ny, nz):
        monitor.grid_dims = (nx, ny, nz)
        if monitor.orders is not None:
            monitor.orders.grid_dims(nx, ny, nz)
        return set_dim(self, nx, ny, nz)

    def set_grid_idx(self, x, y, z):
        monitor.program_place = (x, y, z)
        orders = monitor.orders
        if orders is None:
            return set_idx(self, x, y, z)
        orders.program_started((x * self.grid_dim[1] + y) * self.grid_dim[2] + z)
        return set_idx(self, *orders.program(x, y, z))

    def _seen(ptrs, mask, write: bool, atomic: bool = False, sem=None, values=None) -> None:
        working = monitor.working
        if write and working is not None and monitor.program_place not in working \
                and (mask is None or np.any(mask.data)):
            working.add(monitor.program_place)  # the grid's rule counts programs that do work
        orders = monitor.orders
        if orders is None:
            return
        orders.atomics += atomic
        if orders.accesses is not None:
            orders.accesses.access(ptrs, mask, write, atomic, str(sem).rsplit(".", 1)[-1] if atomic else "",
                                   scalar=scalar["now"] and not atomic, values=values)

    # the arguments read are the leading ones, the rest passed on as they came, by position or by
    # name (a tensor descriptor's load names its cache_policy): Triton 3.6's builder takes a cache
    # modifier and an eviction policy where later ones take a cache policy
    def create_masked_load(self, ptrs, mask, *rest, **named):
        _seen(ptrs, mask, False)
        return load(self, ptrs, mask, *rest, **named)

    def create_masked_store(self, ptrs, value, mask, *rest, **named):
        _seen(ptrs, mask, True, values=value)
        return store(self, ptrs, value, mask, *rest, **named)

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, *rest, **named):
        _seen(ptr, mask, True, atomic=True, sem=rest[0] if rest else named.get("sem"))
        order = _lane_order(monitor, ptr, mask)
        if order is None:
            return rmw(self, rmwOp, ptr, val, mask, *rest, **named)
        ptr, val, mask = (_permuted(h, order, ptr) for h in (ptr, val, mask))
        return _permuted(rmw(self, rmwOp, ptr, val, mask, *rest, **named), np.argsort(order), ptr)

    def create_atomic_cas(self, ptr, cmp, val, *rest, **named):  # (ptr, cmp, val, sem, scope)
        _seen(ptr, None, True, atomic=True, sem=rest[0] if rest else named.get("sem"))
        order = _lane_order(monitor, ptr, None)
        if order is None:
            return cas(self, ptr, cmp, val, *rest, **named)
        ptr, cmp, val = (_permuted(h, order, ptr) for h in (ptr, cmp, val))
        return _permuted(cas(self, ptr, cmp, val, *rest, **named), np.argsort(order), ptr)

    def create_barrier(self, *rest, **named):
        if monitor.orders is not None:
            monitor.orders.barrier()
        return barrier(self, *rest, **named)

    set_grid_idx.program_order = True
    builder.set_grid_dim, builder.set_grid_idx = set_grid_dim, set_grid_idx
    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
    builder.create_atomic_rmw, builder.create_atomic_cas = create_atomic_rmw, create_atomic_cas
    builder.create_barrier = create_barrier


def _lane_order(monitor, ptr, mask) -> np.ndarray | None:
    """Under the judge, the order an atomic's lanes run in where two of them aim at one address:
    drawn per call from the secret, as a GPU's threads reach one address in no promised order (a
    float add's bits, an exchange's last value, which lane's compare-and-swap matches, the old
    values each lane gets back follow it; a CAS loop that retries, an integer add or a max do not);
    None where every lane the mask leaves has its own address, or outside the judge."""
    orders = monitor.orders
    if orders is None:
        return None
    lanes = np.asarray(ptr.data).ravel()
    active = lanes if mask is None else lanes[np.broadcast_to(np.asarray(mask.data, dtype=bool), np.shape(ptr.data)).ravel()]
    if distinct(active):
        return None
    if monitor.unspecified is not None:  # a failing case says so
        monitor.unspecified.used(ATOMIC_LANES, 1)
    return orders.lane_order(lanes.size)


def _permuted(handle, order: np.ndarray, like):
    """A TensorHandle's lanes in `order` (a mask or value broadcast to the pointers' shape first)."""
    if handle is None:
        return None
    from triton.runtime.interpreter import TensorHandle
    shape = np.shape(like.data)
    data = np.broadcast_to(np.asarray(handle.data), shape).ravel()[order].reshape(shape)
    return TensorHandle(data, handle.dtype)


def _arg_names(kernel, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    names = list(getattr(kernel, "arg_names", None) or [])
    named = [(names[i] if i < len(names) else f"argument {i}", a) for i, a in enumerate(args)]
    return named + list(kwargs.items())


def _tensors(value, depth: int = 0):
    """The torch tensors a launch argument hands the kernel: itself, a tuple's, a descriptor's base."""
    import torch
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)) and depth < 4:
        for v in value:
            yield from _tensors(v, depth + 1)
    elif isinstance(getattr(value, "base", None), torch.Tensor):  # a TensorDescriptor, a TensorWrapper
        yield value.base


def _storages(named: list[tuple[str, Any]]) -> list[tuple[list[str], Any]]:
    """Each distinct storage the launch can reach, as one byte tensor over all of it, with the names
    of the arguments that reach it."""
    import torch
    found: dict[int, tuple[list[str], Any]] = {}
    for name, value in named:
        for t in _tensors(value):
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key not in found:
                found[key] = ([], torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage))
            found[key][0].append(f"{name} ({str(t.dtype).replace('torch.', '')})")
    return list(found.values())


def _first_difference(now, theirs) -> int | None:
    """The first byte offset where two byte tensors differ, or None."""
    a, b = now.cpu().numpy(), theirs.cpu().numpy()
    if np.array_equal(a, b):
        return None
    return int(np.flatnonzero(a != b)[0])


def _describe(kernel, names: list[str], offset: int, other: str, atomics: int, shared, buffers) -> str:
    name = _kernel_name(kernel)
    address, writer, other_program = shared
    text = (f"program order: the launch of {name} wrote different bytes when its programs ran in {other} "
            f"than in id order (in {', '.join(names[:3])}, byte {offset} of its storage; "
            f"{_where(address, buffers)} is written by one of its programs and read or written by another): "
            "its programs depend on each other, which a GPU, running them concurrently in no promised order, "
            "does not allow; one launch's programs may not read what another program of it writes")
    if atomics:
        text += (f" (it ran {atomics} atomic operation(s): a float atomic_add sums in whatever order programs "
                 "run, so its bits change from run to run on a GPU too; reduce in a fixed order, e.g. partial "
                 "sums per program and a second kernel)")
    return text


def _describe_race(kernel, unordered, buffers) -> str:
    name = _kernel_name(kernel)
    return (f"program order: in the launch of {name}, {_where(unordered[0], buffers)} is written by one of its "
            "programs and read by another with a plain load, and no atomic orders the two (the writer's after "
            "its write, with release semantics; the reader's before its read, with acquire semantics; the "
            "default acq_rel has both): on a GPU the programs run concurrently and the read "
            "may see the value before or after the write, whatever order the interpreter ran them in (a "
            "counter kept with tl.load and tl.store, a flag stored without an atomic); take a ticket with "
            "tl.atomic_add after the writes and read the others' results only as its last holder, or pass "
            "results through a second launch")


def _describe_lane_race(kernel, race, buffers) -> str:
    name = _kernel_name(kernel)
    return (f"lane order: in the launch of {name}, one of its programs touches {_where(race[0], buffers)} at two "
            "places of its blocks (another element position, or a block of another shape), a store against a load "
            "or another store, or an atomic against either, with no tl.debug_barrier() between: on a GPU a program's lanes are spread "
            "over its threads, and one thread may read before another's store lands (or after a store meant to "
            "follow the read); the interpreter runs a block as one operation and cannot show it. Put "
            "tl.debug_barrier() between the two, or keep the exchange in registers (tl.sum, tl.max, a reshape)")


def _describe_clash(kernel, clashing, buffers) -> str:
    address, _, lanes = clashing
    return (f"lane order: in the launch of {_kernel_name(kernel)}, one store of one of its programs writes "
            f"different values to {_where(address, buffers)} from {lanes} of its lanes: on a GPU those lanes are "
            "different threads and any of them may land last, where the interpreter keeps the last lane's. "
            "Store each address from one lane (mask the others off), or reduce the values first "
            "(tl.sum, tl.max) and store the result")


def _describe_misaligned(kernel, misaligned, buffers) -> str:
    address, _, width, write = misaligned
    return (f"misaligned address: in the launch of {_kernel_name(kernel)}, one of its programs "
            f"{'stores' if write else 'loads'} a {width}-byte element at {_where(address, buffers)}, which is not "
            f"a multiple of {width}: on a GPU every load, store and atomic must be aligned to its element's size, "
            "and this one stops the kernel with a misaligned-address error (the interpreter reads any byte). "
            "Point an element type's pointer only at offsets that are multiples of its size")


def _kernel_name(kernel) -> str:
    """A launched kernel's name: a JITFunction's own, or that of the function it wraps (an autotuner)."""
    return getattr(kernel, "__name__", None) or getattr(getattr(kernel, "fn", None), "__name__", "?")


def _where(address: int, buffers) -> str:
    """An address in words: the argument whose storage holds it, and the byte there."""
    for names, b in buffers:
        start = b.data_ptr()
        if start <= address < start + b.numel():
            return f"byte {address - start} of {names[0].split(' ')[0]}"
    return "an address outside the launch's arguments"
