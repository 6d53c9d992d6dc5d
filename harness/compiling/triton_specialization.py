"""Triton's GPU compiler driven from a process whose kernels ran in the interpreter: the JITFunction
behind a recorded launch, Triton's own launch-time specialization of its arguments for a GPU
backend, and the context in which interpreted functions become compilable again.

harness/compiling/target_compile.py compiles what these produce and reads the resources of the result.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Callable


def is_autotuned(raw) -> bool:
    """Whether a kernel's raw function sits behind @triton.autotune (under @triton.heuristics too)."""
    found = raw.__globals__.get(raw.__name__)
    while found is not None and getattr(found, "fn", None) is not None and not hasattr(found, "configs"):
        found = found.fn  # heuristics over autotune
    return hasattr(found, "configs")


def _jit_function(raw):
    """The JITFunction of a kernel's raw function: the module's own (its do_not_specialize and other
    options kept) when the name still refers to it, else a fresh one."""
    from triton.runtime.jit import JITFunction
    found = raw.__globals__.get(raw.__name__)
    while found is not None and not isinstance(found, JITFunction) and hasattr(found, "fn"):
        found = found.fn  # autotuner / heuristics wrappers
    return found if isinstance(found, JITFunction) and found.fn is raw else JITFunction(raw)


def specialize(record, backend):
    """Triton's own launch-time specialization, run for the target backend: the same signature,
    constexprs (ints equal to 1, None arguments) and divisibility-by-16 attributes a GPU launch of
    these arguments would compile."""
    from triton.compiler import ASTSource
    from triton.runtime.jit import create_function_from_signature
    jf = _jit_function(record.fn)
    kwargs = {**record.args, **record.options}
    binder = create_function_from_signature(jf.signature, jf.params, backend)
    bound, specialization, options = binder(**kwargs)
    options, signature, constexprs, attrs = jf._pack_args(backend, kwargs, bound, specialization, options)
    return ASTSource(jf, signature, constexprs, attrs), options


# Triton's own functions (its standard library) as JITFunctions, by the InterpretedFunction they
# replace (held, so its id is not reused): made once per process, by the zygote before it forks a
# worker (`convert_tritons_own`), where each lowering made them again (a JITFunction reads its
# source: about 15 ms for the fifty of them, at every stage that launched something new). A
# candidate's functions are converted at every compile: their globals are the candidate's.
_TRITONS_OWN: dict[int, tuple[Any, Any]] = {}


def _tritons_own(fn) -> bool:
    module = getattr(fn, "__module__", None) or ""
    return module == "triton" or module.startswith("triton.")


def convert_tritons_own() -> None:
    """Make Triton's own JITFunctions now (the zygote's preload), not in every worker it forks."""
    with compiled_mode([]):
        pass


@contextmanager
def compiled_mode(records):
    """Under TRITON_INTERPRET=1 every @triton.jit function, Triton's standard library included, is an
    InterpretedFunction, which code generation cannot call; and a device-function call during an
    interpreted run leaves triton.language.core's builtins patched to the interpreter's semantics.
    For the duration of the compile, every InterpretedFunction the kernels can see (their globals and
    closures, triton.* modules) becomes a JITFunction of the same Python function, leaked patches are
    put back, and the interpret knob is off. Everything is restored on exit."""
    import triton
    if not triton.knobs.runtime.interpret:
        yield
        return
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    swapped: dict[int, Any] = {}
    undo: list[Callable[[], None]] = []

    def put(namespace: dict, key: str, value) -> None:
        original, namespace[key] = namespace[key], value
        undo.append(lambda: namespace.__setitem__(key, original))

    def convert(itf):
        if id(itf) not in swapped:
            kept = _TRITONS_OWN.get(id(itf))
            if kept is not None and kept[0] is itf and kept[1].fn is itf.fn:  # not re-pointed since
                swapped[id(itf)] = kept[1]
            else:
                swapped[id(itf)] = JITFunction(itf.fn, **itf.kwargs)
                if _tritons_own(itf.fn):
                    _TRITONS_OWN[id(itf)] = (itf, swapped[id(itf)])
            scan_function(itf.fn)
        return swapped[id(itf)]

    scanned: set[int] = set()  # namespaces already scanned (each held by a module or function we keep)

    def scan(namespace: dict) -> None:
        if id(namespace) in scanned:  # a module's functions share its namespace: once is enough
            return
        scanned.add(id(namespace))
        for key, value in list(namespace.items()):
            if isinstance(value, InterpretedFunction):
                put(namespace, key, convert(value))

    def scan_function(fn) -> None:
        scan(fn.__globals__)
        for cell in getattr(fn, "__closure__", None) or ():
            if isinstance(cell.cell_contents, InterpretedFunction):
                original, cell.cell_contents = cell.cell_contents, convert(cell.cell_contents)
                undo.append(lambda cell=cell, original=original: setattr(cell, "cell_contents", original))

    for name, mod in list(sys.modules.items()):
        if (name == "triton" or name.startswith("triton.")) and mod is not None:
            scan(vars(mod))
    # a tensor's member functions (x.max(), x.sum()): on a GPU the class holds the JITFunction
    # itself; under the interpreter, a wrapper holding the InterpretedFunction, which code
    # generation would run on IR values. The JITFunction stands there for the compile.
    tensor_cls = sys.modules["triton.language"].core.tensor
    for key, value in list(vars(tensor_cls).items()):
        held = _member_function_of(value, InterpretedFunction)
        if held is not None:
            setattr(tensor_cls, key, convert(held))
            undo.append(lambda key=key, value=value: setattr(tensor_cls, key, value))
    for record in records:
        scan_function(record.fn)
    for namespace, key, original in _leaked_interpreter_patches():
        put(namespace, key, original)
    try:
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = False  # constexpr functions return constexprs again
            yield
    finally:
        for restore in reversed(undo):
            restore()


def _member_function_of(value, interpreted: type):
    """The @triton.jit function a tensor member function forwards to, where Triton's
    _tensor_member_fn made a wrapper for it (one free variable, `fn`, holding it); else None."""
    code, cells = getattr(value, "__code__", None), getattr(value, "__closure__", None)
    if code is None or not cells or code.co_freevars != ("fn",):
        return None
    held = cells[0].cell_contents
    return held if isinstance(held, interpreted) else None


# What triton.runtime.interpreter._patch_lang_core sets on a language module besides builtins.
_INTERPRETER_MODULE_PATCHES = ("range", "static_range", "static_assert", "static_print", "multiple_of",
                               "max_contiguous", "max_constancy", "reduce", "associative_scan")


def _leaked_interpreter_patches():
    """(namespace, name, original) for each attribute of triton.language / triton.language.core that
    still holds the interpreter's replacement. A patched builtin keeps its original as the lambda's
    keyword default `member`; the other patched names are recovered from the sibling module."""
    import triton.language as tl
    from triton.language import core

    def interpreter_made(value) -> bool:
        inner = getattr(value, "func", value)  # functools.partial
        return inner is print or getattr(inner, "__module__", None) == "triton.runtime.interpreter"

    found = []
    for mod, sibling in ((core, tl), (tl, core)):
        namespace = vars(mod)
        for key, value in list(namespace.items()):
            if not callable(value) or not interpreter_made(value) or hasattr(value, "fn"):
                continue
            member = (getattr(value, "__kwdefaults__", None) or {}).get("member")
            if member is not None and core.is_builtin(member):
                found.append((namespace, key, member))
            elif key in _INTERPRETER_MODULE_PATCHES and not interpreter_made(getattr(sibling, key, print)):
                found.append((namespace, key, getattr(sibling, key)))
    return found

