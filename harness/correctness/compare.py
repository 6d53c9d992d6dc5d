"""Comparing a kernel's output with the float64 reference.

An element passes when |out - ref| <= atol * scale + rtol * |ref|, where scale is the magnitude of
the reference around it (the rms of its row by default): magnitude-aware, so a softmax over 50257
columns is not passed by zeros just because every probability is tiny. NaN and Inf must appear
exactly where the reference (cast to the output dtype) has them, with the same sign.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.kernel_types import registry, structured
from harness.kernel_types.registry import Case


@dataclass
class Comparison:
    ok: bool
    detail: str
    max_abs_err: float = 0.0
    worst_ratio: float = 0.0  # max of |err| / bound; <= 1 passes
    trivial: str | None = None  # a trivial output that would also pass (the case proves nothing)


def _bound(case: Case, args: list, ref: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    kt = registry.get(case.kernel_type)
    rtol, atol = kt.tolerances[registry.DTYPE_NAMES[out_dtype]] if out_dtype in registry.DTYPE_NAMES \
        else kt.tolerances[case.dtype]
    scale = kt.error_scale(args, ref) if kt.error_scale else registry.row_rms(ref)
    floor = torch.finfo(out_dtype).tiny if out_dtype.is_floating_point else 0.0
    return atol * scale.clamp_min(floor) + rtol * ref.abs()


def compare(out: torch.Tensor, ref: torch.Tensor, case: Case, args: list | None = None,
            trivial: bool = False, ref_error: torch.Tensor | None = None) -> Comparison:
    """out: the kernel's output (any device); ref: float64 reference, compared where it lies (the CPU,
    or the device for a timed output checked there: harness/timing/device_check.py). With trivial=True,
    also name the trivial output (zeros, a constant) that would pass this case, if any.
    ref_error: a bound on the reference's own error (a float32 reference, harness/kernel_types/references.py),
    added to the tolerance so that the reference's rounding is never charged to the kernel."""
    kt = registry.get(case.kernel_type)
    want_dtype = kt.out_dtype(case)
    if not isinstance(out, torch.Tensor):
        return Comparison(False, f"kernel_fn returned {type(out).__name__}, expected a torch.Tensor")
    if tuple(out.shape) != tuple(ref.shape):
        return Comparison(False, f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    if out.dtype != want_dtype:
        return Comparison(False, f"output dtype {out.dtype} != reference dtype {want_dtype}")
    if args is None:
        args, _ = registry.build_inputs(case, "cpu")
    bound = _bound(case, args, ref, want_dtype)
    if ref_error is not None:
        bound = bound + ref_error
    out64 = out.detach().to(ref.device, torch.float64)
    result = check_values(out64, ref, bound, want_dtype)
    if not result.ok and case.variant == structured.VARIANT:
        # rows chosen for what they are (ties at the maximum, a row plus a constant, ...): say which
        result.detail += structured.explain(case, out_of_tolerance(out64, ref, bound, want_dtype).cpu())
    if trivial and result.ok:
        result.trivial = trivial_output_passes(ref, bound, want_dtype)
    return result


def check_values(out64: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor,
                 out_dtype: torch.dtype) -> Comparison:
    ref_cast = ref.to(out_dtype).double()  # where the true answer overflows the dtype, inf is right
    ref_nan, out_nan = torch.isnan(ref_cast), torch.isnan(out64)
    if not torch.equal(ref_nan, out_nan):
        where = "NaN where the reference has none" if (out_nan & ~ref_nan).any() else "no NaN where the reference has NaN"
        return Comparison(False, f"{where} ({int((ref_nan != out_nan).sum())} elements)")
    ref_inf, out_inf = torch.isinf(ref_cast), torch.isinf(out64)
    if not torch.equal(ref_inf, out_inf) or not torch.equal(ref_cast[ref_inf], out64[out_inf]):
        where = "Inf where the reference is finite" if (out_inf & ~ref_inf).any() else "Inf missing or of the wrong sign"
        return Comparison(False, f"{where} ({int((ref_inf != out_inf).sum())} elements)")
    finite = ~(ref_nan | ref_inf)
    err_f, bound_f = (out64 - ref).abs()[finite], bound[finite]
    if err_f.numel() == 0:
        return Comparison(True, "all elements non-finite, matching the reference")
    ratio = err_f / bound_f.clamp_min(1e-300)
    worst = int(torch.argmax(ratio))
    worst_ratio = float(ratio[worst])
    max_abs = float(err_f.max())
    if worst_ratio > 1.0:
        bad = int((ratio > 1.0).sum())
        return Comparison(False, f"{bad} of {err_f.numel()} elements out of tolerance; worst: got "
                                 f"{float(out64[finite][worst]):.6g}, expected {float(ref[finite][worst]):.6g} "
                                 f"(error {float(err_f[worst]):.3g} > allowed {float(bound_f[worst]):.3g})",
                          max_abs, worst_ratio)
    return Comparison(True, f"max abs error {max_abs:.3g} ({worst_ratio:.2f} of the tolerance)", max_abs, worst_ratio)


def out_of_tolerance(out64: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor,
                     out_dtype: torch.dtype) -> torch.Tensor:
    """Element-wise: where check_values finds the output wrong (a NaN or Inf out of place, or an
    error over its bound)."""
    ref_cast = ref.to(out_dtype).double()
    misplaced = (torch.isnan(ref_cast) != torch.isnan(out64)) | (torch.isinf(ref_cast) != torch.isinf(out64))
    finite = torch.isfinite(ref_cast) & torch.isfinite(out64)
    over = torch.where(finite, (out64 - ref).abs() > bound, torch.zeros_like(finite))
    return misplaced | over | (torch.isinf(ref_cast) & torch.isinf(out64) & (ref_cast != out64))


def trivial_output_passes(ref: torch.Tensor, bound: torch.Tensor, out_dtype: torch.dtype) -> str | None:
    """Name the trivial output (zeros, a constant) that would pass, if any: such a case proves
    nothing and is not counted."""
    if not torch.isfinite(ref.to(out_dtype)).all():
        return None  # a constant has no NaN or Inf to match
    if bool((ref.abs() <= bound).all()):
        return "an all-zero output"
    if ref.numel() > 1:
        const = float(ref.to(out_dtype).double().mean())
        if bool(((ref - const).abs() <= bound).all()):
            return "a constant output"
    return None


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.element_size() in (1, 2, 4, 8) and a.is_floating_point():
        int_dtype = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(int_dtype), b.contiguous().view(int_dtype))
    return torch.equal(a, b)
