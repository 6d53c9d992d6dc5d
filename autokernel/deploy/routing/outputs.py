"""Comparing a model's outputs: the tensors in them, their error, and whether it is within tolerance."""
from __future__ import annotations

import math
from typing import Any

import torch

DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# Largest error, relative to the rms of the reference output, that still counts as the same answer:
# fp32 leaves room for a different summation order, fp16/bf16 for rounding at a different place.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 2e-2}


def dtype_name(t: torch.Tensor) -> str:
    return DTYPE_NAMES.get(t.dtype, str(t.dtype).replace("torch.", ""))


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors in a model output, in order: a tensor, tuples, lists, dicts (HF outputs)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def error_vs(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |out - ref|, that over the rms of ref) over the elements where ref is finite; inf
    when shapes differ or out is not finite where ref is."""
    if out.shape != ref.shape:
        return math.inf, math.inf
    out, ref = out.detach().double(), ref.detach().double()
    finite = torch.isfinite(ref)
    if not torch.equal(torch.isfinite(out), finite) or (~finite & (out != ref)).any():
        return math.inf, math.inf
    if not finite.any():
        return 0.0, 0.0
    diff = (out - ref)[finite].abs().max().item()
    rms = ref[finite].pow(2).mean().sqrt().item()
    return diff, diff / rms if rms > 0 else (0.0 if diff == 0 else math.inf)


def same_result(out: Any, ref: Any, slack: float = 1.0) -> bool:
    outs, refs = tensors_of(out), tensors_of(ref)
    if len(outs) != len(refs):
        return False
    for o, r in zip(outs, refs):
        tol = TOLERANCE.get(dtype_name(r), TOLERANCE["float32"]) * slack
        if not r.is_floating_point():
            if not torch.equal(o, r):
                return False
        elif error_vs(o, r)[1] > tol:
            return False
    return True
