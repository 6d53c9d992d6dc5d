"""Guard bytes around every buffer of a judged call, and the whole of each buffer compared after it.

A GPU kernel that stores one element past a row, or past its output, writes into whatever lies
there: in a model, the k beside a q sliced from one projection, the next tensor the allocator
handed out. The output can still be right, so comparing outputs never sees it, and comparing an
input's own elements does not either (the write is outside them). AddressSanitizer's answer is
redzones: guard bytes around each allocation, checked after the fact. The judge does the same:

- inputs (`place`): each input's whole storage (the wider buffer a view lives in included) is
  copied into the middle of a larger buffer with GUARD_BYTES of guard bytes on either side; the
  tensor the kernel gets has the very same shape, strides, storage offset and storage size, and
  its data pointer keeps its alignment (the guard is a multiple of a page). The whole buffer is
  snapshotted before the call and compared after it: a changed byte inside an input's elements is
  an in-place write; one outside them (in the wider buffer or a guard) a stray store, named by
  the tensor and its byte offset from the tensor's first element. Each buffer's sha256 after the
  call is recorded, and the judging process, which rebuilds the same buffers from the case's seed,
  holds it to the digest of the buffer it built: the worker's word is not taken.
- the buffers kernel_fn allocates (`Allocations`, in the op recorder: harness/correctness/
  integrity.py): every storage an allocation op makes during a checked call (torch.empty_like,
  new_empty, clone, a cast) is moved into the middle of a larger buffer the same way, guards
  filled with bytes drawn from the OS, and the guards are read after the call: a store past the
  output, or past a scratch buffer, is named with its offset. The tensor's metadata is unchanged
  (storage offset 0, its own size), so nothing a kernel may read tells the two apart. What
  torch.empty and its kin return holds what a GPU's caching allocator would hand back, a dead
  tensor's values (`leftovers`: finite, none 0), not the zeros a fresh CPU allocation gets from
  the OS, so a kernel that accumulates into an empty buffer, or leaves elements that should be 0
  unwritten, fails here as it would there.
The guard bytes of an input are seeded by the case (the judging process rebuilds them); a load
past an input's end reads them (random bits, NaN and Inf among them), so an unmasked read shows in
the output. The guards cost a copy of each buffer and a byte comparison per call; the digests a
sha256 over bytes that are already on the host in the CPU's cases.
"""
from __future__ import annotations

import contextlib
import hashlib
import os

import torch

GUARD_BYTES = 4096  # a page either side: a store a block past the end still lands in it
_sha256 = hashlib.sha256


def _bytes_of(storage: torch.UntypedStorage, device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),), (1,))


def _guard_fill(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed ^ 0x5EED6A4D),
                         dtype=torch.uint8)


def _region(big: torch.Tensor, n: int, like: torch.Tensor) -> torch.Tensor:
    """A tensor with `like`'s metadata over the n bytes in the middle of `big` (its own storage:
    storage offset and size as `like`'s; the slice keeps `big` alive)."""
    storage = big.untyped_storage()[GUARD_BYTES:GUARD_BYTES + n]
    return torch.empty(0, dtype=like.dtype, device=like.device).set_(
        storage, like.storage_offset(), like.shape, like.stride())


class Placed:
    """A call's inputs, each storage in the middle of a guarded buffer (`place`). `args`: the
    tensors to pass (non-tensors as given); `buffers`: the whole guarded buffers as bytes."""

    def __init__(self, args: list, buffers: list, owner: list[int], names: list[str]):
        self.args, self.buffers, self.owner, self.names = args, buffers, owner, names

    def snapshot(self) -> list[torch.Tensor]:
        return [b.clone() for b in self.buffers]

    def views(self, snapshot: list[torch.Tensor]) -> list:
        """The inputs as they were in `snapshot` (tensors over its bytes, with the inputs' metadata)."""
        return [_region(snapshot[o], a.untyped_storage().nbytes(), a) if o >= 0 else a
                for a, o in zip(self.args, self.owner)]

    def digests(self) -> list[str | None]:
        """sha256 of each input's whole buffer (guards included), None for a non-tensor."""
        per_buffer = [_sha256(b.detach().cpu().numpy().tobytes()).hexdigest() for b in self.buffers]
        return [per_buffer[o] if o >= 0 else None for o in self.owner]

    def writes(self, before: list[torch.Tensor]) -> list[dict]:
        """Every input whose buffer changed: {input, name, inside: bytes changed among its own
        elements, outside: bytes changed elsewhere in its buffer, first: where the first change
        outside lies ({offset, where}), or None}. Empty when nothing changed (one comparison)."""
        out = []
        for k, (now, then) in enumerate(zip(self.buffers, before)):
            if torch.equal(now, then):
                continue
            changed = torch.nonzero((now != then).cpu()).flatten()
            members = [i for i, o in enumerate(self.owner) if o == k]
            marks = {i: _element_bytes(self.args[i], now.numel()) for i in members}
            inside_any = torch.zeros(changed.numel(), dtype=torch.bool)
            for i in members:
                inside = marks[i][changed]
                inside_any |= inside
                out.append({"input": i, "name": self.names[i], "inside": int(inside.sum()), "outside": 0,
                            "first": None})
            stray = changed[~inside_any]
            if stray.numel():
                # named after the first input that lives in the buffer: the view the kernel was given
                entry = next(e for e in reversed(out) if e["input"] == members[0])
                entry["outside"] = int(stray.numel())
                entry["first"] = _where(int(stray[0]), self.args[members[0]], now.numel())
        return [e for e in out if e["inside"] or e["outside"]]


def _element_bytes(t: torch.Tensor, total: int) -> torch.Tensor:
    """A flag per byte of the guarded buffer: does it belong to one of t's elements."""
    size = t.element_size()
    marks = torch.zeros(total // size, dtype=torch.bool)
    if t.numel():
        marks.as_strided(t.shape, t.stride(), GUARD_BYTES // size + t.storage_offset()).fill_(True)
    return marks.repeat_interleave(size)


def _where(byte: int, t: torch.Tensor, total: int) -> dict:
    """Where a changed byte of t's buffer lies, as an offset from t's first element."""
    first = GUARD_BYTES + t.storage_offset() * t.element_size()
    end = total - GUARD_BYTES
    where = ("in the guard bytes before its storage" if byte < GUARD_BYTES else
             "in the guard bytes after its storage" if byte >= end else
             "in its storage outside its elements (the wider buffer it is a view of)")
    return {"offset": byte - first, "where": where}


def place(args: list, seed: int, names: list[str], inference: frozenset = frozenset()) -> Placed:
    """The inputs in guarded buffers: same values, shapes, strides and storage offsets; inputs
    that share a storage share one buffer. `inference`: the positions whose buffers are made
    under torch.inference_mode (a model's activations there are inference tensors)."""
    buffers: list[torch.Tensor] = []
    by_storage: dict[int, int] = {}
    placed, owner = [], []
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            placed.append(a)
            owner.append(-1)
            continue
        storage = a.untyped_storage()
        key = storage.data_ptr() if storage.nbytes() else -(i + 1)
        mode = torch.inference_mode() if i in inference else contextlib.nullcontext()
        with mode:
            if key not in by_storage:
                n = storage.nbytes()
                fill = _guard_fill(2 * GUARD_BYTES, seed + 7919 * len(buffers)).to(a.device)
                big = torch.empty(n + 2 * GUARD_BYTES, dtype=torch.uint8, device=a.device)
                big[:GUARD_BYTES] = fill[:GUARD_BYTES]
                big[GUARD_BYTES + n:] = fill[GUARD_BYTES:]
                big[GUARD_BYTES:GUARD_BYTES + n] = _bytes_of(storage, a.device)
                by_storage[key] = len(buffers)
                buffers.append(big)
            k = by_storage[key]
            placed.append(_region(buffers[k], storage.nbytes(), a))
        owner.append(k)
    return Placed(placed, buffers, owner, list(names))


def expected_digests(args: list, seed: int, names: list[str]) -> list[str | None]:
    """The digests a call that changed nothing leaves (the judging process's side)."""
    return place(args, seed, names).digests()


# ---------------------------------------------------------------- what kernel_fn allocates
_PATTERN: list[torch.Tensor] = []  # the guard bytes of allocations: drawn from the OS once, when first needed
# allocation ops whose result is a new storage (a view or an in-place op shares its input's)
ALLOCATING = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros",
                        "zeros_like", "new_zeros", "full", "full_like", "new_full", "ones", "ones_like",
                        "new_ones", "clone", "_to_copy", "scalar_tensor", "arange", "lift_fresh_copy"})


# ... and those whose memory is left as it was: on a GPU the caching allocator hands back a freed
# block with a dead tensor's values in it, where on the CPU a fresh large allocation is the OS's
# zeros, so a kernel that accumulates into torch.empty, or leaves elements that should be 0 unwritten,
# was right here and wrong there
UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
_LEFTOVERS: list[torch.Generator] = []  # seeded from the OS once, when first needed


def leftovers(n: int, dtype: torch.dtype) -> torch.Tensor:
    """n bytes as a dead tensor of `dtype` might have left them: finite values, none of them 0 (a
    float's in +-[1, 1000), an integer's any but 0, a bool's True), as uint8."""
    if not _LEFTOVERS:
        _LEFTOVERS.append(torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little")))
    gen, size = _LEFTOVERS[0], torch.empty(0, dtype=dtype).element_size()
    count = n // size
    if dtype.is_floating_point:
        top = min(1000.0, torch.finfo(dtype).max / 2)
        magnitude = torch.rand(count, generator=gen, dtype=torch.float64) * (top - 1.0) + 1.0
        sign = torch.randint(0, 2, (count,), generator=gen) * 2 - 1
        values = (magnitude * sign).to(dtype)
    elif dtype == torch.bool:
        values = torch.ones(count, dtype=torch.bool)
    elif dtype.is_complex or not (dtype.is_signed or dtype == torch.uint8):
        return torch.randint(1, 256, (n,), generator=gen, dtype=torch.uint8)
    else:
        values = torch.randint(1, 100, (count,), generator=gen).to(dtype)
    raw = values.view(torch.uint8)
    return torch.cat([raw, torch.ones(n - raw.numel(), dtype=torch.uint8)]) if raw.numel() < n else raw


def _pattern() -> torch.Tensor:
    if not _PATTERN:
        _PATTERN.append(torch.frombuffer(bytearray(os.urandom(2 * GUARD_BYTES)), dtype=torch.uint8))
    return _PATTERN[0]


class Allocations:
    """The buffers kernel_fn allocates in one call, each moved into a guarded buffer as it is made
    (`adopt`, from the op recorder), and their guards read after the call (`strays`)."""

    def __init__(self):
        self.made: list[tuple] = []  # (guarded buffer, its middle's bytes, what it was made as)

    def adopt(self, name: str, out):
        """`out` of allocation op `name`, moved into a guarded buffer (anything else as it is)."""
        if name not in ALLOCATING or not isinstance(out, torch.Tensor) or out.layout != torch.strided:
            return out
        n = out.untyped_storage().nbytes()
        if n == 0:
            return out
        pattern = _pattern().to(out.device)
        big = torch.empty(n + 2 * GUARD_BYTES, dtype=torch.uint8, device=out.device)
        big[:GUARD_BYTES] = pattern[:GUARD_BYTES]
        big[GUARD_BYTES + n:] = pattern[GUARD_BYTES:]
        big[GUARD_BYTES:GUARD_BYTES + n] = leftovers(n, out.dtype).to(out.device) if name in UNINITIALIZED \
            else _bytes_of(out.untyped_storage(), out.device)
        self.made.append((big, n, f"a {str(out.dtype).replace('torch.', '')} {list(out.shape)} tensor"))
        return _region(big, n, out)

    def strays(self, output) -> list[dict]:
        """A write into any allocation's guards: {tensor, offset (from its first byte), where, bytes}."""
        found = []
        out_ptr = output.untyped_storage().data_ptr() if isinstance(output, torch.Tensor) else None
        for big, n, made_as in self.made:
            pattern = _pattern().to(big.device)
            before, after = big[:GUARD_BYTES] != pattern[:GUARD_BYTES], big[GUARD_BYTES + n:] != pattern[GUARD_BYTES:]
            if not (bool(before.any()) or bool(after.any())):
                continue
            is_output = big.data_ptr() + GUARD_BYTES == out_ptr  # the output's storage, whatever view of it
            what = f"the output ({made_as} kernel_fn allocated)" if is_output else f"{made_as} kernel_fn allocated"
            if bool(after.any()):
                first = int(torch.nonzero(after.cpu()).flatten()[0])
                found.append({"tensor": what, "offset": n + first, "where": "past the end", "size": n,
                              "bytes": int(after.sum())})
            if bool(before.any()):
                last = int(torch.nonzero(before.cpu()).flatten()[-1])
                found.append({"tensor": what, "offset": last - GUARD_BYTES, "where": "before the start", "size": n,
                              "bytes": int(before.sum())})
        self.made.clear()
        return found


def describe_write(label: str, w: dict, how: str = "") -> str:
    """A changed input, in words: an in-place write or a stray store, with its offset."""
    name = f"{w['name']}{f' ({how})' if how else ''}"
    if w.get("outside"):
        first = w["first"] or {}
        return (f"{label}: kernel_fn wrote outside the elements of its input {name}: {w['outside']} byte(s), "
                f"the first at byte offset {first.get('offset')} from its first element, {first.get('where')}; "
                "in a model that memory is another tensor's (the k beside a q sliced from one projection)")
    return (f"{label}: kernel_fn modified its input {name} in place ({w['inside']} byte(s) of its elements "
            "changed); inputs must be left unchanged")


def describe_stray(label: str, s: dict) -> str:
    return (f"{label}: kernel_fn wrote {s['where']} of {s['tensor']}: {s['bytes']} byte(s) of the judge's guard "
            f"changed, the first at byte offset {s['offset']} of a storage of {s.get('size')} bytes; on a GPU "
            "that memory is another tensor's")
