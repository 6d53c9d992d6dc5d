"""What a GPU leaves unspecified (an integer division by zero, the order a reorderable reshape or a
cat hands back) answered with the judge's secret values (harness/correctness/unspecified.py), in
this process's interpreter; and nothing changed where no judge set them."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from harness.correctness import launches, unspecified
from harness.correctness.unspecified import DIVISION, REORDER, Unspecified


@triton.jit
def _divide(q_ptr, r_ptr, a_ptr, b_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    a, b = tl.load(a_ptr + lanes), tl.load(b_ptr + lanes)
    tl.store(q_ptr + lanes, a // b)
    tl.store(r_ptr + lanes, a % b)


@triton.jit
def _reshape(y_ptr, x_ptr, REORDER_: tl.constexpr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    x = tl.reshape(tl.load(x_ptr + lanes), [BLOCK // 4, 4], can_reorder=REORDER_)
    tl.store(y_ptr + tl.reshape(lanes, [BLOCK // 4, 4]), x)


@triton.jit
def _reorder_then_sum(y_ptr, x_ptr, BLOCK: tl.constexpr):
    """Order-blind uses: a reorderable reshape summed, and a sum over all axes."""
    lanes = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + lanes)
    tl.store(y_ptr, tl.sum(tl.sum(tl.reshape(x, [BLOCK // 4, 4], can_reorder=True), 1), 0))
    tl.store(y_ptr + 1, tl.sum(tl.reshape(x, [BLOCK // 4, 4]), axis=None))


@triton.jit
def _cat(y_ptr, x_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    both = tl.cat(tl.load(x_ptr + lanes), tl.load(x_ptr + BLOCK + lanes), can_reorder=True)
    tl.store(y_ptr + tl.arange(0, 2 * BLOCK), both)


@pytest.fixture
def monitor():
    """The process's launch monitor with a judge's secret answers on it for one test, then as it was."""
    m = launches.install()
    was, m.unspecified = m.unspecified, Unspecified(seed=99)
    try:
        yield m
    finally:
        m.unspecified = was


def _divided(dtype=torch.int32):
    a = torch.tensor([7, -7, 100, 5, 0, 9, -3, 12], dtype=dtype)
    b = torch.tensor([2, 2, 0, 0, 0, 3, 0, 5], dtype=dtype)
    q, r = torch.empty_like(a), torch.empty_like(a)
    _divide[(1,)](q, r, a, b, BLOCK=8)
    return a, b, q, r


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_a_division_by_zero_gives_the_judges_arbitrary_values_and_the_rest_as_a_gpu(monitor, dtype):
    a, b, q, r = _divided(dtype)
    nonzero = b != 0
    # by a nonzero divisor: C's truncating division and remainder, as a GPU computes them
    assert q[nonzero].tolist() == [3, -3, 3, 2] and r[nonzero].tolist() == [1, -1, 0, 2]
    # by zero: not the interpreter's 0 (four lanes, each keyed by its dividend), and counted
    assert (q[~nonzero] != 0).all() and (r[~nonzero] != 0).all(), (q, r)
    assert monitor.unspecified.counts[DIVISION] == 8
    # the same dividends the same answers, as one compiled kernel gives one answer
    _, _, q2, r2 = _divided(dtype)
    assert torch.equal(q, q2) and torch.equal(r, r2)


def test_another_secret_other_answers_and_no_judge_the_interpreters_own(monitor):
    _, _, q, _ = _divided()
    monitor.unspecified = Unspecified(seed=100)
    _, _, other, _ = _divided()
    assert not torch.equal(q, other)
    monitor.unspecified = None
    _, b, plain, _ = _divided()
    assert (plain[b == 0] == 0).all()  # verify and an exported package run the interpreter as it is


@pytest.mark.parametrize("reorder", [False, True])
def test_a_reorderable_reshape_hands_its_elements_back_in_a_secret_order(monitor, reorder):
    x = torch.arange(32, dtype=torch.float32)
    y = torch.empty_like(x)
    _reshape[(1,)](y, x, REORDER_=reorder, BLOCK=32)
    if not reorder:
        assert torch.equal(y, x) and not monitor.unspecified.counts
        return
    assert not torch.equal(y, x) and torch.equal(y.sort().values, x), y  # the same elements, reordered
    assert monitor.unspecified.counts[REORDER] == 1
    again = torch.empty_like(x)
    _reshape[(1,)](again, x, REORDER_=True, BLOCK=32)
    assert torch.equal(again, y)  # fixed within the process, as one compiled kernel's layout is


def test_an_order_blind_use_of_a_reorder_keeps_its_value_and_a_sum_over_all_axes_is_not_counted(monitor):
    x = torch.arange(32, dtype=torch.float32)
    y = torch.empty(2)
    _reorder_then_sum[(1,)](y, x, BLOCK=32)
    assert y.tolist() == [x.sum().item()] * 2
    assert monitor.unspecified.counts[REORDER] == 1  # the kernel's own reorder, not the sum's flattening


def test_a_cat_may_reorder_and_does(monitor):
    x = torch.arange(32, dtype=torch.float32)
    y = torch.empty_like(x)
    _cat[(1,)](y, x, BLOCK=16)
    assert not torch.equal(y, x) and torch.equal(y.sort().values, x)


def test_a_failing_case_names_what_it_used():
    assert unspecified.hint({}) == "" and unspecified.hint({"unspecified": {}}) == ""
    said = unspecified.hint({"unspecified": {DIVISION: 4}})
    assert "an integer division or remainder by zero (4 lanes)" in said and "divide only by a nonzero" in said
    assert "can_reorder" not in said
    said = unspecified.hint({"unspecified": {REORDER: 2}})
    assert "(2 times)" in said and "can_reorder=False" in said and "nonzero" not in said
