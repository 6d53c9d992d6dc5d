"""Module targets: the time no kernel type names, grouped by the smallest module that encloses it.

A model's own code (GPT-2's tanh GELU, complex-number rotary, a masked attention written out by
hand) runs ops none of the nine kernel types covers. Rather than leave that time as `other`, each
unmapped op is charged to the innermost module it ran in; the calls of one module class at one
input signature (every layer's `mlp.act`) form one target, named like
`module[GPT2MLP.act:1x128x1536:float32]` (the enclosing class and attribute, the first input's
shape, its dtype). The search treats it as a KernelBench problem made from that module instance
(autokernel.search.module_problem).

What a module is called with is captured once, outside the profiler (the capture's own ops would
otherwise be timed): each argument as a tensor spec (shape, dtype, and the range or the mean and
spread its values were drawn from) or a constant.

A target's work per call is what its ops do (autokernel.profile.op_work: products by formula, elementwise
ops by elements) and the bytes it must move: its inputs and outputs, and the weights its computing
ops read (held_weights, weight_bytes). Work that cannot be counted makes the count a floor, and the
plan then claims no ceiling for the target (work_note says why).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

from harness.kernel_types import registry

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


def held_weights(qualname: str, nodes: list, modules: dict) -> list[torch.Tensor]:
    """The parameters and buffers a module target's work may read: the module's own, and all those of
    the modules whose calls were charged to it (an expert loop's)."""
    held: dict[int, torch.Tensor] = {}
    own = modules.get(qualname)
    if own is not None:
        held.update((id(t), t) for t in list(own.parameters(recurse=False)) + list(own.buffers(recurse=False)))
    for n in nodes:
        inner = modules.get(n.module[0]) if n.module else None
        if inner is not None:
            held.update((id(t), t) for t in list(inner.parameters()) + list(inner.buffers()))
    return list(held.values())


def weight_bytes(operands: list[list[int]], weights: list[torch.Tensor]) -> int:
    """Bytes of `weights` that computing ops read, matched by shape: a weight read whole (its shape,
    or a transpose of it) counts once; one read a slice at a time along its first dim (an expert's
    matrix from a stacked tensor) counts per slice read, at most once whole. What an embedding or an
    index reads (a few rows of a table) is not here: those ops' operands are not matched."""
    total = 0
    for w in weights:
        shape, whole = list(w.shape), w.numel() * w.element_size()
        if not shape:
            continue
        if any(sorted(o) == sorted(shape) for o in operands):
            total += whole
            continue
        part = shape[1:]
        slices = sum(1 for o in operands if part and sorted(o) == sorted(part))
        total += min(whole, slices * (whole // shape[0]))
    return total


def work_note(work: Any, per_call: int, io_bytes: Optional[int], weights: float, share_uncounted: float) -> str:
    """How one call of a module target was counted (`work` holds `per_call` calls), or why it could
    not be: the plan row shows it."""
    if io_bytes is None:
        return ("its inputs and outputs were not captured (records attributed without the model's calls), so "
                "its bytes could not be counted")
    if work.uncounted:
        names = ", ".join(sorted(work.uncounted, key=lambda k: -work.uncounted[k])[:3])
        return (f"the work of {names} ({share_uncounted:.0%} of this target's time) could not be counted: no FLOP "
                f"formula and nothing recorded inside it; the {work.flops / per_call / 1e6:.4g} MFLOP counted per call are a floor")
    products = f"{work.matmul_flops / per_call / 1e6:.4g} MFLOP in products ({', '.join(sorted(work.matmuls))})" \
        if work.matmuls else "no products"
    return (f"per call: {products}, {(work.flops - work.matmul_flops) / per_call / 1e6:.4g} MFLOP elementwise (one per "
            f"element); {io_bytes / 1e6:.4g} MB of inputs and outputs, {weights / 1e6:.4g} MB of weights read")


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
