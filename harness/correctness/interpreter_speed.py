"""Costs of the Triton interpreter that buy no result, removed (`install()`, from the launch
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
  enclosing launch has patched already. And where a module's names all hold what they held after
  a call that left no builtin among them (compared by identity; the few the language's own patches
  set anew at every call are tested one by one), there is nothing to patch and the loop is skipped:
  a call of tl.sum or tl.max, in every program, went through every name again where all was
  patched already: a quarter of a small reduction kernel's interpreted time.
- **A table of numpy dtypes built at every lookup.** The interpreter maps a Triton type to the
  numpy dtype it stores it as by building a dict of twenty types (each hashed) and looking one up,
  at every load, store, cast and constant: the most time of any one function in the judge's runs.
  Now each element type's answer is kept once found; pointers are uint64 as before.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import operator
from typing import Callable


def install() -> None:
    """Once per process; a no-op without the interpreter or where its internals have moved."""
    try:
        from triton.runtime import interpreter
        import triton.language as tl
    except ImportError:
        return
    _skip_dropped_overflow_checks(interpreter)
    _list_builtins_once(interpreter, tl)
    _np_dtypes_once(interpreter, tl)


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

    # per module or class, after a call that left none of its names holding a builtin: the names and
    # what each held then, compared by identity at the next call. A device-function call (tl.sum from
    # a kernel) patches the language again, as a launch does, where it is all patched already.
    clean: dict[int, list] = {}  # id -> [pkg, names, fetch their values, the values]

    def _patch_builtin(pkg, builder, scope):
        listed_names = names(pkg)
        last = clean.get(id(pkg))
        if last is not None and last[0] is pkg and last[1] == listed_names:
            try:
                now = last[2](pkg)
            except AttributeError:
                now = None
            if now is not None:
                # the names whose value changed since (the language's own patches set a few anew at
                # every call) are checked; the rest hold what held no builtin
                changed = list(itertools.compress(now, map(operator.is_not, now, last[3])))
                if not any(map(is_builtin, changed)):
                    last[3] = now
                    return  # nothing to patch: the loop below would find no builtin
        for name in listed_names:
            member = getattr(pkg, name, None)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)
        clean.pop(id(pkg), None)
        if listed_names:
            fetch = _values_of(listed_names)
            try:
                values = fetch(pkg)
            except AttributeError:  # a name listed but gone: checked in full every time
                return
            if not any(map(is_builtin, values)):
                clean[id(pkg)] = [pkg, list(listed_names), fetch, values]

    # listed now, before any launch (as the launch monitor is installed): a helper of Triton's own
    # library (tl.sum) patches triton.language.core, which no kernel's launch lists unpatched
    for pkg in (tl, tl.core, tl.tensor, tl.math, getattr(tl.core, "tensor_descriptor_base", None)):
        if pkg is not None:
            names(pkg)

    _patch_builtin.lists_once = True
    _patch_builtin.__wrapped__ = original
    interpreter._patch_builtin = _patch_builtin


def _values_of(names: list[str]) -> Callable[[object], tuple]:
    """What `names` hold on an object, as a tuple (one fetch in C for all of them)."""
    getter = operator.attrgetter(*names)
    return (lambda obj: (getter(obj),)) if len(names) == 1 else getter


def _np_dtypes_once(interpreter, tl) -> None:
    original = getattr(interpreter, "_get_np_dtype", None)
    if original is None or getattr(original, "kept", False):
        return
    pointer = original(tl.pointer_type(tl.float32))
    known: dict = {}  # element type -> numpy dtype, as the interpreter's table gives it

    def _get_np_dtype(tt_dtype):
        element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        if isinstance(element, tl.pointer_type):
            return pointer
        found = known.get(element)
        if found is None:
            found = known[element] = original(element)  # a type it lacks raises as before
        return found

    _get_np_dtype.kept = True
    _get_np_dtype.__wrapped__ = original
    interpreter._get_np_dtype = _get_np_dtype
