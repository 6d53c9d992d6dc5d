"""Which timed outputs leave the device, and the keyed checksum every timed output gets there.

Copying every timed output to the host and writing it costs as much as the output is large, once
per rep (a 4096x32000 fp16 softmax: 262 MB a rep). So every output is checked where it was made
(harness/timing/device_check.py), checksummed there, and only a sample is copied and saved for the
judging process to compare with its own references:

- every call's output, where all of them fit SAVE_BYTES (the small targets, and the CPU's timing
  shapes: the judging process keeps its full check there);
- else the first call's, each round's last and `sample` more drawn by a reservoir over every later
  call (each equally likely to be in it, however many reps the budget runs), held on the device
  until the timing ends. The sample's size is fixed, so the reps are not capped by what saving
  them would cost: the budget's max_reps stands.

Which calls are drawn is decided by a key the worker derives, before the candidate is imported,
from the secret that salts the fresh inputs (harness/timing/fresh_inputs.py's NoiseSecret), held in
closures and revealed only in the stage's final record after its last timed call: the candidate
cannot know which rep counts. The judging process recomputes the choice from the revealed key
(`saved_reps`) and fails a timing whose saved set differs.

The checksum (`keyed_checksum`) is integer arithmetic over the output's raw bits in row-major order:
its bytes as unsigned 16-bit words laid out in rows of ROW_WORDS, w[h, l], and
sum_h b[h] * (sum_l w[h, l] * a[l] mod p) mod p, p = 2^31 - 1, with the tables a and b drawn from the
key, twice with two pairs of tables. No float rounding and no overflow (a product < 2^47, a row's
sum < 2^59), so the device's figure and the judging process's, recomputed on the CPU from the saved
bytes, are bit-identical; per word it costs a multiply and an add, no division. For any other
output of the same dtype and shape, the difference is a nonzero polynomial of degree 2 in the
tables' entries, so it matches one sum with probability at most 2/p (Schwartz-Zippel) and both at
most 2^-60 over keys it does not know: a saved output swapped after its rep, on the device while
held, shows, however it was chosen, since the key is secret while the candidate runs.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

# bound before any candidate is imported (the identity check watches this module's globals)
_blake2b, _shake = hashlib.blake2b, hashlib.shake_256

SAVE_BYTES = {"cpu": 256 * 2**20, "cuda": 512 * 2**20}  # one timing's saved outputs, at most
MAX_SAMPLE = 10  # outputs drawn at random when not every one is saved
FIXED = 3  # the first call's output and each round's last (two rounds at most)
PRIME = 2**31 - 1
ROW_WORDS = 4096  # the words laid out as rows of this many: a row's sum of products stays below 2^63
CHUNK_ROWS = 1024  # rows summed per pass (4M words): bounded temporaries on the device


@dataclass(frozen=True)
class SavePolicy:
    every: bool  # every call's output saved
    sample: int  # outputs drawn at random besides the fixed ones, when not every
    output_bytes: int  # the reference output's size, on which the choice rests


def output_bytes(case, args: list, kwargs: dict) -> int:
    """The size of the reference's output for `case`: PyTorch's own op run on meta tensors (shapes
    only, no data); where that cannot run, the inputs' size (no output of the nine types is larger)."""
    from harness.kernel_types import registry
    kt = registry.get(case.kernel_type)
    meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    try:
        with torch.no_grad():
            out = kt.eager(*meta, **kwargs)
        return int(out.numel()) * torch.empty((), dtype=kt.out_dtype(case)).element_size()
    except Exception:  # an op without a meta kernel: the bound, not the figure
        return sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))


def save_policy(case, args: list, kwargs: dict, device: str, limits: dict, extra_bytes: int = 0,
                forward: bool = True) -> SavePolicy:
    """What the worker saves of a timing of `case` under `limits` (warmup, max_reps): the same
    answer in the worker and in the judging process, from the case alone. A training step's rep
    gives its gradients too (`extra_bytes`), or only them (`forward` False: a backward's rep)."""
    size = max((output_bytes(case, args, kwargs) if forward else 0) + extra_bytes, 1)
    budget = SAVE_BYTES[device] if device in SAVE_BYTES else SAVE_BYTES["cuda"]
    most_calls = int(limits.get("warmup", 0)) + 2 * int(limits.get("max_reps", 1))  # a second round at most
    if most_calls * size <= budget:
        return SavePolicy(True, 0, size)
    # at least one drawn at random, even where the fixed ones already fill the budget
    return SavePolicy(False, max(1, min(MAX_SAMPLE, budget // size - FIXED)), size)


def draw(key: int, index: int) -> int:
    """The reservoir's draw for the call at `index` (0 is the first call), a 62-bit integer."""
    digest = _blake2b(f"draw:{index}".encode(), key=int(key % 2**62).to_bytes(8, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 2**62


def slot(key: int, index: int, size: int) -> int | None:
    """Algorithm R over the calls after the first (which is saved anyway): the reservoir slot the
    call at `index` takes, or None."""
    seen = index - 1  # calls before this one in the reservoir's stream
    j = seen if seen < size else draw(key, index) % (seen + 1)
    return j if j < size else None


def reservoir(key: int, size: int, calls: int) -> list[int]:
    """The call indices the reservoir holds at the end of `calls` calls."""
    slots: list[int] = []
    for index in range(1, calls):
        j = slot(key, index, size)
        if j is None:
            continue
        if j < len(slots):
            slots[j] = index
        else:
            slots.append(index)
    return slots


def saved_reps(policy: SavePolicy, key: int, warmup: int, rounds: list[int]) -> list[int]:
    """The reps whose outputs a timing of `rounds` (reps per round, after `warmup` warm-ups; the
    warm-ups are reps -1, -2, ... in call order) saves under `policy` and `key`, sorted by call."""
    order = [-1 - i for i in range(warmup)] + list(range(sum(rounds)))
    if policy.every or not order:
        return order
    chosen = {0} | {index for index in reservoir(key, policy.sample, len(order))}
    done = warmup
    for reps in rounds:
        done += reps
        if reps:
            chosen.add(done - 1)
    return [order[i] for i in sorted(chosen)]


def _table(key: int, label: str, n: int, device) -> torch.Tensor:
    """n coefficients in [1, p - 1] drawn from the key (SHAKE-256 of key and label), on `device`."""
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    data = _shake(int(key % 2**62).to_bytes(8, "little") + label.encode()).digest(4 * n)
    values = torch.frombuffer(bytearray(data), dtype=torch.int32).to(torch.int64) & 0x7FFFFFFF
    return (values % (PRIME - 1) + 1).to(device)


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits in row-major order as 16-bit words (int16), zero-padded to whole rows."""
    flat = t.detach().contiguous().reshape(-1)
    data = flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)
    pad = (-data.numel()) % (2 * ROW_WORDS)
    if pad or data.storage_offset() % 2:
        data = torch.cat([data, data.new_zeros(pad)])  # a fresh, aligned copy
    return data.view(torch.int16).view(-1, ROW_WORDS)


def _keyed_sums(rows: torch.Tensor, key: int, made: dict) -> list[int]:
    """sum over rows h and columns l of w[h, l] * a[l] * b[h] mod p, for two pairs of tables (a, b);
    `made`: tables already on the device, by (k, rows, device)."""
    where = (rows.shape[0], str(rows.device))
    for k in (0, 1):
        if (k, *where) not in made:
            made[(k, *where)] = (_table(key, f"columns:{k}", ROW_WORDS, rows.device),
                                 _table(key, f"rows:{k}", rows.shape[0], rows.device))
    tables = [made[(k, *where)] for k in (0, 1)]
    totals = [0, 0]
    for first in range(0, rows.shape[0], CHUNK_ROWS):
        w = rows[first:first + CHUNK_ROWS].to(torch.int64) & 0xFFFF  # unsigned, < 2^16
        for k, (a, b) in enumerate(tables):
            per_row = (w * a).sum(dim=1) % PRIME  # each product < 2^47, a row's sum < 2^59
            part = (per_row * b[first:first + CHUNK_ROWS]) % PRIME  # < 2^62 before the reduction
            totals[k] = (totals[k] + int(part.sum())) % PRIME  # a pass's sum < 2^41
    return totals


def keyed_checksum(t, key: int, made: dict | None = None) -> str | None:
    """The output's keyed checksum, computed where `t` lives: "<dtype>:<shape>:<two 31-bit sums>".
    None for anything that is not a tensor. `made`: a dict that keeps the key's tables between calls
    (a timing checksums every rep at one size: the tables are drawn and copied to the device once)."""
    if not isinstance(t, torch.Tensor):
        return None
    sums = _keyed_sums(_words(t), key, {} if made is None else made)
    shape = "x".join(str(n) for n in t.shape)
    return f"{str(t.dtype).replace('torch.', '')}:{shape}:{sums[0]:08x}{sums[1]:08x}"


class SavedOutputs:
    """The worker's side: saves each call's output that `policy` and the key choose, the drawn ones
    held on the device (a clone: a later call may reuse the buffer) until `close`. The key lives
    only in the closure of `_slot`."""

    def __init__(self, policy: SavePolicy, key: int, save):
        self.policy, self._save = policy, save
        self._calls = 0
        self._slots: list[list] = []  # [rep, clone on the device or None, saved name or None]
        self._slot = lambda index: slot(key, index, policy.sample)

    def keep(self, rep: int, out, last: bool) -> str | None:
        """The name `out` was saved under now, or None (held for later, or not chosen)."""
        index, self._calls = self._calls, self._calls + 1
        if self.policy.every:
            return self._save(out)
        name = self._save(out) if index == 0 or last else None
        j = self._slot(index) if index else None
        if j is not None:
            held = None if name is not None or not isinstance(out, torch.Tensor) else out.detach().clone()
            if j < len(self._slots):
                self._slots[j] = [rep, held, name]
            else:
                self._slots.append([rep, held, name])
        return name

    def close(self) -> dict[int, str]:
        """Save the drawn outputs still held: {rep: name}, for the stage's final record."""
        saved = {}
        for rep, held, name in self._slots:
            if name is None and held is not None:
                saved[rep] = self._save(held)
        self._slots = []
        return saved
