"""Compiler hints held to the values they are given in the judge's checked calls
(harness/correctness/compiler_hints.py), in this process's interpreter."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from harness.correctness import launches
from harness.correctness.program_order import ProgramOrders


@triton.jit
def _scaled_rows(y_ptr, x_ptr, n_cols, BLOCK: tl.constexpr):
    """One row per program, its start promised to be a multiple of 16 elements."""
    row = tl.program_id(0)
    start = tl.multiple_of(row * n_cols, 16)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + start + cols, mask=cols < n_cols)
    tl.store(y_ptr + start + cols, x * 2.0, mask=cols < n_cols)


@triton.jit
def _tiled(y_ptr, x_ptr, n, BLOCK: tl.constexpr):
    """The tutorial's idiom: clamped offsets promised contiguous and aligned (the last tile's are not)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    safe = tl.max_contiguous(tl.multiple_of(tl.where(offs < n, offs, 0), BLOCK), BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + safe) + 1.0, mask=offs < n)


@triton.jit
def _broadcast_rows(y_ptr, x_ptr, n_cols, GROUP: tl.constexpr, CLAIM: tl.constexpr, BLOCK: tl.constexpr):
    """Each group of GROUP lanes reads one address; runs of CLAIM are promised."""
    cols = tl.arange(0, BLOCK)
    src = tl.max_constancy(cols // GROUP, CLAIM)
    tl.store(y_ptr + cols, tl.load(x_ptr + src), mask=cols < n_cols)


@pytest.fixture
def monitor():
    m = launches.install()
    was, m.orders = m.orders, ProgramOrders(seed=7)
    try:
        yield m
    finally:
        m.orders = was


def _findings(monitor, launch):
    with monitor.orders.compared():
        launch()
    return monitor.orders.take_findings()


def test_a_multiple_of_that_holds_passes_and_one_that_does_not_is_named(monitor):
    x = torch.randn(4, 64)
    y = torch.empty_like(x)
    assert _findings(monitor, lambda: _scaled_rows[(4,)](y, x, 64, BLOCK=64)) == []
    assert torch.equal(y, x * 2)
    x = torch.randn(4 * 40)
    found = _findings(monitor, lambda: _scaled_rows[(4,)](torch.empty_like(x), x, 40, BLOCK=64))
    assert len(found) == 1, found
    assert "false compiler hint in _scaled_rows (test_compiler_hints.py:" in found[0]
    assert "tl.multiple_of(..., 16) is given the value " in found[0] and ", not a multiple of 16" in found[0]


def test_the_tutorials_clamped_tile_is_not_refused(monitor):
    x = torch.randn(100)
    y = torch.empty_like(x)
    assert _findings(monitor, lambda: _tiled[(2,)](y, x, 100, BLOCK=64)) == []
    assert torch.equal(y, x + 1)


def test_a_constancy_that_does_not_hold_is_named(monitor):
    x = torch.randn(64)
    assert _findings(monitor, lambda: _broadcast_rows[(1,)](torch.empty(64), x, 64, GROUP=4, CLAIM=4, BLOCK=64)) == []
    found = _findings(monitor, lambda: _broadcast_rows[(1,)](torch.empty(64), x, 64, GROUP=2, CLAIM=4, BLOCK=64))
    assert len(found) == 1 and "tl.max_constancy(..., 4) is given a run along dim 0 that is not constant (0, 0, 1, 1)" \
        in found[0], found


def test_outside_a_checked_call_nothing_is_checked(monitor):
    x = torch.randn(4 * 40)
    _scaled_rows[(4,)](torch.empty_like(x), x, 40, BLOCK=64)
    assert monitor.orders.take_findings() == []
