"""A @triton.jit function called from host code raises, as Triton's JITFunction does on a GPU
(harness/correctness/launches.py `_refuse_host_calls`); the interpreter alone would run it on the
host. Called from a launch's programs it is a device function, as before."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from harness.correctness import launches


@triton.jit
def _halves(out_ptr, x_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, tl.cdiv(tl.load(x_ptr + offs), 2))  # a @triton.jit helper, in the kernel


def _launch(x: torch.Tensor, grid) -> torch.Tensor:
    out = torch.empty_like(x)
    _halves[grid](out, x, N=x.numel())
    return out


@pytest.fixture(autouse=True)
def monitor():
    return launches.install()


def test_a_jit_function_called_on_the_host_raises_with_tritons_words():
    with pytest.raises(RuntimeError, match=r"Cannot call @triton.jit'd outside of the scope of a kernel.*triton\.cdiv"):
        tl.cdiv(10, 4)
    assert triton.cdiv(10, 4) == 3  # the host's own


def test_called_from_a_grid_callable_it_raises_too():
    # a GPU works out the grid on the host, before any program runs
    x = torch.arange(8, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="outside of the scope of a kernel"):
        _launch(x, lambda meta: (tl.cdiv(8, meta["N"]),))


def test_a_launch_made_from_the_grid_callable_leaves_it_host_code():
    # a red team launched a kernel inside the grid callable, then called tl.cdiv there: it passed
    x = torch.arange(8, dtype=torch.int32)

    def grid(meta):
        _launch(x, (1,))
        return (tl.cdiv(8, meta["N"]),)
    with pytest.raises(RuntimeError, match="outside of the scope of a kernel"):
        _launch(x, grid)


def test_called_from_a_launchs_programs_it_is_a_device_function():
    x = torch.arange(8, dtype=torch.int32)
    assert torch.equal(_launch(x, (1,)), (x + 1) // 2)
    assert torch.equal(_launch(x, lambda meta: (triton.cdiv(8, meta["N"]),)), (x + 1) // 2)
    with pytest.raises(RuntimeError, match="outside of the scope of a kernel"):  # and after the launch, not
        tl.cdiv(10, 4)


def test_the_refusal_is_watched_for_tampering(monitor):
    from triton.runtime import interpreter
    points = launches.entry_points()
    assert points["triton.runtime.interpreter.InterpretedFunction.__call__"] is interpreter.InterpretedFunction.__call__
