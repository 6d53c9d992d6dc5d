"""What a kernel file may reference through the modules it imports: an allow-list, checked on
every attribute chain of the file whether or not the chain runs while judged.

A kernel needs torch's tensor API and dtypes, Triton's jit and its language, a little of the
standard library and, for CUDA C++, the project's launcher. Whatever else a module reaches
(serialization, torch._C, operator registration, hubs, processes, files, compilers of Python
code) is code that no judgement needs and that a winner would carry into a user's process: a
dormant gadget in a branch the judge never takes is refused here, before anything imports it.

`refusal(dotted, allowed)` names why `torch.serialization.pickle.loads` (say) is refused, or ''.
The rules, outermost module first:
- the longest prefix of the name that is a module the file may import is where the check starts;
- the next name must not be private (`torch._C`), and where a module lists what it offers
  (MODULE_NAMES) it must be listed; elsewhere it must not be refused (REFUSED_NAMES);
- a name that is itself a module (`torch.hub`, `typing.types`) is refused unless the file may
  import it, so a chain cannot walk out of an allowed module into one that is not.
"""
from __future__ import annotations

import sys
import types

# torch's modules a kernel file may reach besides torch itself (torch.cuda only through
# MODULE_NAMES). Not torch.utils.weak: a weak reference's callback runs when the judge drops an
# output, outside any timed region, and a cache keyed by tensors needs no weak reference.
TORCH_MODULES = ("torch.cuda", "torch.version", "torch.types")
# a KernelBench ModelNew may also build modules and use PyTorch's compute for the parts it keeps
MODEL_MODULES = ("torch.nn", "torch.nn.functional", "torch.nn.init", "torch.utils.cpp_extension",
                 "torch.linalg", "torch.fft", "torch.special")

# Modules whose every reachable name is listed: what a kernel needs of them and nothing more.
MODULE_NAMES = {
    # device facts and the current stream; not streams of its own, graphs, events, the allocator
    "torch.cuda": frozenset({
        "is_available", "current_device", "device_count", "device", "get_device_capability",
        "get_device_properties", "get_device_name", "current_stream", "default_stream", "synchronize",
        "is_bf16_supported", "is_tf32_supported", "OutOfMemoryError"}),
    "triton": frozenset({
        "jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2", "language", "tools",
        "constexpr_function", "must_use_result", "OutOfResources", "CompilationError", "TritonError"}),
    "triton.tools": frozenset({"tensor_descriptor"}),
    # building a ModelNew's CUDA C++ from the text in the file; not from files on disk
    "torch.utils.cpp_extension": frozenset({"load_inline", "CUDA_HOME"}),
    "harness.cuda_launcher": frozenset({"load_launcher", "dtype_code", "LaunchError", "LaunchBuildError"}),
    "harness.cuda_build": frozenset({"load_cuda", "CudaBuildError"}),
}

# Names of torch that are not the tensor API: files and serialization (load, save, from_file),
# operator registration and raw dispatch (ops, classes, library), Python compilers (compile, jit),
# hubs and packages, processes and threads, the profiler and the test helpers; and the ways into
# and out of numpy and foreign buffers (a kernel's compute stays in torch and its own launches).
# typing and functools: what evaluates a string annotation as code (get_type_hints, and
# singledispatch's register, which calls it): text the check cannot read.
REFUSED_NAMES = {
    "torch": frozenset({
        "load", "save", "from_file", "serialization", "ops", "classes", "library", "compile", "compiler",
        "jit", "hub", "package", "multiprocessing", "distributed", "utils", "fx", "export", "onnx",
        "profiler", "testing", "overrides", "autograd", "backends", "func", "futures", "monitor",
        "set_default_device", "set_default_dtype", "use_deterministic_algorithms", "storage",
        "UntypedStorage", "TypedStorage", "Storage", "set_printoptions", "from_numpy", "frombuffer",
        "from_dlpack", "to_dlpack"}),
    "typing": frozenset({"get_type_hints", "ForwardRef", "evaluate_forward_ref"}),
    "functools": frozenset({"singledispatch", "singledispatchmethod"}),
}


# imported where the check needs them, so that its answer never depends on what the process
# imported before (the judge's processes have all of them already; Triton is listed, not imported)
INTROSPECTED = ("torch", "math", "functools", "typing", "dataclasses")


def _module(name: str) -> types.ModuleType | None:
    """The module named, imported if it is one the check looks into; else only if already imported."""
    if name in INTROSPECTED and name not in sys.modules:
        import importlib
        importlib.import_module(name)
    return sys.modules.get(name)


def is_module(name: str) -> bool:
    parent, _, attr = name.rpartition(".")
    if name in sys.modules:
        return True
    owner = _module(parent)
    return owner is not None and isinstance(getattr(owner, attr, None), types.ModuleType)


# what a class's or a function's dunder names a kernel file uses; any other (`__reduce__`,
# `__class__.__base__`) walks out of the kernel's own objects
DUNDERS = frozenset({"__init__", "__name__", "__qualname__", "__doc__", "__post_init__", "__enter__", "__exit__",
                     "__call__", "__len__", "__getitem__", "__setitem__", "__iter__", "__next__", "__contains__",
                     "__eq__", "__ne__", "__hash__", "__repr__", "__str__"})


def refusal(dotted: str, allowed: tuple[str, ...], module_allowed) -> str:
    """Why the file may not reference `dotted` (a chain rooted in an import), or ''."""
    parts = dotted.split(".")
    private = next((p for p in parts[1:] if p.startswith("_") and p not in DUNDERS), None)
    if private is not None:
        return f"{dotted}: {private} is private"
    for i in range(len(parts), 0, -1):
        base = ".".join(parts[:i])
        if module_allowed(base, allowed):
            break
    else:
        return f"{parts[0]} is not a module the file may import"
    rest = parts[i:]
    if not rest:
        return ""
    name, full = rest[0], f"{base}.{rest[0]}"
    if name.startswith("_"):
        return f"{full} is private to {base}"
    listed = MODULE_NAMES.get(base)
    if listed is not None and name not in listed:
        return f"{full} is not among what a kernel uses of {base} ({', '.join(sorted(listed))})"
    if name in REFUSED_NAMES.get(base, ()):
        return (f"{full} is not a kernel's business (files, serialization, registration, compilers, "
                "processes, numpy, code in strings)")
    if is_module(full) and not module_allowed(full, allowed):
        return f"{full} is a module the file may not import"
    return ""
