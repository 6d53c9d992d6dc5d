"""A launch's programs run in a secret order under the judge, and a checked launch in two orders
compared bitwise (harness/correctness/program_order.py), in this process's interpreter."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from harness.correctness import launches
from harness.correctness.program_order import ProgramOrders
from paths import ROOT


@triton.jit
def _chained(out_ptr, x_ptr):
    """Each program adds its value to what program id - 1 stored: right in id order only."""
    i = tl.program_id(0)
    before = tl.load(out_ptr + i - 1, mask=i > 0, other=0.0)
    tl.store(out_ptr + i, before + tl.load(x_ptr + i))


@triton.jit
def _independent(out_ptr, x_ptr):
    i = tl.program_id(0)
    tl.store(out_ptr + i, tl.load(x_ptr + i) * 2.0)


@triton.jit
def _ticket(order_ptr, counter_ptr):
    """Each program writes the ticket it drew into its own slot: the order programs ran in."""
    i = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    tl.store(order_ptr + i, tl.atomic_add(counter_ptr, 1))


@triton.jit
def _float_sum(total_ptr, x_ptr):
    tl.atomic_add(total_ptr, tl.load(x_ptr + tl.program_id(0)))


@triton.jit
def _int_sum(total_ptr, x_ptr):
    tl.atomic_add(total_ptr, tl.load(x_ptr + tl.program_id(0)))


@triton.jit
def _plain_ticket(out_ptr, partial_ptr, counter_ptr, x_ptr, n):
    """Each program stores its partial and takes a ticket kept with a plain load and store; the last
    holder sums every partial in a fixed order: the same bytes in every sequential order."""
    i = tl.program_id(0)
    tl.store(partial_ptr + i, tl.load(x_ptr + i) * 2.0)
    ticket = tl.load(counter_ptr)
    tl.store(counter_ptr, ticket + 1)
    if ticket == n - 1:
        total = 0.0
        for j in range(0, n):
            total += tl.load(partial_ptr + j)
        tl.store(out_ptr, total)


@triton.jit
def _atomic_ticket(out_ptr, partial_ptr, counter_ptr, x_ptr, n):
    """The same with the ticket an (acq_rel) atomic: the partials are ordered before the last read."""
    i = tl.program_id(0)
    tl.store(partial_ptr + i, tl.load(x_ptr + i) * 2.0)
    ticket = tl.atomic_add(counter_ptr, 1)
    if ticket == n - 1:
        total = 0.0
        for j in range(0, n):
            total += tl.load(partial_ptr + j)
        tl.store(out_ptr, total)


@triton.jit
def _unfenced_flag(out_ptr, data_ptr, flag_ptr, x_ptr):
    """Program 0 publishes a value and sets a flag with plain stores; the others read the flag."""
    i = tl.program_id(0)
    if i == 0:
        tl.store(data_ptr, tl.load(x_ptr) * 3.0)
        tl.store(flag_ptr, 1)
    ready = tl.load(flag_ptr)
    tl.store(out_ptr + i, tl.load(x_ptr + i) + ready.to(tl.float32) * 0.0)


@triton.jit
def _lane_exchange(out_ptr, scratch_ptr, x_ptr, BLOCK: tl.constexpr, BARRIER: tl.constexpr,
                   REVERSED: tl.constexpr):
    """Each program stores its block to scratch and reads it back: reversed (another lane's
    element) or as stored, with or without a barrier between."""
    row = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * BLOCK + lanes)
    tl.store(scratch_ptr + row * BLOCK + lanes, x * 2.0)
    if BARRIER:
        tl.debug_barrier()
    back = (BLOCK - 1 - lanes) if REVERSED else lanes
    tl.store(out_ptr + row * BLOCK + lanes, tl.load(scratch_ptr + row * BLOCK + back))


@triton.jit
def _scalar_reload(out_ptr, scratch_ptr, x_ptr, BLOCK: tl.constexpr):
    """The row's sum stored as a scalar and read back: one thread stores it, every thread reads it."""
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + lanes)
    tl.store(scratch_ptr, tl.sum(x, axis=0))
    tl.store(out_ptr + lanes, x / tl.load(scratch_ptr))


@triton.jit
def _atomic_exchange(out_ptr, scratch_ptr, x_ptr, BLOCK: tl.constexpr, SEM: tl.constexpr):
    """The block exchanged through scratch by an atomic_xchg to reversed lanes, then read back."""
    lanes = tl.arange(0, BLOCK)
    tl.atomic_xchg(scratch_ptr + (BLOCK - 1 - lanes), tl.load(x_ptr + lanes), sem=SEM)
    tl.store(out_ptr + lanes, tl.load(scratch_ptr + lanes))


@triton.jit
def _accumulate_in_place(out_ptr, x_ptr, steps, BLOCK: tl.constexpr):
    """A running sum kept in the output itself: each step loads, adds and stores the same lanes."""
    lanes = tl.arange(0, BLOCK)
    tl.store(out_ptr + lanes, tl.zeros([BLOCK], tl.float32))
    for k in range(steps):
        tl.store(out_ptr + lanes, tl.load(out_ptr + lanes) + tl.load(x_ptr + k * BLOCK + lanes))


@triton.jit
def _float_view(out_ptr, raw_ptr, OFFSET: tl.constexpr, BLOCK: tl.constexpr):
    """float32 read from a byte buffer at OFFSET bytes in: aligned where OFFSET is a multiple of 4."""
    lanes = tl.arange(0, BLOCK)
    tl.store(out_ptr + lanes, tl.load((raw_ptr + OFFSET).to(tl.pointer_type(tl.float32)) + lanes))


@triton.jit
def _one_address(out_ptr, x_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    """Every lane of one store aims at out_ptr[0]: MODE 0 each its running sum (different values), 1
    the total broadcast (one value), 2 the running sums with every lane but the last masked off."""
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + lanes, mask=lanes < n, other=0.0)
    if MODE == 0:
        tl.store(out_ptr + lanes * 0, tl.cumsum(x, 0))
    elif MODE == 1:
        tl.store(out_ptr + lanes * 0, tl.zeros([BLOCK], tl.float32) + tl.sum(x, 0))
    else:
        tl.store(out_ptr + lanes * 0, tl.cumsum(x, 0), mask=lanes == BLOCK - 1)


@triton.jit
def _lanes_atomic(out_ptr, ticket_ptr, x_ptr, KIND: tl.constexpr, BLOCK: tl.constexpr):
    """Every lane's atomic aims at out_ptr[0]: KIND 0 a float add, 1 an integer add whose old values
    are each lane's ticket, 2 an exchange of each lane's own value."""
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + lanes)
    if KIND == 0:
        tl.atomic_add(out_ptr + lanes * 0, x)
    elif KIND == 1:
        tl.store(ticket_ptr + lanes, tl.atomic_add(out_ptr + lanes * 0, 1))
    elif KIND == 2:
        tl.atomic_xchg(out_ptr + lanes * 0, x)
    else:  # one lane left by the mask: one atomic, no order among lanes
        tl.atomic_add(out_ptr + lanes * 0, x, mask=lanes == 3)


@triton.jit
def _cas_max(out_ptr, x_ptr, BLOCK: tl.constexpr):
    """The maximum of x into out_ptr[0] by a compare-and-swap loop from every lane."""
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + lanes)
    old = tl.atomic_add(out_ptr + lanes * 0, 0)
    for _ in range(BLOCK):
        seen = tl.atomic_cas(out_ptr + lanes * 0, old, tl.maximum(old, x))
        old = tl.where(seen == old, tl.maximum(old, x), seen)


@pytest.fixture
def monitor():
    """The process's launch monitor with the judge's orders on it for one test, then as it was."""
    m = launches.install()
    was, m.orders = m.orders, ProgramOrders(seed=1234)
    try:
        yield m
    finally:
        m.orders = was


def test_a_chain_between_programs_is_found_and_named(monitor):
    x = torch.arange(1.0, 33.0)
    out = torch.empty(32)
    with monitor.orders.compared():
        _chained[(32,)](out, x)
    found = monitor.orders.take_findings()
    assert len(found) == 1 and "the launch of _chained" in found[0] and "out_ptr (float32)" in found[0]
    assert "than in id order" in found[0] and "atomic" not in found[0]
    # the id-order run is the one kept: what the interpreter always gave
    assert torch.equal(out, torch.cumsum(x, 0))


def test_independent_programs_agree_and_keep_their_result(monitor):
    x = torch.randn(50)
    out = torch.empty(50)
    with monitor.orders.compared():
        _independent[(50,)](out, x)
    assert monitor.orders.take_findings() == []
    assert torch.equal(out, x * 2)


def test_outside_a_checked_call_programs_run_once_in_a_secret_order(monitor):
    counter = torch.zeros(1, dtype=torch.int32)
    seen = torch.empty(12, dtype=torch.int32)
    _ticket[(4, 3)](seen, counter)
    assert counter.item() == 12  # once: the timed calls are not run twice
    ran = seen.tolist()
    assert sorted(ran) == list(range(12)) and ran != list(range(12))
    assert monitor.orders.take_findings() == []  # nothing is compared there


def test_each_launch_draws_its_own_order_and_no_orders_means_id_order(monitor):
    orders = []
    for _ in range(6):
        counter = torch.zeros(1, dtype=torch.int32)
        seen = torch.empty(16, dtype=torch.int32)
        _ticket[(16, 1)](seen, counter)
        orders.append(tuple(seen.tolist()))
    assert len(set(orders)) > 1 and tuple(range(16)) not in orders
    monitor.orders = None
    counter, seen = torch.zeros(1, dtype=torch.int32), torch.empty(16, dtype=torch.int32)
    _ticket[(16, 1)](seen, counter)
    assert seen.tolist() == list(range(16))  # verify and an exported package: the interpreter's own order


def test_the_secret_decides_the_order():
    def order(seed):
        orders = ProgramOrders(seed)
        orders._mode = "secret"
        orders.grid_dims(8, 4, 1)
        return [orders.program(x, y, 0) for x in range(8) for y in range(4)]
    assert order(1) == order(1)
    assert len({tuple(order(seed)) for seed in range(6)}) > 1
    assert sorted(order(3)) == [(x, y, 0) for x in range(8) for y in range(4)]


def test_a_float_atomic_sum_differs_by_order_and_says_atomics(monitor):
    x = torch.tensor(np.random.default_rng(0).standard_normal(64) * np.logspace(0, 8, 64), dtype=torch.float32)
    found = []
    for _ in range(4):  # the secret order: most orders of these 64 terms round differently
        total = torch.zeros(1)
        with monitor.orders.compared():
            _float_sum[(64,)](total, x)
        found += monitor.orders.take_findings()
    assert found and all("atomic operation(s)" in f and "_float_sum" in f for f in found)


def test_an_integer_atomic_sum_is_the_same_in_any_order(monitor):
    x = torch.arange(64, dtype=torch.int32)
    total = torch.zeros(1, dtype=torch.int32)
    with monitor.orders.compared():
        _int_sum[(64,)](total, x)
    assert monitor.orders.take_findings() == [] and total.item() == int(x.sum())


def test_a_launch_runs_again_only_where_its_programs_share_memory(monitor):
    """No program reading or writing what another writes: the orders agree by construction, so
    the second run is not made (the check's cost is the record of accesses)."""
    runs = []

    class Counting(ProgramOrders):
        def grid_dims(self, nx, ny, nz):  # once per run of a launch through the interpreter
            runs.append((nx, ny, nz))
            super().grid_dims(nx, ny, nz)
    monitor.orders = Counting(seed=5)
    x, out = torch.randn(40), torch.empty(40)
    with monitor.orders.compared():
        _independent[(40,)](out, x)
        assert len(runs) == 1 and torch.equal(out, x * 2)
        _chained[(40,)](torch.empty(40), x)
        assert len(runs) == 3
    assert len(monitor.orders.take_findings()) == 1


class _Handle:
    """The interpreter's TensorHandle, as the access record reads it."""

    def __init__(self, data, bits=32):
        self.data = np.asarray(data, dtype=np.uint64)
        self.bits = bits

    def get_element_ty(self):
        return type("T", (), {"primitive_bitwidth": self.bits})()


def test_shared_accesses_find_a_read_of_another_programs_write_and_nothing_else():
    from harness.correctness.shared_accesses import SharedAccesses
    log = SharedAccesses()
    for program in range(4):  # each program reads its own row and writes its own output element
        log.program = program
        log.access(_Handle(1000 + 4 * np.arange(8) + 32 * program), None, write=False)
        log.access(_Handle([5000 + 4 * program]), None, write=True)
    assert log.first_shared() is None
    log.program = 4
    log.access(_Handle([5000 + 4 * 2]), None, write=False)  # reads program 2's output
    assert log.first_shared() == (5008, 2, 4)


def test_shared_accesses_see_a_masked_lane_as_no_access_and_a_wide_access_as_every_byte():
    from harness.correctness.shared_accesses import SharedAccesses
    log = SharedAccesses()
    log.program = 0
    log.access(_Handle([2000, 2002], bits=16), None, write=True)
    log.program = 1
    mask = type("M", (), {"data": np.array([False, True])})()
    log.access(_Handle([2000, 3000], bits=16), mask, write=True)  # the shared lane is masked off
    assert log.first_shared() is None
    log.program = 2
    log.access(_Handle([2000], bits=32), None, write=False)  # an fp32 read over program 0's two fp16
    assert log.first_shared() in ((2000, 0, 2), (2002, 0, 2))


@pytest.mark.parametrize("kernel", ["_plain_ticket", "_unfenced_flag"])
def test_a_plain_read_of_another_programs_write_with_no_atomic_between_is_a_race(monitor, kernel):
    """Right in every order a CPU runs programs one after another (the bytes agree), and a race on
    a GPU: found by the accesses themselves, not by the bytes."""
    x = torch.arange(1.0, 17.0)
    out, partial, counter = torch.zeros(16), torch.empty(16), torch.zeros(1, dtype=torch.int32)
    with monitor.orders.compared():
        if kernel == "_plain_ticket":
            _plain_ticket[(16,)](out, partial, counter, x, 16)
        else:
            _unfenced_flag[(16,)](out, partial, counter, x)
    found = monitor.orders.take_findings()
    assert found and f"in the launch of {kernel}" in found[0] and "no atomic orders the two" in found[0], found
    # and, behind it, the scalar stored by one thread and read back by all: a race between lanes too
    assert all(f.startswith("lane order") for f in found[1:]), found
    if kernel == "_plain_ticket":
        assert out[0].item() == float(x.sum() * 2)  # right here: only the accesses show it


def test_a_ticket_taken_by_an_atomic_orders_the_partials_its_last_holder_reads(monitor):
    x = torch.arange(1.0, 17.0)
    out, partial, counter = torch.zeros(1), torch.empty(16), torch.zeros(1, dtype=torch.int32)
    with monitor.orders.compared():
        _atomic_ticket[(16,)](out, partial, counter, x, 16)
    assert monitor.orders.take_findings() == []
    assert out.item() == float(x.sum() * 2)


def test_unordered_reads_are_named_only_across_programs_and_where_no_atomic_orders_them():
    from harness.correctness.shared_accesses import SharedAccesses
    log = SharedAccesses()
    log.program = 0
    log.access(_Handle([4000]), None, write=True)
    log.access(_Handle([4000]), None, write=False)  # its own write: no one else's
    # the ticket, after its write (an atomic's default semantic: acq_rel)
    log.access(_Handle([6000]), None, write=True, atomic=True, sem="ACQUIRE_RELEASE")
    log.program = 1
    log.access(_Handle([6000]), None, write=True, atomic=True, sem="ACQUIRE_RELEASE")  # the ticket, before its read
    log.access(_Handle([4000]), None, write=False)
    assert log.first_shared() is not None and log.first_unordered_read() is None
    log.program = 2
    log.access(_Handle([4000]), None, write=False)  # no ticket first
    assert log.first_unordered_read() == (4000, 0, 2)


@pytest.mark.parametrize("writer, reader, ordered", [
    ("ACQUIRE_RELEASE", "ACQUIRE_RELEASE", True), ("RELEASE", "ACQUIRE", True),
    ("ACQUIRE", "ACQUIRE_RELEASE", False),  # sm_90 puts no barrier before an acquire: the write is not released
    ("ACQUIRE_RELEASE", "RELEASE", False),  # nor one after a release: the read may run before the ticket
])
def test_a_ticket_orders_a_write_and_a_read_only_with_release_and_acquire_semantics(writer, reader, ordered):
    from harness.correctness.shared_accesses import SharedAccesses
    log = SharedAccesses()
    log.program = 0
    log.access(_Handle([4000]), None, write=True)
    log.access(_Handle([6000]), None, write=True, atomic=True, sem=writer)
    log.program = 1
    log.access(_Handle([6000]), None, write=True, atomic=True, sem=reader)
    log.access(_Handle([4000]), None, write=False)
    assert log.first_unordered_read() == (None if ordered else (4000, 0, 1))


@pytest.mark.parametrize("barrier, reversed_, race", [(False, True, True), (True, True, False),
                                                     (False, False, False)])
def test_a_program_reading_another_lanes_store_needs_a_barrier_between(monitor, barrier, reversed_, race):
    """The interpreter runs a block as one numpy operation, so the reversed read is right here; on a
    GPU another thread holds that lane, and only a barrier orders its store before the read."""
    x = torch.randn(3, 128)  # a full block: 128 lanes, one per thread of 4 warps
    out, scratch = torch.empty(3, 128), torch.empty(3, 128)
    with monitor.orders.compared():
        _lane_exchange[(3,)](out, scratch, x, BLOCK=128, BARRIER=barrier, REVERSED=reversed_)
    found = monitor.orders.take_findings()
    expected = (x * 2).flip(1) if reversed_ else x * 2
    assert torch.equal(out, expected)  # right here whatever the finding: only the lanes show it
    if race:
        assert len(found) == 1 and "lane order: in the launch of _lane_exchange" in found[0], found
        assert "of scratch_ptr" in found[0] and "tl.debug_barrier()" in found[0]
    else:
        assert found == []


@pytest.mark.parametrize("sem, race", [("release", True), ("acq_rel", False)])
def test_an_atomic_exchange_is_judged_by_the_barriers_its_semantic_puts_around_it(monitor, sem, race):
    """An acq_rel atomic (the default) has a barrier on both sides, a release one only before it."""
    x = torch.randperm(128, dtype=torch.int32)  # the interpreter exchanges integers
    out, scratch = torch.empty(128, dtype=torch.int32), torch.zeros(128, dtype=torch.int32)
    with monitor.orders.compared():
        _atomic_exchange[(1,)](out, scratch, x, BLOCK=128, SEM=sem)
    found = monitor.orders.take_findings()
    assert torch.equal(out, x.flip(0))  # right here either way
    assert (len(found) == 1 and "lane order" in found[0] and "of scratch_ptr" in found[0]) if race else found == [], found


def test_a_scalar_read_back_is_another_threads_read_and_a_block_of_one_is_not(monitor):
    """A scalar is held by every thread and stored by one; a block of one element updated in place
    (a running partial) is its own lane, though the interpreter holds both alike."""
    x = torch.rand(128) + 0.5  # a sum far from zero: x / x.sum() is well conditioned, whatever the draw
    out, scratch = torch.empty(128), torch.zeros(128)
    with monitor.orders.compared():
        _scalar_reload[(1,)](out, scratch, x, BLOCK=128)
    found = monitor.orders.take_findings()
    assert torch.allclose(out, x / x.sum())  # right here: only the lanes show it
    assert len(found) == 1 and "lane order: in the launch of _scalar_reload" in found[0], found
    out = torch.empty(1)
    with monitor.orders.compared():
        _accumulate_in_place[(1,)](out, x[:5].reshape(5, 1), 5, BLOCK=1)
    assert monitor.orders.take_findings() == []
    assert torch.allclose(out, x[:5].sum())


def test_a_program_updating_the_same_lanes_in_place_is_no_race(monitor):
    x = torch.randn(5, 128)
    out = torch.empty(128)
    with monitor.orders.compared():
        _accumulate_in_place[(1,)](out, x, 5, BLOCK=128)
    assert monitor.orders.take_findings() == []
    assert torch.allclose(out, x.sum(0))


@pytest.mark.parametrize("offset", [1, 2, 4])
def test_an_element_off_its_alignment_is_named_and_an_aligned_one_is_not(monitor, offset):
    raw = torch.arange(64, dtype=torch.uint8)
    out = torch.empty(8)
    with monitor.orders.compared():
        _float_view[(1,)](out, raw, OFFSET=offset, BLOCK=8)
    found = monitor.orders.take_findings()
    # what the interpreter read is the bytes there, as a GPU never would
    assert torch.equal(out, raw[offset:offset + 32].clone().view(torch.float32))
    if offset % 4 == 0:
        assert found == []
    else:
        assert len(found) == 1 and found[0].startswith("misaligned address: in the launch of _float_view")
        assert f"loads a 4-byte element at byte {offset} of raw_ptr" in found[0], found[0]


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_lanes_of_one_store_writing_different_values_to_one_address_are_named(monitor, mode):
    x = torch.arange(1.0, 17.0)
    out = torch.zeros(2)
    with monitor.orders.compared():
        _one_address[(1,)](out, x, 16, MODE=mode, BLOCK=16)
    found = monitor.orders.take_findings()
    assert out[0].item() == x.sum().item()  # the interpreter kept the last lane's: the total, every mode
    if mode == 0:
        assert len(found) == 1 and found[0].startswith("lane order: in the launch of _one_address"), found
        assert "different values to byte 0 of out_ptr from 16 of its lanes" in found[0], found[0]
    else:  # one value from every lane, or one lane left: one store's worth
        assert found == []


def test_the_lanes_of_one_atomic_on_one_address_run_in_a_secret_order_drawn_per_call(monitor):
    x = torch.tensor([1e8, 1.0, -1e8, 3.0] * 16)
    sums = set()
    for _ in range(6):
        out = torch.zeros(1)
        _lanes_atomic[(1,)](out, out, x, KIND=0, BLOCK=64)
        sums.add(out.item())
    assert len(sums) > 1, sums  # a float sum's bits follow the order, as from one GPU run to the next
    tickets = torch.empty(64, dtype=torch.int32)
    counter = torch.zeros(1, dtype=torch.int32)
    _lanes_atomic[(1,)](counter, tickets, x, KIND=1, BLOCK=64)
    # each lane gets its own ticket back, in the order the lanes ran: not lane i the i-th
    assert counter.item() == 64 and sorted(tickets.tolist()) == list(range(64))
    assert tickets.tolist() != list(range(64))
    was, monitor.orders = monitor.orders, None
    try:  # outside the judge: the interpreter's lane order
        _lanes_atomic[(1,)](counter.zero_(), tickets, x, KIND=1, BLOCK=64)
        assert tickets.tolist() == list(range(64))
    finally:
        monitor.orders = was


def test_an_exchange_from_many_lanes_leaves_any_lanes_value_and_a_cas_loop_its_maximum(monitor):
    values = torch.arange(1, 17, dtype=torch.int32)
    kept = set()
    for _ in range(6):
        out = torch.zeros(1, dtype=torch.int32)
        _lanes_atomic[(1,)](out, out, values, KIND=2, BLOCK=16)
        kept.add(out.item())
    assert len(kept) > 1 and kept <= set(values.tolist()), kept  # not always the last lane's, as here before
    from harness.correctness.unspecified import ATOMIC_LANES, Unspecified
    was, monitor.unspecified = monitor.unspecified, Unspecified(seed=5)
    try:  # lanes the mask leaves out are no lanes: nothing ordered, nothing named
        out = torch.zeros(1)
        _lanes_atomic[(1,)](out, out, torch.arange(16.0), KIND=3, BLOCK=16)
        assert out.item() == 3.0 and not monitor.unspecified.counts
        _lanes_atomic[(1,)](out, out, torch.arange(16.0), KIND=0, BLOCK=16)
        assert monitor.unspecified.counts[ATOMIC_LANES] == 1
    finally:
        monitor.unspecified = was
    x = torch.randperm(64, dtype=torch.int32)
    for _ in range(3):  # an honest compare-and-swap loop: every lane order ends at the maximum
        out = torch.full((1,), -1, dtype=torch.int32)
        with monitor.orders.compared():
            _cas_max[(1,)](out, x, BLOCK=64)
        assert out.item() == 63 and monitor.orders.take_findings() == []


def test_lane_races_are_found_per_program_and_between_barriers():
    from harness.correctness.shared_accesses import SharedAccesses, _meets_another
    # the spans the check narrows to first: [start, end) overlapping another's; touching is not meeting
    spans = np.array([[0, 4], [4, 10], [30, 31], [9, 12], [50, 60], [55, 56]])
    assert _meets_another(spans).tolist() == [False, True, False, True, True, True]

    def log():
        return SharedAccesses()

    one = log()
    one.program = 0
    one.access(_Handle([7000, 7004, 7008, 7012]), None, write=True)
    one.access(_Handle([[7000, 7004], [7008, 7012]]), None, write=False)  # same order, another shape
    assert one.first_lane_race() == (7000, 0)
    one = log()
    one.program = 0
    one.access(_Handle([7000, 7004]), None, write=False)
    one.access(_Handle([7004, 7000]), None, write=True)  # a store after the read, lanes swapped
    assert one.first_lane_race() == (7000, 0)
    one = log()
    one.program = 0
    one.access(_Handle([7000, 7004]), None, write=True)
    one.access(_Handle([7004, 7000]), None, write=True)  # two stores, lanes swapped: either lands last
    assert one.first_lane_race() == (7000, 0)
    one = log()
    for program in range(2):
        one.program = program
        one.access(_Handle([7000, 7004]), None, write=True)
        one.barrier()
        one.access(_Handle([7004, 7000]), None, write=False)  # after a barrier
        one.barrier()
        one.access(_Handle([7000, 7004]), None, write=False)
        one.access(_Handle([7000, 7004]), None, write=True)  # the same lanes again: one thread each
    assert one.first_lane_race() is None
    one.program = 2  # another program's lanes: first_unordered_read's business, not this one's
    one.access(_Handle([7004]), None, write=False)
    assert one.first_lane_race() is None
    # atomics: acq_rel has a barrier on both sides, release before it, acquire after it
    for sem, race in (("ACQUIRE_RELEASE", None), ("RELEASE", (7100, 0)), ("ACQUIRE", (7100, 0))):
        one = log()
        one.program = 0
        one.access(_Handle([7100, 7104]), None, write=True)
        one.access(_Handle([7104, 7100]), None, write=True, atomic=True, sem=sem)  # an exchange
        one.access(_Handle([7100, 7104]), None, write=False)  # read back at the lanes it came from
        assert one.first_lane_race() == race, sem
    one = log()
    one.program = 0
    one.access(_Handle([7200, 7200]), None, write=True, atomic=True, sem="RELAXED")  # atomics alone: fine
    one.access(_Handle([7200]), None, write=True, atomic=True, sem="RELAXED")
    assert one.first_lane_race() is None
    block = log()  # a block's lanes read back as stored: one thread each
    block.program = 0
    block.access(_Handle([7300, 7304]), None, write=True)
    block.access(_Handle([7300, 7304]), None, write=False)
    assert block.first_lane_race() is None


TRITON36 = os.environ.get("AUTOKERNEL_TRITON36")
# Every hook, run in the interpreter of Triton 3.6 (a GPU image's today), whose builder takes a cache
# modifier and an eviction policy where later ones take one cache policy: the hooks pass on what they
# do not read, so a load, a store and both atomics run there as Triton's own builder runs them.
UNDER_TRITON_3_6 = r'''
import torch, triton, triton.language as tl
from harness.correctness import launches
from harness.correctness.program_order import ProgramOrders
assert triton.__version__.startswith("3.6"), triton.__version__
monitor = launches.install()
monitor.orders = ProgramOrders(seed=1)

@triton.jit
def _kernel(y_ptr, x_ptr, total_ptr, flag_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, x * 2, mask=mask)
    tl.atomic_add(total_ptr, tl.sum(tl.where(mask, 1, 0)))
    tl.atomic_cas(flag_ptr, 0, 1)

x = torch.arange(100, dtype=torch.float32)
y, total, flag = torch.empty_like(x), torch.zeros(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
with monitor.orders.compared():
    _kernel[(4,)](y, x, total, flag, 100, BLOCK=32)
assert torch.equal(y, x * 2) and total.item() == 100 and flag.item() == 1, (y, total, flag)
assert monitor.orders.atomics > 0

# ... and the judge's answers to what a GPU leaves unspecified (harness/correctness/unspecified.py)
from harness.correctness.unspecified import DIVISION, REORDER, Unspecified
monitor.unspecified = Unspecified(seed=2)

@triton.jit
def _unspecified(q_ptr, y_ptr, a_ptr, b_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    tl.store(q_ptr + lanes, tl.load(a_ptr + lanes) // tl.load(b_ptr + lanes))
    x = tl.load(a_ptr + lanes).to(tl.float32)
    tl.store(y_ptr + lanes, tl.reshape(tl.reshape(x, [BLOCK // 2, 2], can_reorder=True), [BLOCK]))
    tl.store(y_ptr + BLOCK + tl.arange(0, 2 * BLOCK), tl.cat(x, x, can_reorder=True))

a, b = torch.arange(1, 9, dtype=torch.int32), torch.tensor([1, 0, 2, 0, 1, 1, 1, 1], dtype=torch.int32)
q, y = torch.empty_like(a), torch.empty(24)
_unspecified[(1,)](q, y, a, b, BLOCK=8)
assert q[b != 0].tolist() == (a // b.clamp(min=1))[b != 0].tolist() and (q[b == 0] != 0).all(), q
assert not torch.equal(y[:8], a.float()) and torch.equal(y[:8].sort().values, a.float()), y
assert monitor.unspecified.counts[DIVISION] == 2 and monitor.unspecified.counts[REORDER] == 2

@triton.jit
def _minus(a, b):
    return a - b

@triton.jit
def _trees(out_ptr, x_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + lanes)
    tl.store(out_ptr + lanes, tl.associative_scan(x, 0, _minus))
    tl.store(out_ptr + BLOCK, tl.reduce(x, 0, _minus))
    tl.store(out_ptr + BLOCK + 1, tl.argmax(x * 0, 0, tie_break_left=False).to(tl.float32))

x, out = torch.arange(1.0, 9.0), torch.empty(10)
_trees[(1,)](out, x, BLOCK=8)
assert out[8].item() != (x[0] - x[1:].sum()).item() and out[0].item() == 1.0, out
from harness.correctness.unspecified import COMBINE, TIE
assert monitor.unspecified.counts[COMBINE] == 2 and monitor.unspecified.counts[TIE] == 1

# ... and a conversion to bf16 rounded to nearest even (harness/correctness/interpreter_numerics.py)
@triton.jit
def _to_bf16(y_ptr, x_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    tl.store(y_ptr + lanes, tl.load(x_ptr + lanes).to(tl.bfloat16))

x, y = torch.tensor([1.999, 3.4e38]), torch.empty(2, dtype=torch.bfloat16)
_to_bf16[(1,)](y, x, BLOCK=2)
assert y.tolist() == [2.0, float("inf")], y
print("ok")
'''


@pytest.mark.skipif(not TRITON36, reason="no Triton 3.6 named by AUTOKERNEL_TRITON36 (.ci/run installs one)")
def test_the_hooks_run_under_the_interpreter_of_triton_3_6():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([TRITON36, str(ROOT)])}
    proc = subprocess.run([sys.executable, "-c", UNDER_TRITON_3_6], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
