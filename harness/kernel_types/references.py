"""Where and in what precision the judge computes the true answer it checks a saved output against.

The stage shapes are small: their float64 reference on the CPU costs milliseconds, and stays. At the
bench shapes on a GPU (a 4096^3 matmul is 137 GFLOP) a float64 reference on the CPU costs seconds per
candidate, so large cases are computed on the judged device instead:
- in float64 where the device does float64 at speed (the data-centre GPUs: sm_60, 70, 80, 90, 100);
- elsewhere, for a kernel type whose fp32 rounding error has a derived bound (a matrix product of
  fp16/bf16 inputs: exact products, sums of n terms in fp32 off by at most gamma_n |A||B|,
  gamma_n = n u / (1 - n u), u = 2^-24, in any order, TF32 off), in float32 with that bound added
  to the comparison's tolerance. Only for fp16 and bf16 targets, whose tolerance is tens of times
  the bound; an fp32 target keeps float64.
The parent computes this itself, as before; the candidate's process is never asked. The worker
computes the same references on the judged device for every timed output (`compute_on`,
`precision_on`: harness/timing/device_check.py), a check beside the parent's, never instead of it.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import torch

from harness.kernel_types import registry
from harness.kernel_types.registry import Case

SMALL_ELEMENTS = 1 << 20  # input elements up to which the CPU float64 reference is kept
FAST_FLOAT64 = {(6, 0), (7, 0), (8, 0), (9, 0), (10, 0)}  # compute capabilities with full-rate fp64
UNIT_ROUNDOFF_FP32 = 2.0 ** -24
LOW_PRECISION = ("float16", "bfloat16")
CHUNK = 64  # K summed in fp32 per stretch: the bound is 3.8e-6 |A||B|, a few % of the fp16 tolerance


@dataclass
class Reference:
    value: torch.Tensor  # float64 (or the exact integer answer), on the CPU unless compute_on left it
    error: torch.Tensor | None  # a bound on |value - true answer| per element; None: float64's own, negligible
    how: str  # "float64 on cpu", "float64 on cuda", "float32 on cuda with a derived bound"


def _matmul_fp32(args: list, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """fp16/bf16 inputs are exact in fp32 and so are their products; only the sums round. Each
    CHUNK-long stretch of K is summed in fp32 (error <= gamma_CHUNK |A||B| over that stretch), the
    stretches in float64 (error negligible): so the bound is gamma_CHUNK |A||B|, not gamma_K."""
    a, b = (t.float() for t in args[:2])
    k = a.shape[-1]
    gamma = CHUNK * UNIT_ROUNDOFF_FP32 / (1 - CHUNK * UNIT_ROUNDOFF_FP32)
    value = None
    with ieee_fp32():
        for k0 in range(0, k, CHUNK):
            part = (a[..., k0:k0 + CHUNK] @ b[k0:k0 + CHUNK]).double()
            value = part if value is None else value + part
        magnitude = a.abs() @ b.abs()  # rounded within gamma_K (< 1e-3): the 1.01 covers it
    return value, magnitude.double() * (gamma * 1.01)


# kernel type -> (args, kwargs) on the device -> (fp32 value, bound on its error vs the true answer)
FP32_WITH_BOUND = {"matmul": _matmul_fp32}


@contextlib.contextmanager
def ieee_fp32():
    """Full fp32 products: TF32 (10-bit mantissa) would break the bound."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def elements_of(args: list) -> int:
    return sum(t.numel() for t in args if isinstance(t, torch.Tensor))


def choose(case: Case, device: str, elements: int, capability: tuple[int, int] | None = None) -> tuple[str, str]:
    """(where, precision) of the reference for `case` (of `elements` input elements) judged on `device`."""
    if device != "cuda" or elements <= SMALL_ELEMENTS:
        return "cpu", "float64"
    return "cuda", precision_on(case, device, capability)


def compute(case: Case, args: list, kwargs: dict, where: str, precision: str) -> Reference:
    """args: the case's inputs on the CPU (from registry.build_inputs), moved with their layout."""
    ref = compute_on(case, [registry.to_device(a, where) for a in args], kwargs, where, precision)
    return Reference(ref.value.cpu(), None if ref.error is None else ref.error.cpu(), ref.how)


def compute_on(case: Case, args: list, kwargs: dict, where: str, precision: str) -> Reference:
    """The reference left where `args` already are (`where`): value and bound on that device."""
    kt = registry.get(case.kernel_type)
    with torch.no_grad():
        if precision == "float32":
            value, error = FP32_WITH_BOUND[case.kernel_type](args, kwargs)
            return Reference(value.double(), error, f"float32 on {where} with a derived bound")
        return Reference(kt.reference(*args, **kwargs), None, f"float64 on {where}")


def precision_on(case: Case, device: str, capability: tuple[int, int] | None = None) -> str:
    """The precision of a reference computed on `device` itself, whatever the case's size."""
    if device != "cuda":
        return "float64"
    if capability is None:
        capability = torch.cuda.get_device_capability()
    if tuple(capability) not in FAST_FLOAT64 and case.kernel_type in FP32_WITH_BOUND and case.dtype in LOW_PRECISION:
        return "float32"
    return "float64"


_threads = {"users": 0, "saved": 1}
_threads_lock = threading.Lock()


@contextlib.contextmanager
def one_thread(device: str):
    """The parent's checks of a CPU judgement on one intra-op thread: torch's threads spin against
    the worker (and each other) on a small busy machine, where an isfinite of 262K doubles took 48 ms
    on two threads and 1.2 ms on one. Judgements that overlap share it; the last one out restores."""
    if device != "cpu":
        yield
        return
    with _threads_lock:
        if _threads["users"] == 0:
            _threads["saved"] = torch.get_num_threads()
            torch.set_num_threads(1)
        _threads["users"] += 1
    try:
        yield
    finally:
        with _threads_lock:
            _threads["users"] -= 1
            if _threads["users"] == 0:
                torch.set_num_threads(_threads["saved"])


def on_device(device: str, visible_devices: str | None):
    """Large references of a candidate judged on CUDA device `visible_devices` run on that device:
    its slot waits for the verdict, so no other candidate is being timed there meanwhile."""
    if device != "cuda" or visible_devices is None or not str(visible_devices).isdigit():
        return contextlib.nullcontext()
    return torch.cuda.device(int(visible_devices))


def reference(case: Case, device: str = "cpu", inputs: tuple[list, dict] | None = None) -> Reference:
    """The true answer for `case` judged on `device`: float64 on the CPU for small cases.
    `inputs`: the case's CPU inputs where the caller has them already."""
    args, kwargs = inputs or registry.build_inputs(case, "cpu")
    return compute(case, args, kwargs, *choose(case, device, elements_of(args)))
