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

import dataclasses
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
SHORT_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}

# (rtol, atol): an element passes when |out - ref| <= atol * scale + rtol * |ref|, where scale is
# the magnitude of the reference around it (see KernelType.error_scale). Measured against a float64
# reference, so these budgets are for the kernel's own rounding, not for PyTorch's.
DEFAULT_TOLERANCES = {
    # fp32 is IEEE fp32: a TF32 or fp16 step inside costs ~5e-4 relative and fails this.
    "float32": (1e-4, 1e-4),
    # fp16 output rounding alone is 4.9e-4; fp32 statistics and accumulation keep well inside.
    "float16": (5e-3, 5e-3),
    "bfloat16": (2e-2, 2e-2),
}


def dtype_of(name: str) -> torch.dtype:
    name = SHORT_DTYPES.get(name, name)
    if name not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


@dataclass(frozen=True)
class Case:
    """One concrete problem. `variant` names how inputs are made: "plain", a type-specific
    stability variant such as "scale:100", or a layout such as "noncontig" or "offset"."""

    kernel_type: str
    shape: tuple[tuple[str, int], ...]
    dtype: str
    seed: int = 0
    variant: str = "plain"
    kwargs: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def make(kernel_type: str, shape: dict, dtype: str, seed: int = 0, variant: str = "plain",
             **kwargs: Any) -> "Case":
        return Case(kernel_type, tuple(shape.items()), SHORT_DTYPES.get(dtype, dtype), seed,
                    variant, tuple(sorted(kwargs.items())))

    @property
    def dims(self) -> dict[str, int]:
        return dict(self.shape)

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.kwargs)

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_of(self.dtype)

    def label(self) -> str:
        dims = "x".join(str(v) for _, v in self.shape)
        extra = "".join(f",{k}={v}" for k, v in self.kwargs)
        variant = "" if self.variant == "plain" else f",{self.variant}"
        return f"{self.kernel_type}[{dims}:{self.dtype}{variant}{extra}]"

    def to_json(self) -> dict:
        return {"kernel_type": self.kernel_type, "shape": self.dims, "dtype": self.dtype,
                "seed": self.seed, "variant": self.variant, "kwargs": self.options}

    @staticmethod
    def from_json(d: dict) -> "Case":
        return Case.make(d["kernel_type"], d["shape"], d["dtype"], d.get("seed", 0),
                         d.get("variant", "plain"), **d.get("kwargs", {}))

    def replace(self, **changes: Any) -> "Case":
        return dataclasses.replace(self, **changes)


Inputs = tuple[list[Any], dict[str, Any]]


@dataclass(frozen=True)
class KernelType:
    name: str
    params: tuple[str, ...]
    defaults: dict[str, Any]
    make_inputs: Callable[[Case, torch.Generator], Inputs]
    reference: Callable[..., torch.Tensor]  # float64 maths on CPU; returns float64 (or int) tensor
    eager: Callable[..., torch.Tensor]  # PyTorch's own op at the inputs' dtype: the baseline
    out_dtype: Callable[[Case], torch.dtype]
    smoke_shape: dict[str, int]
    sweep: list[tuple[dict[str, int], dict[str, Any]]]  # (dims, kwargs)
    stability: list[tuple[str, dict[str, int], tuple[str, ...]]]  # (variant, dims, dtypes)
    edge_cases: list[tuple[str, dict[str, int], dict[str, Any]]]  # (variant, dims, kwargs)
    bench_shape: dict[str, int]  # LLaMA-7B-like, for a GPU
    cpu_bench_shape: dict[str, int]  # small enough for the Triton interpreter
    flops: Callable[[dict[str, int]], float]
    bytes: Callable[[dict[str, int], int], float]  # (dims, element size) -> bytes moved at minimum
    aten_ops: tuple[str, ...]
    shape_of: Callable[..., dict[str, int]]  # dims of a call's arguments (for targets from a model)
    reference_source: str = ""  # the reference as a user would read it (for the LLM prompt)
    tolerances: dict[str, tuple[float, float]] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    # Magnitude the error of each output element is measured against; default: rms of its row.
    error_scale: Callable[[list[Any], torch.Tensor], torch.Tensor] | None = None
    # Its kernels multiply tiles (tl.dot): the Triton interpreter gets bf16 dot products wrong.
    dot_products: bool = False

    def signature_text(self) -> str:
        parts = [p if p not in self.defaults else f"{p}={self.defaults[p]!r}" for p in self.params]
        return f"kernel_fn({', '.join(parts)})"


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
            from harness.types import attention, matmuls, rowwise  # noqa: F401  (they register)
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
