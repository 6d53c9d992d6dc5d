"""The interpreter without the work whose result it drops (harness/correctness/interpreter_speed.py):
a kernel computes the same bits, the same builtins are patched the same way at every launch, and a
kernel that calls a @triton.jit helper still runs.

The interpreter's patches of triton.language leak from one test to the next (a helper's call leaves
its patches in place), so the comparisons run in a fresh interpreter: the one test outside it runs
this file again in a process of its own, where the others run."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from harness.correctness import interpreter_speed, launches


@triton.jit
def _helper(x, factor):
    return x * factor + 7


@triton.jit
def _int_arith(out_ptr, x_ptr, factor, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    # int32 arithmetic that overflows: the dropped check would have flagged it, a GPU wraps
    tl.store(out_ptr + offs, _helper(x, factor) - x)


FRESH = "AUTOKERNEL_TEST_FRESH_INTERPRETER"
in_a_fresh_interpreter = pytest.mark.skipif(not os.environ.get(FRESH), reason="run by test_in_a_fresh_interpreter")


@pytest.mark.skipif(bool(os.environ.get(FRESH)), reason="this is the fresh interpreter")
def test_in_a_fresh_interpreter():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", __file__],
                          env={**os.environ, FRESH: "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "12 passed, 1 skipped" in proc.stdout, proc.stdout[-3000:]


def _run(x, factor):
    out = torch.empty_like(x)
    _int_arith[(1,)](out, x, factor, N=x.numel())
    return out


def _builder():
    return interpreter.interpreter_builder


@pytest.fixture
def as_shipped():
    """The interpreter as Triton ships it, for the length of one test; then as the judge runs it."""
    launches.install()
    builder = _builder()
    options, patch_builtin, np_dtype = builder.options, interpreter._patch_builtin, interpreter._get_np_dtype
    block_init, tensor_init = tl.core.block_type.__init__, tl.core.tensor.__init__
    patch_lang, helper_call = interpreter._patch_lang, interpreter.InterpretedFunction.__call__
    builder.options = dataclasses.replace(options, sanitize_overflow=True)
    interpreter._patch_builtin, interpreter._get_np_dtype = patch_builtin.__wrapped__, np_dtype.__wrapped__
    tl.core.block_type.__init__, tl.core.tensor.__init__ = block_init.__wrapped__, tensor_init.__wrapped__
    interpreter._patch_lang, interpreter.InterpretedFunction.__call__ = patch_lang.__wrapped__, helper_call.__wrapped__
    try:
        yield
    finally:
        builder.options, interpreter._patch_builtin, interpreter._get_np_dtype = options, patch_builtin, np_dtype
        tl.core.block_type.__init__, tl.core.tensor.__init__ = block_init, tensor_init
        interpreter._patch_lang, interpreter.InterpretedFunction.__call__ = patch_lang, helper_call


@in_a_fresh_interpreter
def test_installed_by_the_launch_monitor():
    launches.install()
    assert _builder().options.sanitize_overflow is False and _builder().options.debug is False
    assert getattr(interpreter._patch_builtin, "lists_once", False)
    assert getattr(interpreter._get_np_dtype, "kept", False)
    assert getattr(tl.core.block_type.__init__, "kept", False) and getattr(tl.core.tensor.__init__, "kept", False)
    assert getattr(interpreter._patch_lang, "helpers_once", False)
    assert getattr(interpreter.InterpretedFunction.__call__, "helpers_once", False)


@in_a_fresh_interpreter
def test_every_type_is_stored_as_the_same_numpy_dtype(as_shipped):
    shipped = interpreter._get_np_dtype
    interpreter_speed.install()
    kept = interpreter._get_np_dtype
    assert kept is not shipped
    scalars = [tl.int1, tl.int8, tl.uint8, tl.int16, tl.uint16, tl.int32, tl.uint32, tl.int64, tl.uint64,
               tl.float16, tl.bfloat16, tl.float32, tl.float64, tl.float8e5, tl.float8e4nv, tl.float8e4b15]
    types = scalars + [tl.pointer_type(tl.float16), tl.pointer_type(tl.int8)]
    types += [tl.block_type(t, [4, 8]) for t in types]
    for _ in range(2):  # the first lookup and the kept answer
        assert [kept(t) for t in types] == [shipped(t) for t in types]
    with pytest.raises(KeyError):  # a type the table lacks fails as it did
        kept(tl.void)


@in_a_fresh_interpreter
def test_a_kernel_computes_the_same_bits_with_and_without_the_dropped_work(as_shipped):
    x = torch.tensor([1, -5, 2**30, -(2**31), 2**31 - 1, 123456789, 0, 77], dtype=torch.int32)
    shipped = _run(x, 3)
    assert _builder().options.sanitize_overflow is True  # the check was built, and dropped
    interpreter_speed.install()
    assert _builder().options.sanitize_overflow is False
    judged = _run(x, 3)
    assert torch.equal(judged, shipped)
    assert torch.equal(judged, (x * 3 + 7) - x)  # int32 wraps, as a GPU's does


def _patched(fn) -> list[tuple[str, str]]:
    scope = interpreter._patch_lang(fn)
    try:
        return [(getattr(obj, "__name__", repr(obj)), name) for obj, name, _ in scope._changes]
    finally:
        scope.restore()


@in_a_fresh_interpreter
def test_the_same_builtins_are_patched_at_every_launch(as_shipped):
    fn = _int_arith.fn
    shipped = _patched(fn)
    interpreter_speed.install()
    assert _patched(fn) == shipped and _patched(fn) == shipped  # listed once, then reused
    assert len(shipped) > 100 and ("triton.language", "load") in shipped


def _patched_inside(fn, outer_fn) -> list[tuple[str, str]]:
    """What a helper's call patches inside a launch (whose patches are in place)."""
    outer = interpreter._patch_lang(outer_fn)
    try:
        return _patched(fn)
    finally:
        outer.restore()


@in_a_fresh_interpreter
def test_a_library_helper_inside_a_launch_patches_the_same_builtins(as_shipped):
    # tl.sum is Triton's own @triton.jit: its call inside a kernel patches triton.language.core
    helper = tl.standard.sum.fn
    assert any(value is tl.core for value in helper.__globals__.values())
    shipped = _patched_inside(helper, _int_arith.fn)
    interpreter_speed.install()
    assert _patched_inside(helper, _int_arith.fn) == shipped and len(shipped) > 50


def _sequence(helper, outer_fn) -> list[list[tuple[str, str]]]:
    """What each patch of a launch's life patches: the launch, a helper's call three times (all
    patched already), the launch's end (each undone, last first), and a helper's call again (the
    builtins are back)."""
    seen = []

    def patch(fn):
        scope = interpreter._patch_lang(fn)
        seen.append([(getattr(obj, "__name__", repr(obj)), name) for obj, name, _ in scope._changes])
        return scope

    outer = patch(outer_fn)
    helpers = [patch(helper) for _ in range(3)]
    for scope in [*reversed(helpers), outer]:
        scope.restore()
    patch(helper).restore()
    return seen


@in_a_fresh_interpreter
def test_a_helper_called_again_where_all_is_patched_patches_what_triton_would(as_shipped):
    helper = tl.standard.sum.fn
    shipped = _sequence(helper, _int_arith.fn)
    assert len(shipped[1]) > len(shipped[2]) == len(shipped[3])  # the builtins once, the rest every call
    interpreter_speed.install()
    assert _sequence(helper, _int_arith.fn) == shipped
    assert _sequence(helper, _int_arith.fn) == shipped  # again, with what the first run kept
    x = torch.arange(8, dtype=torch.int32)
    assert torch.equal(_run(x, 2), x * 2 + 7 - x)


@in_a_fresh_interpreter
def test_a_builtin_patched_by_an_enclosing_launch_is_listed_too(as_shipped):
    # the first listing may be made inside a launch (a helper's call), where the builtins are wrappers
    shipped = _patched(_int_arith.fn)
    outer = interpreter._patch_lang(_int_arith.fn)
    try:
        interpreter_speed.install()
        inner = interpreter._patch_lang(_int_arith.fn)
        inner.restore()
    finally:
        outer.restore()
    assert _patched(_int_arith.fn) == shipped
    x = torch.arange(8, dtype=torch.int32)
    assert torch.equal(_run(x, 2), x * 2 + 7 - x)


@in_a_fresh_interpreter
def test_a_module_that_gains_a_builtin_is_listed_again(as_shipped):
    interpreter_speed.install()
    before = _patched(_int_arith.fn)
    tl.extra_builtin_for_test = tl.load  # a builtin under a new name
    try:
        after = _patched(_int_arith.fn)
    finally:
        del tl.extra_builtin_for_test
    assert ("triton.language", "extra_builtin_for_test") in after and len(after) == len(before) + 1
    assert _patched(_int_arith.fn) == before


def _described(value) -> tuple:
    """Everything a block type or a tensor says of itself, by value and class."""
    def shape(t):
        return (type(t).__name__, type(t.values).__name__, [(type(v).__name__, getattr(v, "value", v)) for v in t.values],
                type(t.type.types).__name__, [(type(c).__name__, c.value) for c in t.type.types], str(t.type),
                [getattr(v, "type", None) is c for v, c in zip(t.values, t.type.types)])
    if isinstance(value, tl.block_type):
        return ("block", str(value.element_ty), shape(value.shape), value.numel, value.name, str(value))
    return ("tensor", value.handle, str(value.type), str(value.dtype), shape(value.shape), value.numel.value)


def _made(element, shapes: list) -> list:
    made = []
    for shape in shapes:
        block = tl.block_type(element, shape)
        made += [_described(block), _described(tl.core.tensor("handle", block))]
    made.append(_described(tl.core.tensor("scalar", element)))  # a scalar: no block, shape ()
    return made


def _refusal(shape) -> str:
    try:
        tl.block_type(tl.float32, shape)
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "accepted"


@in_a_fresh_interpreter
def test_block_types_and_tensors_say_what_tritons_own_say(as_shipped):
    import numpy as np
    shapes = [[16], [4, 8], [tl.constexpr(32), 2], tl.core.tuple([1, 64]), [2, 1, 8]]
    # refused by Triton (empty, not a power of two, a numpy int, a Python tuple, too many elements),
    # and a bool it takes as a 1: the same outcome, after a plain [4] or [1] has been kept too
    unusual = [[], [3, 8], [np.int64(4)], (4, 8), [2 ** 21], [True]]
    shipped = [_made(element, shapes) for element in (tl.float32, tl.bfloat16, tl.pointer_type(tl.int8))]
    shipped_refusals = [_refusal(shape) for shape in unusual]
    assert [r == "accepted" for r in shipped_refusals] == [False] * 5 + [True]
    interpreter_speed.install()
    for _ in range(2):  # worked out, then kept
        assert [_made(element, shapes) for element in (tl.float32, tl.bfloat16, tl.pointer_type(tl.int8))] == shipped
        assert [_refusal(shape) for shape in [[4], [1]] + unusual][2:] == shipped_refusals


@in_a_fresh_interpreter
def test_each_value_gets_a_shape_of_its_own(as_shipped):
    interpreter_speed.install()
    a, b = tl.block_type(tl.float32, [4, 8]), tl.block_type(tl.float32, [4, 8])
    assert a.shape is not b.shape and a.shape.values is not b.shape.values and a.shape.type is not b.shape.type
    assert a.shape.type.types[0] is not b.shape.type.types[0]
    a.shape._setitem(0, 2)  # what one value's shape is changed to stays with it
    assert b.shape.values == [4, 8] and tl.block_type(tl.float32, [4, 8]).shape.values == [4, 8]
    s, t = (tl.core.tensor(None, b) for _ in range(2))
    assert s.shape is not t.shape and s.shape.values[0] is not t.shape.values[0]
    s.shape.values[0].value = 99
    assert t.shape.values[0].value == 4 and tl.core.tensor(None, b).shape.values[0].value == 4
    x = torch.arange(8, dtype=torch.int32)
    assert torch.equal(_run(x, 2), x * 2 + 7 - x)


@triton.jit
def _row_stats(x):
    return tl.max(x, axis=0), tl.sum(x, axis=0)


@triton.jit
def _stats(out_ptr, x_ptr, N: tl.constexpr, REPEAT: tl.constexpr):
    # helpers called over and over in every program: the kernel's own, and Triton's (tl.max, tl.sum)
    pid = tl.program_id(0)
    x = tl.load(x_ptr + pid * N + tl.arange(0, N))
    acc = 0.0
    for i in tl.static_range(REPEAT):
        m, s = _row_stats(x + i)
        acc += m * s
    tl.store(out_ptr + pid, acc)


def _stats_run(x, repeat=3):
    out = torch.empty(x.shape[0], dtype=torch.float32)
    _stats[(x.shape[0],)](out, x, N=x.shape[1], REPEAT=repeat)
    return out


def _full_patches(run) -> tuple[object, int]:
    """run()'s result, and how many times the language was patched in full while it ran."""
    full = []
    patch_core = interpreter._patch_lang_core
    interpreter._patch_lang_core = lambda lang, scope: (full.append(lang), patch_core(lang, scope))[1]
    try:
        return run(), len(full)
    finally:
        interpreter._patch_lang_core = patch_core


def _language_state() -> dict:
    """What each attribute the interpreter patches holds, by where it was made: Triton's language,
    or the interpreter (its fresh closures of each call are alike)."""
    def made(value):
        inner = getattr(getattr(value, "fget", value), "func", getattr(value, "fget", value))
        return getattr(inner, "__module__", None) or type(value).__name__
    owners = (tl, tl.core, tl.math, tl.core.tensor, tl.core.dtype, tl.core.condition)
    # (constructors aside: no launch patches them, and the install replaces the tensor's)
    return {(getattr(o, "__name__", repr(o)), name): made(value) for o in owners for name, value in vars(o).items()
            if (callable(value) or isinstance(value, property)) and name != "__init__"}


@in_a_fresh_interpreter
def test_helpers_called_again_in_a_launch_compute_the_same_bits_and_patch_once_per_launch(as_shipped):
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    shipped, shipped_full = _full_patches(lambda: [_stats_run(x), _stats_run(x)])
    shipped_state = _language_state()
    interpreter_speed.install()
    judged, full = _full_patches(lambda: [_stats_run(x), _stats_run(x)])
    assert all(torch.equal(a, b) for a, b in zip(judged, shipped))
    want = torch.stack([(x + i).max(1).values * (x + i).sum(1) for i in range(3)]).sum(0)
    assert torch.allclose(judged[0], want, rtol=1e-5, atol=1e-5)
    # each launch patches in full, and each helper once in it (the kernel's own, tl.max, tl.sum and
    # what they call); shipped, every call of every helper in every program did
    assert full < shipped_full / 4 and full <= 2 * 8, (full, shipped_full)
    assert _language_state() == shipped_state  # each launch's end leaves the language as Triton's does


@triton.jit
def _noop():
    pass


@in_a_fresh_interpreter
def test_a_helper_patches_in_full_again_once_what_it_set_has_changed(as_shipped):
    interpreter_speed.install()
    monitor = launches.install()  # inside a launch's programs, where a helper's call is a device call
    monitor.in_triton, monitor.grid_dims = monitor.in_triton + 1, (1, 1, 1)
    outer = interpreter._patch_lang(_int_arith.fn)  # a launch's own patch, as its grid makes it
    try:
        _, full = _full_patches(lambda: [_noop() for _ in range(3)])
        assert full == 1  # the first call; the others found all it set in place
        patched = tl.static_range
        tl.static_range = lambda *args, **kwargs: patched(*args, **kwargs)  # changed since
        _, full = _full_patches(lambda: [_noop() for _ in range(2)])
        assert full == 1 and tl.static_range.__module__ == interpreter.__name__
        del tl.core.tensor.__bool__  # one the launch set on a class, undone
        _, full = _full_patches(_noop)
        assert full == 1 and tl.core.tensor.__bool__.__module__ == interpreter.__name__
    finally:
        outer.restore()
        monitor.in_triton -= 1
