"""Everything a kernel file may name: the one allow-list, written for kernels.

A kernel needs its contract's names, Triton's jit and language, a little math, tensor metadata,
allocation and views, a few builtins and, for CUDA C++, the project's launcher. Nothing else: a
name, attribute or call that is not listed here is refused before import (harness/isolation/
static_check.py walks the file; harness/isolation/cuda_surface.py reads CUDA C++ text), wherever
it stands in the file and whether or not it runs while judged. New tricks are refused because they
were never granted, not because someone foresaw them (a storage's native file write, a host-side
`apply_`). playbook/rules.md and the LLM's prompt show this list in words (`in_words()`), so a
refusal is never a surprise; tests/harness/isolation/test_static_check.py keeps them agreeing.

Resolution of `a.b.c`:
- rooted in an import: the longest prefix that is a module in MODULES names what may follow it
  (a set, or PUBLIC: the module's own public list, `__all__`); a leaf that is a class may be
  followed by what CLASSES lists for it; past a leaf, the rest are attributes of a value;
- on any other value: VALUE_ATTRIBUTES (MODEL_VALUE_ATTRIBUTES added for a KernelBench ModelNew),
  or an attribute the file itself defines (`self.scale = ...`, a method) that no tensor or
  storage has;
- never a name that begins with an underscore (`x._typed_storage()`), except `super().__init__`.
"""
from __future__ import annotations

import builtins
import functools

# The contract's own names: what the judge reads from a kernel file (DESIGN.md, "The kernel file";
# docs/judge.md for the backward; harness/cuda_build.py for the CUDA C++ ones).
CONTRACT_NAMES = ("KERNEL_TYPE", "BACKEND", "TUNABLES", "CONSTRAINTS", "CONFIG", "kernel_fn",
                  "backward_fn", "MUTATES_GRAD_OUT", "CUDA_KERNELS", "CUDA_HOST", "FUNCTIONS")
# The contract's functions and their leading tensor parameters before the type's own: a backward
# is held to the same surface as the forward, its grad_out and out followed as tensors like x is.
CONTRACT_FUNCTIONS = {"kernel_fn": (), "backward_fn": ("grad_out", "out")}

PUBLIC = "public"  # a module's own public list (its __all__): Triton's language is device code

# Module -> what a kernel may name in it. Importing a module not listed here is refused.
MODULES: dict[str, frozenset[str] | str] = {
    "torch": frozenset({
        # allocation
        "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "full", "full_like",
        # dtypes, devices and their facts
        "float16", "float32", "float64", "bfloat16", "half", "float", "double", "int8", "int16", "int32", "int64",
        "uint8", "bool", "long", "int", "dtype", "device", "Size", "Tensor", "finfo", "iinfo",
        "cuda", "version", "types", "is_tensor", "is_floating_point", "no_grad", "inference_mode"}),
    # device facts and the current stream; not streams of its own, graphs, events, the allocator
    "torch.cuda": frozenset({
        "is_available", "current_device", "device_count", "device", "get_device_capability",
        "get_device_properties", "get_device_name", "current_stream", "default_stream", "synchronize",
        "is_bf16_supported", "is_tf32_supported", "OutOfMemoryError"}),
    "torch.version": frozenset({"cuda", "hip"}),
    "torch.types": frozenset({"Device", "Number"}),
    "triton": frozenset({
        "jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2", "language", "tools",
        "constexpr_function", "must_use_result", "OutOfResources", "CompilationError", "TritonError"}),
    "triton.language": PUBLIC,
    "triton.language.math": PUBLIC,
    "triton.language.extra": frozenset({"libdevice", "cuda"}),
    "triton.language.extra.libdevice": PUBLIC,
    "triton.language.extra.cuda": frozenset({"libdevice"}),
    "triton.language.extra.cuda.libdevice": PUBLIC,
    # the host side of Hopper's TMA: a plain descriptor of a tensor
    "triton.tools": frozenset({"tensor_descriptor"}),
    "triton.tools.tensor_descriptor": frozenset({"TensorDescriptor"}),
    "math": PUBLIC,
    "typing": frozenset({"Optional", "Tuple", "List", "Dict", "Union", "Sequence", "Any", "Callable"}),
    "__future__": frozenset({"annotations"}),
}
# A CUDA C++ kernel builds and launches through the project's loaders, which cache and observe it.
CUDA_MODULES: dict[str, frozenset[str] | str] = {
    "harness.cuda_launcher": frozenset({"load_launcher", "dtype_code", "LaunchError", "LaunchBuildError"}),
    "harness.cuda_build": frozenset({"load_cuda", "CudaBuildError"}),
}
# A KernelBench ModelNew is an nn.Module that may keep some of PyTorch's compute and build CUDA C++
# from text in the file (load_inline; not from files on disk).
MODEL_MODULES: dict[str, frozenset[str] | str] = {
    "torch.nn": "layers",
    "torch.nn.functional": "functions",
    "torch.nn.init": "functions",
    "torch.utils": frozenset({"cpp_extension"}),
    "torch.utils.cpp_extension": frozenset({"load_inline", "CUDA_HOME"}),
}
# What may follow a class a module offers.
CLASSES = {
    "triton.tools.tensor_descriptor.TensorDescriptor": frozenset({"from_tensor"}),
}

# Attributes of any value: tensor metadata, allocation, views and casts; device facts; Triton's
# values inside a jit function; what a dict, list or string of sizes needs.
TENSOR_METADATA = frozenset({"shape", "stride", "size", "dtype", "device", "numel", "dim", "ndim", "element_size",
                             "itemsize", "is_contiguous", "data_ptr", "storage_offset", "layout",
                             "is_floating_point", "T", "mT"})
# Facts that differ between a judged call and a served one while the values do not, so that a
# branch on them is a kernel judged on one path and served on another. Named in a refusal so that
# it says why (they are simply not on the list above). `device` stays: outputs are allocated on it,
# and a grid is sized by the device's multiprocessors.
TELLS = {
    "requires_grad": "says how the model is run (training, torch.no_grad, inference_mode, a frozen weight, a "
                     "compiled graph), not what the values are: a branch on it is judged on one path and served "
                     "on another, and a kernel's arithmetic never depends on it",
    "is_cuda": "tells the CPU the judge may run on from the GPU a winner is served on; allocate with "
               "device=x.device and size a grid by torch.cuda.get_device_properties where a GPU is present",
}
TENSOR_ALLOCATION = frozenset({"new_empty", "new_zeros", "new_full", "new_empty_strided", "empty_like",
                               "zero_", "fill_", "clone", "copy_"})
TENSOR_VIEWS = frozenset({"view", "reshape", "contiguous", "transpose", "permute", "expand", "expand_as",
                          "unsqueeze", "squeeze", "flatten", "unflatten", "narrow", "view_as", "reshape_as", "t",
                          "movedim", "split", "chunk", "select", "detach"})
TENSOR_CASTS = frozenset({"to", "float", "half", "bfloat16", "double", "int", "long", "bool", "type"})
DEVICE_FACTS = frozenset({"type", "index", "multi_processor_count", "major", "minor", "name", "total_memory",
                          "warp_size", "L2_cache_size", "cuda_stream", "max", "min", "eps", "bits"})
TRITON_VALUES = frozenset({"to", "dtype", "element_ty", "shape", "reshape", "trans", "permute", "broadcast_to",
                           "expand_dims", "split", "sum", "max", "min", "argmax", "argmin", "cumsum", "value",
                           "load", "store", "primitive_bitwidth", "is_floating", "is_fp16", "is_bf16", "is_fp32"})
PYTHON_VALUES = frozenset({"get", "items", "keys", "values", "setdefault", "update", "append", "extend", "pop",
                           "join", "copy", "index", "count", "startswith", "endswith", "lower", "upper"})
VALUE_ATTRIBUTES = (TENSOR_METADATA | TENSOR_ALLOCATION | TENSOR_VIEWS | TENSOR_CASTS | DEVICE_FACTS
                    | TRITON_VALUES | PYTHON_VALUES)
# A ModelNew's own layers: their parameters, and PyTorch's operators on tensors (the public tensor
# methods that are ATen operators; never those that read values to the host).
MODEL_MODULE_ATTRIBUTES = frozenset({"weight", "bias", "in_features", "out_features", "parameters", "buffers",
                                     "children", "modules", "training", "eval", "train", "forward"})

# The builtins a kernel calls: sizes, ranges, checks, errors. Every exception class is inert and
# allowed too (raising one ends the call).
BUILTINS = frozenset({"range", "len", "min", "max", "abs", "int", "float", "bool", "tuple", "list", "dict",
                      "set", "frozenset", "enumerate", "zip", "isinstance", "all", "any", "sum", "sorted",
                      "reversed", "round", "divmod", "pow", "print", "super", "object", "property",
                      "staticmethod", "classmethod", "hash", "map", "filter", "None", "True",
                      "False", "NotImplemented", "Ellipsis", "slice", "callable", "hasattr"})
EXCEPTIONS = frozenset(n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException))
# Builtins that read a tensor's values into Python when given one (float(t), list(t), print(t)):
# refused on a tensor; iteration over a tensor is the same read.
VALUE_READERS = frozenset({"float", "int", "bool", "complex", "list", "tuple", "set", "frozenset", "dict", "iter",
                           "next", "sorted", "reversed", "sum", "min", "max", "any", "all", "enumerate", "zip",
                           "map", "filter", "abs", "round", "divmod", "pow", "str", "repr", "format", "print",
                           "hash", "bytes", "bytearray", "memoryview", "len"} - {"len"})
# Named in a refusal so that it says why (not the wall: they are simply not on the list above).
HOST_METHODS = frozenset({"apply_", "map_", "map2_", "tolist", "numpy", "item", "cpu", "storage",
                          "untyped_storage", "share_memory_", "pin_memory", "tofile", "from_file", "backward",
                          "register_hook", "data", "grad"})

# -- Text: a kernel never turns a value into text. A tensor's repr reads every value on the host
# under torch's _disable_current_modes, out of the run-time recorder's sight; a format string walks
# attributes no check of the file sees ("{0.__globals__[os]}"). Refused: these builtins, these
# attributes of any value, `%` with a string on its left, an f-string's conversion (`!r`) or format
# spec (its expressions are code like any other, checked as such). `print` stays, of literals only.
FORMATTING_BUILTINS = frozenset({"format", "repr", "str", "ascii", "vars", "dir", "getattr", "setattr", "delattr",
                                 "globals", "locals", "id", "type"})
FORMATTING_ATTRIBUTES = frozenset({"format", "format_map"})
LITERAL_ONLY_BUILTINS = frozenset({"print"})
# -- State: every function of the file is a pure function of its arguments (harness/isolation/
# purity.py): a counter kept between calls turns a kernel wrong after more calls than any verdict
# makes, a switch tells judged calls from served ones. The methods that change a container in place
# (allowed only on one the call made itself), and the builtins that make an iterator (never at
# module scope: a loop over one advances it, a counter without a store).
MUTATING_METHODS = frozenset({"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update",
                              "setdefault", "add", "discard", "sort", "reverse", "difference_update",
                              "intersection_update", "symmetric_difference_update"})
ITERATORS = frozenset({"map", "filter", "zip", "enumerate", "reversed", "iter"})


@functools.cache
def public_names(module: str) -> frozenset[str]:
    """A PUBLIC module's names: its __all__ (or its public dir), read from the installed library."""
    import importlib
    mod = importlib.import_module(module)
    names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
    return frozenset(n for n in names if not n.startswith("_"))


@functools.cache
def model_layers() -> frozenset[str]:
    """torch.nn's layers (and Parameter), for a ModelNew."""
    import torch
    return frozenset(n for n, v in vars(torch.nn).items() if not n.startswith("_") and isinstance(v, type)
                     and (issubclass(v, torch.nn.Module) or v is torch.nn.Parameter))


@functools.cache
def model_functions(module: str) -> frozenset[str]:
    import importlib
    import inspect
    mod = importlib.import_module(module)
    return frozenset(n for n, v in vars(mod).items() if not n.startswith("_") and callable(v)
                     and not inspect.isclass(v) and not inspect.ismodule(v))


@functools.cache
def torch_operators() -> frozenset[str]:
    """Public names of torch and of Tensor that are ATen operators, less those that read values to
    the host (item, allclose, equal, ...): a ModelNew's PyTorch compute."""
    import torch
    readers = {"item", "tolist", "allclose", "equal", "is_nonzero", "is_same_size", "set_", "from_file",
               "record_stream", "to_dense"}
    names = {n for n in [*dir(torch), *dir(torch.Tensor)] if not n.startswith("_") and n not in readers}
    return frozenset(n for n in names if hasattr(torch.ops.aten, n))


def modules(backend: str = "triton", model: bool = False) -> dict[str, frozenset[str] | str]:
    """The modules a file may import, and what it may name in each."""
    found = dict(MODULES)
    if backend == "cuda" or model:
        found.update(CUDA_MODULES)
    if model:
        found.update(MODEL_MODULES)
    return found


def module_names(module: str, listed: frozenset[str] | str, model: bool = False) -> frozenset[str]:
    if listed == PUBLIC:
        return public_names(module)
    if listed == "layers":
        return model_layers()
    if listed == "functions":
        return model_functions(module)
    if model and module == "torch":
        return listed | torch_operators() | {"nn", "utils", "Tensor"}
    return listed


def value_attributes(model: bool = False) -> frozenset[str]:
    return VALUE_ATTRIBUTES | (MODEL_MODULE_ATTRIBUTES | torch_operators() if model else frozenset())


def builtin_allowed(name: str) -> bool:
    return name in BUILTINS or name in EXCEPTIONS


@functools.cache
def tensor_attributes() -> frozenset[str]:
    """Every attribute a tensor or a storage has: a file's own attribute may not take such a name
    (a class with an `apply_` method would otherwise make `x.apply_` look like the file's own)."""
    import torch
    return frozenset({*dir(torch.Tensor), *dir(torch.UntypedStorage), *dir(torch.TypedStorage)})


def _names(names) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names))


def in_words() -> str:
    """The allow-list as playbook/rules.md shows it to the model (and to a person): generated here,
    so the words and the check never disagree."""
    listed = [f"  - `{module}`: " + ("its public names (its `__all__`)" if names == PUBLIC else _names(names))
              for module, names in MODULES.items()]
    listed += [f"  - `{module}` (a CUDA C++ file): {_names(names)}" for module, names in CUDA_MODULES.items()]
    return "\n".join([
        "Every name, attribute and call in the file must be on this list; anything else is refused before",
        "import, with its file, line and name, in every line of the file whether or not it runs while judged:",
        "",
        f"- The contract's names: {_names(CONTRACT_NAMES)}; and whatever the file defines itself",
        "  (functions, classes, variables, the attributes it assigns).",
        "- Imports, and what may be named in each:",
        *listed,
        "  A KernelBench `ModelNew` also: `torch.nn` (its layers), `torch.nn.functional`, `torch.nn.init`,",
        "  `torch.utils.cpp_extension.load_inline`, and PyTorch's operators on tensors (those that are ATen",
        "  operators, never one that reads values to the host such as `item`).",
        f"- Attributes of a value: tensor metadata {_names(TENSOR_METADATA)};",
        f"  allocation {_names(TENSOR_ALLOCATION)}; views {_names(TENSOR_VIEWS)};",
        f"  casts {_names(TENSOR_CASTS)}; device facts {_names(DEVICE_FACTS)};",
        f"  Triton values in a jit function {_names(TRITON_VALUES)}; dicts, lists and strings {_names(PYTHON_VALUES)}.",
        "  An attribute the file assigns or a method it defines is its own, unless a tensor or a",
        "  storage has an attribute of that name.",
        f"- Builtins: {_names(BUILTINS)}, and the exception classes; `print` of literals only.",
        f"- Never turn a value into text: no {_names(FORMATTING_BUILTINS)}; no `.format` or `.format_map` on any",
        "  value; no `%` with a string on its left; an f-string's `{name}` only, without a conversion (`!r`)",
        "  or a format spec (a tensor's repr reads every value on the host, out of the judge's sight).",
        "- Keep nothing between calls: every function is a pure function of its arguments. No `global` or",
        "  `nonlocal`, no `yield`. A store through a subscript or an attribute, a `del` of one, or a call of",
        f"  {_names(MUTATING_METHODS)} only on a container the call made itself (a local",
        "  name bound only to a display, a comprehension, an operator's result or a call of a builtin, an",
        "  imported function or a tensor's method), never on a parameter, a module name or a closure's. A",
        "  module-level list, dict or set is a flat read-only table: read by key, `.get`, `len`, `in` or",
        "  iteration, or handed to a builtin or an imported function. No mutable default, no list, dict",
        "  or set in a class body; at module scope no tensor, no object of a class the file defines and",
        f"  no iterator ({_names(ITERATORS)}, a generator expression).",
        "- Set an attribute only as `self.<name> = ...` in the `__init__` of a class the file defines;",
        "  every other attribute store is refused, whatever it is set on.",
        "- Never an attribute or a name that begins with an underscore (`x._typed_storage()`, `__dict__`),",
        "  except `super().__init__()`.",
        f"- Never a fact that tells a judged call from a served one: {_names(TELLS)} (whether a weight requires",
        "  grad says how the model is run, not what it holds; the judge may run on the CPU and serve on a GPU).",
        "  Allocate on `x.device`; a branch on the device sizes a grid, never changes the arithmetic.",
        "- Never compute on the host: no `.apply_`, `.map_`, `.tolist()`, `.numpy()`, `.item()`, `.cpu()`;",
        "  no builtin that reads a tensor's values (`float(t)`, `int(t)`, `bool(t)`, `list(t)`, `print(t)`,",
        "  `f\"{t}\"`); no iteration over a tensor or unpacking of one. At run time, any scalar read of a",
        "  tensor's data in a checked or timed call fails `integrity` as \"host compute\".",
        "- CUDA C++ text: the host side only launches. `#include` only CUDA's, the project's and torch's",
        "  extension headers; of the CUDA runtime only launch configuration, the launch check and device",
        "  facts (no `cudaMemcpy`, no host or managed memory, no streams or events of its own); in host",
        "  code only allocation, sizes, strides, `data_ptr` and the stream of a tensor (no torch compute).",
    ])


if __name__ == "__main__":
    print(in_words())
