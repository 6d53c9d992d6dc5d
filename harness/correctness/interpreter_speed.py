"""Two costs of the Triton interpreter that buy no result, removed (`install()`, from the launch
monitor's install, as interpreter_numerics is: the judge, verify's child and an exported package on
the CPU alike). What a kernel computes, and every way it can fail, stay as they are.

- **Overflow checks it drops.** For every integer add, sub and mul the interpreter builds an int32
  overflow check (both operands cast to int64, the operation again, two comparisons, an and) and
  hands it to device_assert, which drops it: assertions run only in debug mode, and the
  interpreter's options never enable it (a GPU compiles the same check away). About a quarter of
  the interpreter's time on a kernel's index arithmetic.
- **The language's builtins found again at every launch.** Each launch, and each call of a
  @triton.jit helper from a kernel, patches triton.language's builtins to the interpreter's
  semantics, finding them with inspect.getmembers over the language's modules and its tensor class
  (every attribute fetched and sorted). Now each module keeps the names a builtin was found under,
  listed as before until one listing was made with none of its members patched (a first launch),
  and again whenever its namespace has a size not seen since (a launch's patches add a few
  attributes, a new builtin adds one). At each launch each kept name is fetched and tested as
  before, in getmembers' order (by name): the same members are patched the same way, whatever an
  enclosing launch has patched already.
"""
from __future__ import annotations

import dataclasses
import inspect


def install() -> None:
    """Once per process; a no-op without the interpreter or where its internals have moved."""
    try:
        from triton.runtime import interpreter
        import triton.language as tl
    except ImportError:
        return
    _skip_dropped_overflow_checks(interpreter)
    _list_builtins_once(interpreter, tl)


def _skip_dropped_overflow_checks(interpreter) -> None:
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or getattr(options, "debug", True) \
            or not getattr(options, "sanitize_overflow", False):
        return
    builder.options = dataclasses.replace(options, sanitize_overflow=False)


def _list_builtins_once(interpreter, tl) -> None:
    original = getattr(interpreter, "_patch_builtin", None)
    patch_attr = getattr(interpreter, "_patch_attr", None)
    if original is None or patch_attr is None or getattr(original, "lists_once", False):
        return
    is_builtin = tl.core.is_builtin
    # per module or class: every name a builtin was found under, and the sizes of its namespace
    # those names are known to cover (none until it has been listed with nothing of it patched)
    listed: dict[int, tuple[object, set[int], list[str]]] = {}

    def patched_here(value) -> bool:  # one of the interpreter's wrappers, left by an enclosing launch
        # (a function of its module: Triton's own @triton.jit library is its InterpretedFunction objects)
        return inspect.isfunction(value) and value.__module__ == interpreter.__name__

    def names(pkg) -> list[str]:
        size = len(vars(pkg))
        known = listed.get(id(pkg))
        if known is None or known[0] is not pkg:
            known = listed[id(pkg)] = (pkg, set(), [])
        if size not in known[1]:  # list it as Triton does, and keep the names
            members = inspect.getmembers(pkg)
            found = {name for name, value in members if is_builtin(value)}
            known[2][:] = sorted(set(known[2]) | found)  # getmembers' order: by name
            # the names cover this size once they hold a listing made with nothing patched: every
            # name a builtin can be found under, in any state of the same namespace
            if known[1] or not any(patched_here(value) for _, value in members):
                known[1].add(size)
        return known[2]

    def _patch_builtin(pkg, builder, scope):
        for name in names(pkg):
            member = getattr(pkg, name, None)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    # listed now, before any launch (as the launch monitor is installed): a helper of Triton's own
    # library (tl.sum) patches triton.language.core, which no kernel's launch lists unpatched
    for pkg in (tl, tl.core, tl.tensor, tl.math, getattr(tl.core, "tensor_descriptor_base", None)):
        if pkg is not None:
            names(pkg)

    _patch_builtin.lists_once = True
    _patch_builtin.__wrapped__ = original
    interpreter._patch_builtin = _patch_builtin
