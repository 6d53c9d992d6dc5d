"""What a kernel type is, as data: a `KernelType` (its contract, references, inputs, shapes,
tolerances, FLOP and byte counts) and a `Case` (one concrete problem of a type). The table of
types is harness/kernel_types/registry.py, which fills itself from harness/kernel_types/types/ on first use.
"""
from __future__ import annotations

import dataclasses
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
    # small enough for the Triton interpreter: a starter's rep takes 25 to 100 ms there, so the
    # CPU budget (harness/timing/measurement.py) times several reps, not the minimum of slow ones
    cpu_bench_shape: dict[str, int]
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
    # The parameters a backward_fn returns gradients for, in params order (integer targets and a
    # model's constants such as rotary tables have none); harness/kernel_types/gradients.py.
    grad_params: tuple[str, ...] = ()
    # Of those, the ones whose gradient is a sum over the output's rows (a norm's weight, the
    # right-hand matrix): their error is measured against the whole gradient's rms, not a row's.
    summed_grads: tuple[str, ...] = ()

    def signature_text(self) -> str:
        parts = [p if p not in self.defaults else f"{p}={self.defaults[p]!r}" for p in self.params]
        return f"kernel_fn({', '.join(parts)})"
