"""Which timed outputs leave the device and the keyed checksum every one gets there
(harness/timing/timed_outputs.py): the checksum the same wherever it is computed, the saved sample the
one the key chooses, in the worker and in the judging process alike. No worker process."""
from __future__ import annotations

import io

import pytest
import torch

from harness.kernel_types import registry
from harness.kernel_types.registry import Case
from harness.timing import timed_outputs
from harness.timing.timed_outputs import (PRIME, ROW_WORDS, SavedOutputs, SavePolicy, keyed_checksum,
                                          save_policy, saved_reps)

KEY = 0x2F00D15EA5E


def _saved_copy(t: torch.Tensor) -> torch.Tensor:
    """What the judging process loads: the worker's host copy, written with torch.save, read back."""
    buffer = io.BytesIO()
    torch.save(t.detach().to("cpu").clone(), buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


def _by_hand(t: torch.Tensor, key: int) -> str:
    """The checksum's definition in plain Python integers: row-major bytes as unsigned 16-bit
    little-endian words in rows of ROW_WORDS (the last zero-padded), sum over rows h of
    b[h] * (sum over columns l of w[h, l] * a[l] mod p) mod p, for two pairs of tables."""
    raw = bytes(t.contiguous().reshape(-1).view(torch.uint8).tolist()) if t.numel() else b""
    raw += b"\0" * (-len(raw) % (2 * ROW_WORDS))
    words = [int.from_bytes(raw[i:i + 2], "little") for i in range(0, len(raw), 2)]
    rows = [words[i:i + ROW_WORDS] for i in range(0, len(words), ROW_WORDS)]
    sums = []
    for k in (0, 1):
        a = timed_outputs._table(key, f"columns:{k}", ROW_WORDS, "cpu").tolist()
        b = timed_outputs._table(key, f"rows:{k}", len(rows), "cpu").tolist()
        sums.append(sum(b[h] * (sum(w * c for w, c in zip(row, a)) % PRIME) for h, row in enumerate(rows)) % PRIME)
    shape = "x".join(str(n) for n in t.shape)
    return f"{str(t.dtype).replace('torch.', '')}:{shape}:{sums[0]:08x}{sums[1]:08x}"


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(7, 13, generator=gen)
    wide = torch.randn(6, 10, generator=gen)
    return {
        "float32": base,
        "float16": base.half(),
        "bfloat16": base.bfloat16(),
        "float64": base.double(),
        "int64": torch.randint(-2**40, 2**40, (5, 3), generator=gen),
        "bool": base > 0,
        "uint8 odd length": torch.randint(0, 256, (11,), generator=gen, dtype=torch.uint8),
        "0-dim float32": torch.tensor(3.25),
        "empty": torch.empty(0, 4),
        "transposed": base.t(),
        "every other column": wide[:, ::2],
        "storage offset, fp16": base.half()[1:, 3:],
        "expanded": torch.randn(1, 5, generator=gen).expand(4, 5),
        "non-finite": torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0]),
    }


@pytest.mark.parametrize("name", sorted(_tensors()))
def test_the_checksum_is_the_same_on_the_tensor_its_saved_copy_and_by_hand(name):
    t = _tensors()[name]
    on_device = keyed_checksum(t, KEY)  # on the CPU here: the device is the CPU
    assert on_device == keyed_checksum(_saved_copy(t), KEY) == _by_hand(t, KEY)


def test_the_checksum_is_the_same_in_one_pass_or_many(monkeypatch):
    t = torch.randn(1000, 37).half()  # 74,000 bytes: ten rows, the last padded
    whole = keyed_checksum(t, KEY)
    monkeypatch.setattr(timed_outputs, "CHUNK_ROWS", 3)  # a pass boundary inside the tensor, several times
    assert keyed_checksum(t, KEY) == whole == _by_hand(t, KEY)


def test_the_checksum_sees_one_bit_the_key_the_dtype_and_the_shape():
    t = torch.randn(64, 33)
    flipped = t.clone()
    flipped.view(torch.int32)[17, 5] ^= 1  # the lowest mantissa bit of one element
    assert keyed_checksum(flipped, KEY) != keyed_checksum(t, KEY)
    assert keyed_checksum(t, KEY + 1) != keyed_checksum(t, KEY)
    assert keyed_checksum(t.view(torch.int32), KEY) != keyed_checksum(t, KEY)
    assert keyed_checksum(t.reshape(33, 64), KEY) != keyed_checksum(t, KEY)
    assert keyed_checksum(None, KEY) is None


@pytest.mark.gpu
def test_the_checksum_on_the_gpu_is_bit_identical_to_the_cpus():
    for name, t in _tensors().items():
        assert keyed_checksum(t.cuda(), KEY) == keyed_checksum(t, KEY), name
    big = torch.randn(4096, 3000, device="cuda").half()[:, 1:]  # several passes, non-contiguous
    assert keyed_checksum(big, KEY) == keyed_checksum(_saved_copy(big), KEY)


def _policy(sample: int) -> SavePolicy:
    return SavePolicy(every=False, sample=sample, output_bytes=1)


@pytest.mark.parametrize("rounds", [[8], [3], [6, 9], [40]])
def test_the_worker_saves_exactly_the_reps_the_judge_recomputes_from_the_key(rounds):
    warmup, names = 2, []
    for key in range(20):
        saved: list[int] = []
        keeper = SavedOutputs(_policy(3), key, lambda t: saved.append(int(t)) or f"t{int(t)}")
        reps = [-1 - i for i in range(warmup)] + list(range(sum(rounds)))
        ends = {sum(rounds[:i + 1]) - 1 for i in range(len(rounds))}
        for rep in reps:
            keeper.keep(rep, torch.tensor(rep), last=rep in ends)
        held = keeper.close()
        assert sorted(saved) == sorted(saved_reps(_policy(3), key, warmup, rounds)), key
        assert all(name == f"t{rep}" for rep, name in held.items())  # the held copy is the rep's own
        names.append(tuple(sorted(saved)))
    chosen = saved_reps(_policy(3), 0, warmup, rounds)
    assert chosen[0] == -1 and all(r in chosen for r in ends)  # the first call and each round's last
    assert len(chosen) <= 3 + 1 + len(rounds)
    if sum(rounds) > 6:
        assert len(set(names)) > 1  # the key decides: another key, another sample


def test_the_drawn_sample_reaches_every_rep():
    # each call equally likely to be drawn: over keys, no rep is safe to get wrong
    drawn = set()
    for key in range(200):
        drawn |= set(saved_reps(_policy(2), key, 1, [30]))
    assert drawn == set([-1] + list(range(30)))


def test_every_output_is_saved_where_all_fit_and_a_fixed_sample_elsewhere():
    softmax = registry.get("softmax")
    cpu = Case.make("softmax", softmax.cpu_bench_shape, "float32")
    meta = [torch.empty(16, 4096, device="meta")]
    assert save_policy(cpu, meta, {}, "cpu", {"warmup": 1, "max_reps": 20}).every
    big = Case.make("softmax", softmax.bench_shape, "float16")
    big_meta = [torch.empty(4096, 32000, dtype=torch.float16, device="meta")]
    policy = save_policy(big, big_meta, {}, "cuda", {"warmup": 5, "max_reps": 500})
    assert (policy.every, policy.sample, policy.output_bytes) == (False, 1, 4096 * 32000 * 2)
    # the sample's size does not grow with the reps: 505 calls or 1005 save the same handful
    assert len(saved_reps(policy, KEY, 5, [500])) <= 3 and len(saved_reps(policy, KEY, 5, [500, 500])) <= 4
    ce = Case.make("cross_entropy", {"N": 4096, "V": 32000}, "float16")
    ce_meta = [torch.empty(4096, 32000, dtype=torch.float16, device="meta"),
               torch.empty(4096, dtype=torch.int64, device="meta")]
    assert save_policy(ce, ce_meta, {}, "cuda", {"warmup": 5, "max_reps": 500}).output_bytes == 4  # a scalar
