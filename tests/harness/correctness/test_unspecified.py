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


@triton.jit
def _shift(y_ptr, x_ptr, s_ptr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    x, s = tl.load(x_ptr + lanes), tl.load(s_ptr + lanes)
    tl.store(y_ptr + lanes, x << s)
    tl.store(y_ptr + BLOCK + lanes, x >> s)


def test_a_shift_past_the_bit_width_gives_the_judges_values_and_one_within_it_a_gpus(monitor):
    x = torch.tensor([1, 3, -8, 5, 1, 7, 2, 9], dtype=torch.int32)
    s = torch.tensor([1, 2, 1, 0, 32, 40, -1, 31], dtype=torch.int32)
    y = torch.empty(16, dtype=torch.int32)
    _shift[(1,)](y, x, s, BLOCK=8)
    assert y[:4].tolist() == [2, 12, -16, 5] and y[8:12].tolist() == [0, 0, -4, 5]
    assert y[7].item() == -2**31 and y[15].item() == 0  # 31 is within the width: 9 << 31 keeps its low bit
    assert (y[4:7] != 0).all() and monitor.unspecified.counts[unspecified.SHIFT] == 6, y


@triton.jit
def _arg(i_ptr, x_ptr, LEFT: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.arange(0, 4)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    x = tl.load(x_ptr + rows)
    tl.store(i_ptr + tl.arange(0, 4), tl.argmax(x, 1, tie_break_left=LEFT))
    tl.store(i_ptr + 4 + tl.arange(0, 4), tl.argmin(x, 1, tie_break_left=LEFT))


@pytest.mark.parametrize("left", [True, False])
def test_a_tie_break_fast_argmax_picks_a_secret_lane_of_the_tie(monitor, left):
    x = torch.zeros(4, 64)
    x[1, 5] = 1.0  # row 1: one maximum; rows 0, 2, 3 tie everywhere
    x[3, 7] = x[3, 9] = -1.0  # row 3: a tie at the minimum too
    got = torch.empty(8, dtype=torch.int32)
    _arg[(1,)](got, x, LEFT=left, BLOCK=64)
    top, low = got[:4].tolist(), got[4:].tolist()
    assert top[1] == 5 and low[3] in (7, 9)  # always one of the extremes
    assert all(x[r, i] == x[r].max() for r, i in enumerate(top)) and all(x[r, i] == x[r].min() for r, i in enumerate(low))
    if left:  # the leftmost, as a GPU's tie_break_left gives too
        assert top == [0, 5, 0, 0] and low[:3] == [0, 0, 0] and low[3] == 7 and not monitor.unspecified.counts
    else:
        assert top[0] != 0 and monitor.unspecified.counts[unspecified.TIE] == 2
        again = torch.empty(8, dtype=torch.int32)
        _arg[(1,)](again, x, LEFT=False, BLOCK=64)
        assert torch.equal(again, got)  # fixed within the process


@triton.jit
def _minus(a, b):
    return a - b


@triton.jit
def _plus(a, b):
    return a + b


@triton.jit
def _online_max_sum(m1, s1, m2, s2):
    """A softmax denominator's (max, sum of exp(x - max)) pairs: associative and commutative."""
    m = tl.maximum(m1, m2)
    return m, s1 * tl.exp(m1 - m) + s2 * tl.exp(m2 - m)


@triton.jit
def _combines(out_ptr, x_ptr, i_ptr, KIND: tl.constexpr, BLOCK: tl.constexpr):
    lanes = tl.arange(0, BLOCK)
    if KIND == 0:  # not associative: a left fold gives x0 - x1 - ... - x(n-1)
        tl.store(out_ptr, tl.reduce(tl.load(x_ptr + lanes), 0, _minus))
    elif KIND == 1:  # integers: any order, the same sum
        tl.store(i_ptr + tl.arange(0, 1), tl.reduce(tl.load(i_ptr + 1 + lanes), 0, _plus, keep_dims=True))
    elif KIND == 2:
        x = tl.load(x_ptr + lanes)
        m, s = tl.reduce((x, tl.zeros([BLOCK], tl.float32) + 1.0), 0, _online_max_sum)
        tl.store(out_ptr, m)
        tl.store(out_ptr + 1, s)
    elif KIND == 3:  # scans: not associative, then integers
        tl.store(out_ptr + lanes, tl.associative_scan(tl.load(x_ptr + lanes), 0, _minus))
    else:
        tl.store(i_ptr + 1 + lanes, tl.associative_scan(tl.load(i_ptr + 1 + lanes), 0, _plus))


def test_a_combine_of_the_kernels_own_is_applied_in_a_tree_as_on_a_gpu(monitor):
    x = torch.arange(1.0, 17.0)
    out, ints = torch.zeros(16), torch.arange(17, dtype=torch.int32)
    _combines[(1,)](out, x, ints, KIND=0, BLOCK=16)
    left_fold = (x[0] - x[1:].sum()).item()
    assert out[0].item() != left_fold  # what the interpreter alone gives, and a GPU does not
    _combines[(1,)](out, x, ints, KIND=1, BLOCK=16)
    assert ints[0].item() == sum(range(1, 17))
    _combines[(1,)](out, x, ints, KIND=2, BLOCK=16)
    assert out[0].item() == 16.0 and out[1].item() == pytest.approx(torch.exp(x - 16).sum().item(), rel=1e-6)
    _combines[(1,)](out, x, ints, KIND=3, BLOCK=16)
    sequential = [x[0].item()]
    for v in x[1:].tolist():
        sequential.append(sequential[-1] - v)
    assert out[0].item() == 1.0 and out.tolist() != sequential
    ints = torch.arange(17, dtype=torch.int32)
    _combines[(1,)](out, x, ints, KIND=4, BLOCK=16)
    assert ints[1:].tolist() == torch.cumsum(torch.arange(1, 17), 0).tolist()
    assert monitor.unspecified.counts[unspecified.COMBINE] == 5
    monitor.unspecified = None  # outside the judge: the interpreter's left fold
    _combines[(1,)](out, x, ints, KIND=0, BLOCK=16)
    assert out[0].item() == left_fold
