"""Module targets: the time no kernel type names, grouped by the smallest module that encloses it.

A model's own code (GPT-2's tanh GELU, complex-number rotary, a masked attention written out by
hand) runs ops none of the nine kernel types covers. Rather than leave that time as `other`, each
unmapped op is charged to the innermost module it ran in; the calls of one module class at one
input signature (every layer's `mlp.act`) form one target, named like
`module[GPT2MLP.act:1x128x1536:float32]` (the enclosing class and attribute, the first input's
shape, its dtype). The search treats it as a KernelBench problem made from that module instance
(autokernel.module_problem).

What a module is called with is captured once, outside the profiler (the capture's own ops would
otherwise be timed): each argument as a tensor spec (shape, dtype, and the range or the mean and
spread its values were drawn from) or a constant.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from harness import registry

KERNEL_TYPE = "module"
_CONST = (bool, int, float, str, type(None))


# ---------------------------------------------------------------- what each module is called with
def tensor_spec(t: torch.Tensor) -> dict:
    """A tensor as a recipe for drawing one like it: shape, dtype and how its values spread."""
    spec: dict[str, Any] = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
    x = t.detach()
    if x.numel() == 0:
        return spec
    if t.dtype == torch.bool:
        spec["kind"] = "bool"
    elif t.is_floating_point():
        f = x.float()
        spec.update(kind="float", mean=float(f.mean()), std=float(f.std()) if f.numel() > 1 else 0.0)
    elif t.is_complex():
        spec["kind"] = "complex"
    else:
        spec.update(kind="int", low=int(x.min()), high=int(x.max()))
    return spec


def value_spec(value: Any) -> dict:
    if isinstance(value, torch.Tensor):
        return {"tensor": tensor_spec(value)}
    if isinstance(value, _CONST):
        return {"const": value}
    if isinstance(value, (list, tuple)) and all(isinstance(v, _CONST) for v in value):
        return {"const": list(value)}
    return {"unsupported": type(value).__name__}


def capture_inputs(model: torch.nn.Module, run: Callable[[], Any]) -> dict[str, dict]:
    """{qualified name: {"args": [...], "kwargs": {...}, "output_bytes": n}} of each module's first
    call during `run()`, recorded by forward hooks that are removed afterwards."""
    seen: dict[str, dict] = {}
    handles = []

    def pre(name: str):
        def hook(module, args, kwargs):
            if name not in seen:
                seen[name] = {"args": [value_spec(a) for a in args],
                              "kwargs": {k: value_spec(v) for k, v in kwargs.items()}}
        return hook

    def post(name: str):
        def hook(module, args, kwargs, output):
            entry = seen.get(name)
            if entry is not None and "output_bytes" not in entry:
                outs = output if isinstance(output, (tuple, list)) else [output]
                entry["output_bytes"] = sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor))
        return hook

    for name, m in model.named_modules():
        if name:  # the whole model is never a module target: it holds the typed targets too
            handles += [m.register_forward_pre_hook(pre(name), with_kwargs=True),
                        m.register_forward_hook(post(name), with_kwargs=True)]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return seen


# ---------------------------------------------------------------- naming and sizing
def first_tensor(call: dict) -> Optional[dict]:
    for v in list(call.get("args", [])) + list(call.get("kwargs", {}).values()):
        if "tensor" in v:
            return v["tensor"]
    return None


def label(qualname: str, modules: dict) -> str:
    """`GPT2MLP.act`: the enclosing module's class and the attribute the module sits in."""
    parent, _, attr = qualname.rpartition(".")
    if attr.isdigit():  # an entry of a ModuleList or Sequential: every layer's is the same target
        own = modules.get(qualname)
        return type(own).__name__ if own is not None else qualname
    owner = modules.get(parent)
    return f"{type(owner).__name__ if owner is not None else 'model'}.{attr}"


def signature(call: Optional[dict]) -> str:
    """The input signature that tells two calls of one module class apart: every argument's shape,
    dtype or constant value."""
    if call is None:
        return "?"
    parts = []
    for v in list(call.get("args", [])) + [v for _, v in sorted(call.get("kwargs", {}).items())]:
        t = v.get("tensor")
        parts.append(f"{t['shape']}:{t['dtype']}" if t else repr(v.get("const", v.get("unsupported"))))
    return ";".join(parts)


def target_name(lbl: str, call: Optional[dict], dtype: str) -> str:
    t = first_tensor(call or {})
    shape = "x".join(str(d) for d in t["shape"]) if t and t["shape"] else "scalar"
    return f"{KERNEL_TYPE}[{lbl}:{shape}:{registry.SHORT_DTYPES.get(dtype, dtype)}]"


def call_bytes(call: Optional[dict]) -> int:
    """Bytes a module call must move at least: its tensor inputs read once, its outputs written."""
    if call is None:
        return 0
    total = call.get("output_bytes", 0)
    for v in list(call.get("args", [])) + list(call.get("kwargs", {}).values()):
        t = v.get("tensor")
        if t:
            total += math.prod(t["shape"]) * _itemsize(t["dtype"])
    return total


def op_flops(nodes: list) -> int:
    """FLOPs of the unmapped ops a module ran, one per element of each op's first input (they are
    elementwise or reductions: a floor, not a count of every multiply-add)."""
    flops = 0
    for n in nodes:
        if n.shapes and isinstance(n.shapes[0], list) and n.shapes[0]:
            flops += math.prod(n.shapes[0])
    return flops


def op_bytes(nodes: list, dtype: str) -> int:
    """Bytes the unmapped ops read and write, each op's first input in and out once: a module's
    traffic when what it was called with was not captured."""
    return 2 * op_flops(nodes) * _itemsize(dtype)


def _itemsize(dtype: str) -> int:
    try:
        return torch.empty((), dtype=getattr(torch, dtype)).element_size()
    except (AttributeError, TypeError):
        return 4


def call_dtype(call: Optional[dict], fallback: str) -> str:
    t = first_tensor(call or {})
    if t and t.get("kind") == "float":
        return t["dtype"]
    return fallback
