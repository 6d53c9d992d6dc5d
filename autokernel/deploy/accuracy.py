"""Judging a patched model against the true answer, not against eager's rounding.

A bf16 model computed eagerly rounds after every op; a kernel that keeps fp32 inside and rounds
once is closer to the true answer, and so differs from eager by about eager's own error. Comparing
the patched model with eager would call such a kernel guilty. So the model is also run in float64
(float32 where float64 cannot run) as the reference, and the patched model is accepted when its
error against that reference is no worse than eager's own, with stated margins, on two measures
(each relative to the rms of the reference, per output tensor):

    rms error:  patched <= RMS_MARGIN x eager + RMS_FLOOR[dtype]   (broad inaccuracy)
    max error:  patched <= MAX_MARGIN x eager + MAX_FLOOR[dtype]   (a few wrong elements: a tile edge)

Errors compound through the layers differently for two equally good roundings, and a max is one
extreme draw, hence its wider margin. The floors, a rounding or two of the dtype, are for a model
whose eager error is next to nothing (fp32 against float64). A wrong kernel is off by O(1).
"""
from __future__ import annotations

import copy
import math
from typing import Any

import torch

from autokernel.deploy.routing import dtype_name, error_vs, tensors_of

RMS_MARGIN, MAX_MARGIN = 2.0, 4.0
RMS_FLOOR = {"float32": 1e-6, "float16": 2.5e-4, "bfloat16": 2e-3}
MAX_FLOOR = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def rule() -> dict:
    """The acceptance rule as verify.json states it."""
    return {"reference": "the model in float64 (float32 where float64 cannot run)",
            "accept": "patched error vs the reference <= margin x eager's error vs the reference + floor, "
                      "for the rms error and for the max error (both relative to the reference's rms)",
            "rms_margin": RMS_MARGIN, "rms_floor": dict(RMS_FLOOR),
            "max_margin": MAX_MARGIN, "max_floor": dict(MAX_FLOOR)}


def reference_outputs(loaded: Any, inputs: list[list]) -> tuple[list, str]:
    """The model's outputs for each input list, computed in float64 (else float32) on a copy."""
    errors = []
    for dtype in (torch.float64, torch.float32):
        try:
            model = copy.deepcopy(loaded.model).to(dtype)
            with torch.no_grad():
                outs = [model(*[_cast(x, dtype) for x in args]) for args in inputs]
            return outs, dtype_name(torch.empty(0, dtype=dtype))
        except Exception as e:  # noqa: BLE001 (an op without a float64 kernel on this device)
            errors.append(f"{dtype}: {type(e).__name__}: {e}")
    raise RuntimeError("the model runs neither in float64 nor in float32: " + "; ".join(errors))


def _cast(x: Any, dtype: torch.dtype) -> Any:
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def rms_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """rms(out - ref) / rms(ref) where ref is finite; inf when shapes differ or out is not finite
    where ref is. An rms, not a max: a max over millions of elements is one extreme draw, which
    two equally good roundings can land far apart."""
    if out.shape != ref.shape:
        return math.inf
    out, ref = out.detach().double(), ref.detach().double()
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(out), finite) or (~finite & (out != ref)).any():
        return math.inf
    if not finite.any():
        return 0.0
    diff = (out - ref)[finite].pow(2).mean().sqrt().item()
    rms = ref[finite].pow(2).mean().sqrt().item()
    return diff / rms if rms > 0 else (0.0 if diff == 0 else math.inf)


def judge(patched: Any, eager: Any, reference: Any) -> dict:
    """Per seed: errors of eager and patched vs the reference (rms and max), and the verdict."""
    outs, eagers, refs = tensors_of(patched), tensors_of(eager), tensors_of(reference)
    accepted = len(outs) == len(eagers) == len(refs)
    worst = {"eager_err_vs_reference": 0.0, "patched_err_vs_reference": 0.0,
             "eager_max_err_vs_reference": 0.0, "patched_max_err_vs_reference": 0.0}
    for o, e, r in zip(outs, eagers, refs):
        if not e.is_floating_point():
            accepted = accepted and torch.equal(o, e)
            continue
        dtype, r = dtype_name(e), r.to(e.device)
        errors = {"eager_err_vs_reference": rms_error(e, r), "patched_err_vs_reference": rms_error(o, r),
                  "eager_max_err_vs_reference": error_vs(e, r)[1], "patched_max_err_vs_reference": error_vs(o, r)[1]}
        accepted = accepted and errors["patched_err_vs_reference"] <= (
            RMS_MARGIN * errors["eager_err_vs_reference"] + RMS_FLOOR.get(dtype, RMS_FLOOR["float32"]))
        accepted = accepted and errors["patched_max_err_vs_reference"] <= (
            MAX_MARGIN * errors["eager_max_err_vs_reference"] + MAX_FLOOR.get(dtype, MAX_FLOOR["float32"]))
        worst = {k: max(v, errors[k]) for k, v in worst.items()}
    vs_eager = [error_vs(o, e) for o, e in zip(outs, eagers) if e.is_floating_point()]
    return {"outputs_match": accepted, **worst, "max_abs_err": max((v[0] for v in vs_eager), default=0.0),
            "max_rel_err": max((v[1] for v in vs_eager), default=0.0)}
