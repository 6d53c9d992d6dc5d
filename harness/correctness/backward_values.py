"""The inputs and upstream gradients of the backward's cases: what a training step hands a backward.

A backward case is a registry case (harness/kernel_types/registry.py builds its inputs from its
seed) whose variant may name one of the backward's own, prefixed `bwd:`, which the registry leaves
alone and this module applies on top:

  bwd:grad_ones         grad_out all ones: a loss's own gradient (cross_entropy's: the scalar 1.0),
                        which a backward that branches on "grad_out is exactly 1" gets wrong
  bwd:grad_scale:<s>    grad_out scaled by s (1e-8: below fp16's smallest subnormal, where a bf16
                        gradient cast to fp16 vanishes; 1e4: a loss scaler's)
  bwd:grad_correlated   grad_out the reference output itself (unit rms): a weight gradient's terms
                        share a sign, so its sums grow with the rows, as a low-precision
                        accumulator cannot follow
  bwd:grad_transposed   grad_out column-major (the gradient of a transposed use of the output)
  bwd:grad_broadcast    grad_out one row expanded over the rows, stride 0 (the gradient of out.sum(0),
                        of a bias-like use of the output)
  bwd:weight_zeros      a norm's weight with exact zeros (a pruned or zero-initialised weight)
  bwd:ignore_index      cross_entropy targets with -100 (PyTorch's ignore_index): padded positions

A laid-out grad_out (transposed, broadcast) lives in a buffer wider than its view whose other
elements are NaN: a backward that walks it with the strides of a dense tensor reads NaN, not memory
past the buffer, and fails with a wrong answer instead of crashing the worker.

Both processes build every tensor here bitwise alike from the case (on the CPU, then moved with
its strides kept), so the judging process rebuilds what the worker handed the candidate.
"""
from __future__ import annotations

import torch

from harness.kernel_types import gradients, registry
from harness.kernel_types.registry import Case

PREFIX = "bwd:"
IGNORE_INDEX = -100  # F.cross_entropy's default: what a padded batch's labels hold
ZERO_EVERY = 4  # bwd:weight_zeros: every fourth weight (and the first) is exactly 0
IGNORE_EVERY = 4  # bwd:ignore_index: every fourth target (and the second) is ignored, never all of them


def own(case: Case) -> str:
    """The backward's own variant of a case ('' for a registry variant)."""
    return case.variant[len(PREFIX):] if case.variant.startswith(PREFIX) else ""


def inputs(case: Case, device: str | torch.device = "cpu") -> tuple[list, dict]:
    """The case's inputs on `device` (strides kept), with the backward's own variant applied."""
    args, kwargs = registry.build_inputs(case, "cpu")
    kt = registry.get(case.kernel_type)
    what = own(case)
    if what == "weight_zeros" and "weight" in kt.params:
        w = args[kt.params.index("weight")]
        w[::ZERO_EVERY] = 0
    if what == "ignore_index" and "targets" in kt.params:
        t = args[kt.params.index("targets")]
        t[1::IGNORE_EVERY] = IGNORE_INDEX
    return [registry.to_device(a, device) for a in args], kwargs


def upstream(case: Case, args: list, kwargs: dict, device: str | torch.device = "cpu") -> torch.Tensor:
    """The case's upstream gradient on `device`, in the output's dtype and the variant's layout."""
    what = own(case)
    if not what:
        return gradients.upstream(case, args, kwargs, device)
    shape, dtype = gradients.out_shape_dtype(case, args, kwargs)
    gen = torch.Generator().manual_seed(case.seed + gradients.UPSTREAM_SEED)
    g = torch.randn(shape, generator=gen, dtype=torch.float32)
    if what == "grad_ones":
        g = torch.ones(shape, dtype=torch.float32)
    elif what.startswith("grad_scale:"):
        g = g * float(what.split(":", 1)[1])
    elif what == "grad_correlated":
        g = _correlated(case, args, kwargs, g)
    g = g.to(dtype)
    if what == "grad_transposed" and g.dim() >= 2:
        g = _in_nan_buffer(g, column_major=True)
    elif what == "grad_broadcast" and g.dim() >= 1:
        g = _broadcast(g)
    return registry.to_device(g, device)


def _correlated(case: Case, args: list, kwargs: dict, noise: torch.Tensor) -> torch.Tensor:
    """The reference output at unit rms, a little noise on top (no element exactly predictable)."""
    kt = registry.get(case.kernel_type)
    with torch.no_grad():
        ref = kt.reference(*[a.to("cpu") if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
    ref = torch.nan_to_num(ref.double(), nan=0.0, posinf=0.0, neginf=0.0)
    rms = float(ref.pow(2).mean().sqrt()) if ref.numel() else 0.0
    return (ref / (rms or 1.0)).float() + 0.05 * noise


def _in_nan_buffer(g: torch.Tensor, column_major: bool) -> torch.Tensor:
    """g's values, column-major in its last two dims, at the start of a buffer twice its size whose
    other elements are NaN."""
    buffer = torch.full((2 * g.numel() + 64,), float("nan"), dtype=g.dtype)
    t = g.transpose(-1, -2) if column_major else g
    view = buffer[:g.numel()].view(t.shape)
    view.copy_(t)
    return view.transpose(-1, -2) if column_major else view


def _broadcast(g: torch.Tensor) -> torch.Tensor:
    """g's first row expanded over every row (stride 0 in the leading dims), in a buffer as large as
    g whose other rows are NaN."""
    buffer = torch.full((g.numel() + 64,), float("nan"), dtype=g.dtype)
    if g.dim() == 1:  # a row of scalars (reduce's output): one value expanded
        buffer[0] = g[0]
        return buffer[:1].expand(g.shape)
    row = g.reshape(-1, g.shape[-1])[0]
    buffer[:row.numel()] = row
    return buffer[:row.numel()].expand(g.shape)


def has_layout(case: Case, out_dims: int) -> bool:
    """Whether the case's grad_out layout can be made for an output of `out_dims` dims."""
    what = own(case)
    if what == "grad_transposed":
        return out_dims >= 2
    if what == "grad_broadcast":
        return out_dims >= 1
    return True
