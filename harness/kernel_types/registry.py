"""The kernel-type registry: what each kernel type means and how it is tested.

A `KernelType` holds everything the judge needs about one type: the kernel_fn signature, the
float64 reference, PyTorch's own eager implementation (the timing baseline), seeded input
generators, the shapes each stage uses, tolerances, FLOP and byte counts, and the aten ops the
type replaces in a model. A `Case` is one concrete problem: a type, named dims, a dtype, a seed
and a variant (how the inputs are generated or laid out).

Inputs are always generated on the CPU from a seeded `torch.Generator`, so two processes given
the same Case build bitwise identical inputs; that is how the judge's parent process recomputes
references without trusting the candidate's process.
"""
from __future__ import annotations

import threading
from typing import Any

import torch

from harness.kernel_types import model_views, structured
# the registry's public names, defined with the data types in harness/kernel_types/kernel_type.py
from harness.kernel_types.kernel_type import (DEFAULT_TOLERANCES, DTYPE_NAMES, DTYPES, SHORT_DTYPES, Case, Inputs,  # noqa: F401
                                 KernelType, dtype_of)

_REGISTRY: dict[str, KernelType] = {}
_LOAD_LOCK = threading.Lock()
_loaded = False


def register(kt: KernelType) -> KernelType:
    _REGISTRY[kt.name] = kt
    return kt


def _load() -> None:
    global _loaded
    with _LOAD_LOCK:  # judges run from threads; a half-filled registry would reject known types
        if not _loaded:
            from harness.kernel_types.types import attention, chains, matmuls, rowwise
            for module in (attention, matmuls, rowwise, chains):
                for kt in module.TYPES:
                    register(kt)
            _loaded = True


def get(name: str) -> KernelType:
    _load()
    if name not in _REGISTRY:
        raise KeyError(f"unknown KERNEL_TYPE {name!r}: known types are {', '.join(names())}")
    return _REGISTRY[name]


def names() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def build_inputs(case: Case, device: str | torch.device = "cpu") -> Inputs:
    """The inputs of a case, bitwise reproducible from (case, seed), moved to `device` with their
    layout (strides, storage offset) kept."""
    kt = get(case.kernel_type)
    gen = torch.Generator().manual_seed(case.seed)
    args, kwargs = kt.make_inputs(case, gen)
    if case.variant == structured.VARIANT:  # chosen values: ties, constant rows, a row and its shift
        args = structured.inputs(case, args, gen)
    elif case.variant == model_views.VARIANT:  # views into wider buffers, as a model passes them
        args = model_views.inputs(case, args, gen)
    args = [relayout(a, case.variant) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args]
    return [to_device(a, device) for a in args], kwargs


def to_device(t: Any, device: str | torch.device) -> Any:
    """Move a tensor keeping its strides and storage offset (Tensor.to would make it dense)."""
    if not isinstance(t, torch.Tensor) or torch.device(device) == t.device:
        return t
    storage = torch.empty(t.untyped_storage().nbytes() // t.element_size(), dtype=t.dtype, device=device)
    storage.copy_(torch.as_strided(t, (storage.numel(),), (1,), 0) if storage.numel() else t.new_empty(0))
    return torch.as_strided(storage, t.shape, t.stride(), t.storage_offset())


def relayout(t: torch.Tensor, variant: str) -> torch.Tensor:
    """Same values, another memory layout: the edge cases a kernel that assumes a dense,
    zero-offset tensor gets wrong."""
    if variant == "noncontig" and t.dim() >= 1:
        # every other element of a buffer twice as wide: stride 2 in the last dim
        wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
        wide[..., ::2] = t
        return wide[..., ::2]
    if variant == "transposed" and t.dim() >= 2:
        # column-major storage of the same matrix
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if variant == "offset":
        pad = 7
        flat = torch.zeros(t.numel() + pad, dtype=t.dtype)
        view = flat[pad:].view(t.shape)
        view.copy_(t)
        return view
    return t


def reference_output(case: Case) -> torch.Tensor:
    """The true answer in float64 (or the exact integer answer), computed on the CPU."""
    kt = get(case.kernel_type)
    args, kwargs = build_inputs(case, "cpu")
    with torch.no_grad():
        return kt.reference(*args, **kwargs)


def eager_output(case: Case, device: str = "cpu") -> torch.Tensor:
    kt = get(case.kernel_type)
    args, kwargs = build_inputs(case, device)
    with torch.no_grad():
        return kt.eager(*args, **kwargs)


def row_rms(ref: torch.Tensor) -> torch.Tensor:
    """Root-mean-square of each row (last dim) over the finite values, broadcast back."""
    r = torch.where(torch.isfinite(ref), ref, torch.zeros_like(ref)).double()
    if r.dim() == 0:
        return r.abs()
    return r.pow(2).mean(-1, keepdim=True).sqrt().expand_as(r)


def target_name(kernel_type: str, dims: dict[str, int], dtype: str) -> str:
    """The name a target has in plans, leaderboards and run folders: softmax[64x1024:float16]."""
    return f"{kernel_type}[{'x'.join(str(v) for v in dims.values())}:{SHORT_DTYPES.get(dtype, dtype)}]"
