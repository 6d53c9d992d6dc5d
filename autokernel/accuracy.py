"""Judging a patched model against the true answer, not against eager's rounding.

A bf16 model computed eagerly rounds after every op; a kernel that keeps fp32 inside and rounds
once is closer to the true answer, and so differs from eager by about eager's own error. Comparing
the patched model with eager would call such a kernel guilty. So the model is also run in float64
(float32 where float64 cannot run) as the reference, and the patched model is accepted when its
error against that reference is no worse than eager's own, with a stated margin:

    patched error  <=  MARGIN_RATIO x eager error  +  FLOOR[dtype]

(errors: max |out - reference| over the rms of the reference, per output tensor). The ratio
leaves room for rounding at other places than eager (errors compound differently through the
layers); the floor, a few units in the last place of the dtype, for a model whose eager error is
next to nothing (fp32 against float64). A wrong kernel is off by O(1): far beyond either.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from autokernel.routing import dtype_name, error_vs, tensors_of

MARGIN_RATIO = 2.0
FLOOR = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def rule() -> dict:
    """The acceptance rule as verify.json states it."""
    return {"reference": "the model in float64 (float32 where float64 cannot run)",
            "accept": "patched error vs the reference <= margin_ratio x eager's error vs the reference + floor",
            "margin_ratio": MARGIN_RATIO, "floor_rel_rms": dict(FLOOR)}


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


def judge(patched: Any, eager: Any, reference: Any) -> dict:
    """Per seed: errors of eager and patched vs the reference, what is allowed, and the verdict."""
    outs, eagers, refs = tensors_of(patched), tensors_of(eager), tensors_of(reference)
    accepted = len(outs) == len(eagers) == len(refs)
    eager_err = patched_err = allowed = 0.0
    for o, e, r in zip(outs, eagers, refs):
        if not e.is_floating_point():
            accepted = accepted and torch.equal(o, e)
            continue
        e_err, p_err = error_vs(e, r.to(e.device))[1], error_vs(o, r.to(o.device))[1]
        limit = MARGIN_RATIO * e_err + FLOOR.get(dtype_name(e), FLOOR["float32"])
        accepted = accepted and p_err <= limit
        eager_err, patched_err, allowed = max(eager_err, e_err), max(patched_err, p_err), max(allowed, limit)
    vs_eager = [error_vs(o, e) for o, e in zip(outs, eagers) if e.is_floating_point()]
    return {"outputs_match": accepted, "eager_err_vs_reference": eager_err, "patched_err_vs_reference": patched_err,
            "allowed_err": allowed, "max_abs_err": max((v[0] for v in vs_eager), default=0.0),
            "max_rel_err": max((v[1] for v in vs_eager), default=0.0)}
