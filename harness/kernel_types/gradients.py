"""The true gradients a backward_fn is checked against: float64 autograd of the type's reference.

A case's upstream gradient (`grad_out`) is random, drawn from a generator seeded by the case, so
the worker and the judging process build bitwise the same one, and a backward that ignores it (or
assumes it is all ones, as a loss's would be) fails. The reference gradients are autograd of the
type's float64 reference (harness/kernel_types/types/) at the case's inputs under that grad_out:
the true answer, not PyTorch's rounding of it.

Tolerances. An element of gradient `g` passes when |got - ref| <= atol * scale + rtol * |ref|.
`scale` is the rms of the reference gradient's row for a gradient shaped like an activation, and
the rms of the whole gradient for one summed over the output's rows (the type's `summed_grads`:
a norm's weight, the right-hand matrix): each of its elements is a sum of M terms, so its rounding
grows with the sum's magnitude, and a weight-gradient element near zero by cancellation is held to
the error its neighbours' size allows, not to a bound of its own it could never meet. Where a
gradient's terms cancel within a row, the rms of those terms is the scale when it is larger
(harness/kernel_types/grad_magnitudes.py).
"""
from __future__ import annotations

import torch

from harness.kernel_types import registry
from harness.kernel_types.registry import Case

# (rtol, atol) per gradient dtype. A backward reads grad_out, the saved output and the inputs, and
# recomputes a row's statistics, so an element's gradient carries the rounding of two passes
# (forward values, then the backward's own sums): twice the forward's fp32 budget. fp16 and bf16
# gradients are rounded once on store (4.9e-4 and 3.9e-3 relative) on top of inputs and an
# upstream gradient that are themselves rounded to that dtype; the forward's budgets hold them.
GRAD_TOLERANCES = {
    "float32": (2e-4, 2e-4),
    "float16": (5e-3, 5e-3),
    "bfloat16": (2e-2, 2e-2),
}
# (rtol, atol) of a weight gradient summed over rows under a gradient correlated with the output
# (the backward's accumulation stage): every term has one sign and the sum grows with the rows. An
# honest backward (fp32 sums, one rounding on store) is less than an ulp off: half of one on a GPU
# (to nearest), up to one under the Triton interpreter, whose fp32 -> bf16 cast truncates. So one
# ulp each, 2^-7 in bf16 and 2^-10 in fp16: a sum kept in the dtype itself drifts by an ulp every
# few dozen terms past 2^8 (bf16) and 2^11 (fp16) of them and fails. fp32 keeps GRAD_TOLERANCES.
ACCUMULATION_TOLERANCES = {
    "float16": (2.0 ** -10, 2.0 ** -10),
    "bfloat16": (2.0 ** -7, 2.0 ** -7),
}
UPSTREAM_SEED = 7_000_003  # added to a case's seed: grad_out never repeats an input's values


def out_shape_dtype(case: Case, args: list, kwargs: dict) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype of kernel_fn's output for `case` (so of grad_out)."""
    kt = registry.get(case.kernel_type)
    with torch.no_grad():
        meta = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
        shape = tuple(kt.reference(*meta, **kwargs).shape)
    return shape, kt.out_dtype(case)


def upstream(case: Case, args: list, kwargs: dict, device: str | torch.device = "cpu") -> torch.Tensor:
    """The case's random upstream gradient, on `device`, in the output's dtype, laid out as the
    case's inputs are (an edge case's grad_out is strided or offset too)."""
    shape, dtype = out_shape_dtype(case, args, kwargs)
    gen = torch.Generator().manual_seed(case.seed + UPSTREAM_SEED)
    g = torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
    return registry.to_device(registry.relayout(g, case.variant), device)


def reference_grads(case: Case, inputs: tuple[list, dict] | None = None,
                    grad_out: torch.Tensor | None = None, device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Float64 autograd of the reference: one gradient per grad_params entry, in order, on `device`
    (the CPU; a timed rep's own device where its gradients are checked there)."""
    kt = registry.get(case.kernel_type)
    args, kwargs = inputs if inputs is not None else registry.build_inputs(case, "cpu")
    if grad_out is None:
        grad_out = upstream(case, args, kwargs)
    leaves, call_args = [], []
    for name, a in zip(kt.params, args):
        if name in kt.grad_params:
            leaf = a.detach().to(device, torch.float64).requires_grad_(True)
            leaves.append(leaf)
            call_args.append(leaf)
        else:
            call_args.append(a.to(device) if isinstance(a, torch.Tensor) else a)
    with torch.enable_grad():
        out = kt.reference(*call_args, **kwargs)
        grads = torch.autograd.grad(out, leaves, grad_out.to(device, torch.float64), allow_unused=True)
    return [torch.zeros_like(leaf) if g is None else g.detach() for leaf, g in zip(leaves, grads)]


def error_scale(case: Case, param: str, ref: torch.Tensor) -> torch.Tensor:
    """The magnitude a gradient element's error is measured against (see the module's docstring)."""
    kt = registry.get(case.kernel_type)
    if param in kt.summed_grads:
        finite = torch.where(torch.isfinite(ref), ref, torch.zeros_like(ref)).double()
        rms = finite.pow(2).mean().sqrt() if finite.numel() else finite.new_zeros(())
        return rms.expand_as(ref)
    return registry.row_rms(ref)


def bound(case: Case, param: str, ref: torch.Tensor, dtype: torch.dtype,
          magnitude: torch.Tensor | None = None, tolerances: dict | None = None) -> torch.Tensor:
    """The allowed error of each element; `magnitude`: the size of the terms the gradient sums, where
    they cancel (harness/kernel_types/grad_magnitudes.py), else the reference itself is the scale;
    `tolerances`: (rtol, atol) by dtype where not GRAD_TOLERANCES' (ACCUMULATION_TOLERANCES)."""
    name = registry.DTYPE_NAMES.get(dtype, case.dtype)
    rtol, atol = (tolerances or {}).get(name) or GRAD_TOLERANCES[name]
    floor = torch.finfo(dtype).tiny if dtype.is_floating_point else 0.0
    scale = error_scale(case, param, ref)
    if magnitude is not None:
        scale = torch.maximum(scale, error_scale(case, param, magnitude))
    return atol * scale.clamp_min(floor) + rtol * ref.abs()


def magnitudes(case: Case, inputs: tuple[list, dict], grad_out: torch.Tensor,
               device: str | torch.device = "cpu") -> list[torch.Tensor | None]:
    """Per differentiable parameter, the magnitude its error is measured against (None: the reference's)."""
    from harness.kernel_types.grad_magnitudes import magnitudes as terms
    found = terms(case.kernel_type, inputs[0], inputs[1], grad_out, device)
    return found if found is not None else [None] * len(registry.get(case.kernel_type).grad_params)


def expected(case: Case, args: list) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of each gradient a backward_fn must return: its input's."""
    kt = registry.get(case.kernel_type)
    return [(name, tuple(a.shape), a.dtype) for name, a in zip(kt.params, args) if name in kt.grad_params]
