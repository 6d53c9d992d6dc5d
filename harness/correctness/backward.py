"""The backward of a kernel file: its cases, one observed call, and the check of what it returned.

A file with `backward_fn(grad_out, out, <the type's params>)` is judged twice, forward then
backward, and gated apart (docs/judge.md). The backward's cases are the forward's (same shape
sweep, stability extremes and edge cases, same inputs from the same seeds) under a random
upstream gradient (harness/kernel_types/gradients.py), and its own
(harness/correctness/backward_cases.py): rows past the SM counts of the GPUs it targets, four
leading dims, the timing shape, the values and grad_out layouts a training step gives
(harness/correctness/backward_values.py), weight gradients summed over thousands of rows in every
dtype served, and one case called three times (determinism). With a target, the shapes around it
too (harness/verdict/around.py): where the backward was right there is its training serving range.
Each call runs the file's own forward first (its `out` is what a served backward receives; it is
checked too: a training call serves both), then the backward, watched like a forward call:
launches, PyTorch compute, host reads, what it wrote.

Shared by the worker (which stops at a first failure) and the judging process (which decides,
from the outputs it reloads and references it rebuilds).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.correctness import backward_cases, backward_values
from harness.correctness.candidate import CallResult, _storage_ptr, observed_call
from harness.correctness.cases import Capabilities, Plan
from harness.correctness.compare import check_values, compare
from harness.kernel_types import gradients, registry
from harness.kernel_types.registry import Case

PREFIX = "backward:"  # the worker's records of a backward stage are named backward:<stage>
STAGES = ("compile", "shape_sweep", "stability", "values", "edge_cases", "accumulation", "determinism", "integrity")
AROUND = "around"  # the shapes around a target: recorded, never the verdict's (they bound the serving range)
# A sum whose order follows an address (as atomics' does) differs from call to call only where the
# addresses it follows do: at three calls, one kernel summing from an address-chosen start saw the
# same start, or the same bits, often enough to pass now and then; five calls of one small case cost
# little and make that rare
DETERMINISM_CALLS = 5


def event_stage(stage: str) -> str:
    return PREFIX + stage


@dataclass
class BackwardPlan:
    stages: dict[str, list[Case]] = field(default_factory=dict)
    timing: Case | None = None
    around: list[Case] = field(default_factory=list)
    # the forward's own cases: there its output was judged already; elsewhere a backward case checks it
    forward: set = field(default_factory=set)

    def checks_forward(self, case: Case) -> bool:
        return case not in self.forward


def build(plan: Plan, caps: Capabilities, around: list[Case] | tuple = ()) -> BackwardPlan:
    """The backward's cases, from the forward's plan (the same cases, so the same inputs) and its
    own (harness/correctness/backward_cases.py); `around`: the shapes around a target, when asked."""
    kernel_type = plan.stages["smoke"][0].kernel_type
    bp = BackwardPlan(timing=plan.timing, around=list(around),
                      forward={c for cases in plan.stages.values() for c in cases})
    bp.stages["compile"] = list(plan.stages["smoke"])
    sweep = backward_cases.by_turn(plan.stages["shape_sweep"], caps, drop_most_rows=True)
    bp.stages["shape_sweep"] = sweep + [c for c in backward_cases.shapes(kernel_type, caps, plan.timing)
                                        if not any(backward_cases.same_problem(c, s) for s in sweep)]
    bp.stages["stability"] = list(plan.stages["stability"])
    bp.stages["values"] = backward_cases.values(kernel_type, caps)
    bp.stages["edge_cases"] = (backward_cases.by_turn(plan.stages["edge_cases"], caps)
                               + backward_cases.layouts(kernel_type))
    bp.stages["accumulation"] = backward_cases.accumulation(kernel_type, caps, plan.stages["shape_sweep"],
                                                            plan.judged_dtype)
    bp.stages["determinism"] = [backward_cases.determinism(kernel_type, caps)]
    bp.stages["integrity"] = list(plan.stages["integrity"])
    return bp


# -- one call ------------------------------------------------------------------------------
@dataclass
class BackwardCall:
    """What one backward call gave and did (the forward's error, if the forward raised first)."""
    forward_error: str | None
    result: CallResult | None
    grad_out: torch.Tensor | None = None
    out: torch.Tensor | None = None

    def grads(self) -> list:
        out = self.result.output if self.result is not None else None
        return list(out) if isinstance(out, (tuple, list)) else []


def inputs(case: Case, device: str | torch.device = "cpu") -> tuple[list, dict]:
    """The case's inputs, as the backward's cases make them (harness/correctness/backward_values.py)."""
    return backward_values.inputs(case, device)


def call(module, case: Case, args: list, kwargs: dict, device: str, monitor) -> BackwardCall:
    """The file's forward at the case's inputs, then its backward under the case's upstream gradient."""
    fwd = observed_call(module.kernel_fn, args, kwargs, monitor)
    if fwd.error:
        return BackwardCall(fwd.error, None)
    grad_out = backward_values.upstream(case, args, kwargs, device)
    res = observed_call(module.backward_fn, [grad_out, fwd.output, *args], kwargs, monitor)
    observe_grads(res, [grad_out, fwd.output, *args])
    return BackwardCall(None, res, grad_out, fwd.output)


def observe_grads(res: CallResult, given: list) -> None:
    """A backward returns a tuple: each gradient held to what a forward's output is held to."""
    if res.error:
        return
    returned = res.output
    res.plain = isinstance(returned, (tuple, list))
    res.aliased = False
    ptrs = {_storage_ptr(t): i for i, t in reversed(list(enumerate(given))) if isinstance(t, torch.Tensor)}
    grads = []
    for g in (returned if res.plain else []):
        if not isinstance(g, torch.Tensor):
            grads.append({"tensor": False})
            continue
        # a gradient sharing storage with grad_out, out or an input changes when the caller reuses it
        alias = ptrs.get(_storage_ptr(g))
        grads.append({"tensor": True, "plain": type(g) is torch.Tensor and g.layout == torch.strided,
                      "device": str(g.device), "alias": alias})
    res.grads_obs = grads  # type: ignore[attr-defined]


def observations(res: CallResult) -> dict:
    return {**res.observations(), "grads": getattr(res, "grads_obs", []),
            "returned": type(res.output).__name__}


# -- what it returned ----------------------------------------------------------------------
def given_name(i: int, kt) -> str:
    """The name of argument i of backward_fn(grad_out, out, *params)."""
    return ("grad_out", "out", *kt.params)[i] if i < 2 + len(kt.params) else f"argument {i}"


def returned_problem(case: Case, returned: str, grads: list, args: list) -> str | None:
    """Why what backward_fn returned is not one gradient per differentiable parameter, each shaped
    and typed like its input, or None. `grads`: the returned elements (tensors or not)."""
    kt = registry.get(case.kernel_type)
    want = gradients.expected(case, args)
    names = ", ".join(n for n, _, _ in want)
    if returned not in ("tuple", "list"):
        return (f"{case.label()}: backward_fn returned a {returned}; it must return a tuple with one gradient "
                f"per differentiable parameter of {kt.name}, in order: ({names})")
    if len(grads) != len(want):
        missing = [n for n, _, _ in want[len(grads):]]
        return (f"{case.label()}: backward_fn returned {len(grads)} gradient(s); {kt.name} wants {len(want)}, one "
                f"per differentiable parameter in order: ({names})"
                + (f"; missing: {', '.join(missing)}" if missing else "; remove the extra ones"))
    for i, (g, (name, shape, dtype)) in enumerate(zip(grads, want)):
        if not isinstance(g, torch.Tensor):
            return f"{case.label()}: gradient {i} ({name}) is {type(g).__name__}, not a tensor"
        if tuple(g.shape) != shape:
            return (f"{case.label()}: gradient {i} ({name}) has shape {tuple(g.shape)}; its input has shape "
                    f"{shape}: each gradient is shaped like its input")
        if g.dtype != dtype:
            return f"{case.label()}: gradient {i} ({name}) is {g.dtype}; its input is {dtype}: same dtype as the input"
    return None


def values_problem(case: Case, grads: list, inputs: tuple[list, dict],
                   grad_out: torch.Tensor | None = None) -> str | None:
    """Each gradient against float64 autograd of the reference (harness/kernel_types/gradients.py),
    under the case's upstream gradient (or `grad_out`: a timed rep's fresh one)."""
    args, kwargs = inputs
    if grad_out is None:
        grad_out = backward_values.upstream(case, args, kwargs)
    refs = gradients.reference_grads(case, inputs, grad_out)
    sizes = gradients.magnitudes(case, inputs, grad_out)
    summed = registry.get(case.kernel_type).summed_grads
    # a sum over rows under a correlated gradient, measured against the magnitude of its terms (a
    # norm's weight and bias): held to what one rounding of an fp32 sum allows. Where the terms
    # cancel and no such magnitude is known (matmul's b, the MLP's weights, whose backward rounds
    # its intermediates for the dot products), the gradient tolerance stands.
    tight = gradients.ACCUMULATION_TOLERANCES if backward_values.own(case) == "grad_correlated" else None
    for (name, _, dtype), g, ref, size in zip(gradients.expected(case, args), grads, refs, sizes):
        bound = gradients.bound(case, name, ref, dtype, size, tight if name in summed and size is not None else None)
        cmp = check_values(g.detach().to("cpu", torch.float64), ref, bound, dtype)
        if not cmp.ok:
            return f"{case.label()}: gradient of {name}: {cmp.detail}"
    return None


def forward_problem(case: Case, out, inputs: tuple[list, dict]) -> str | None:
    """Why the forward's output in a backward case is wrong (a training call serves it too), or None."""
    kt = registry.get(case.kernel_type)
    args, kwargs = inputs
    with torch.no_grad():
        ref = kt.reference(*args, **kwargs)
    cmp = compare(out, ref, case, args)
    return None if cmp.ok else f"{case.label()}: kernel_fn's output (the forward of this training call): {cmp.detail}"


def check(case: Case, returned: str, grads: list, inputs: tuple[list, dict], out=None) -> str | None:
    """Why this backward call's gradients (or, given, its forward's `out`) are wrong for `case` (on
    the CPU `inputs`), or None."""
    return (returned_problem(case, returned, grads, inputs[0]) or values_problem(case, grads, inputs)
            or (forward_problem(case, out, inputs) if out is not None else None))


# a backward that writes into grad_out corrupts a gradient autograd hands on to the other uses of
# the same output (h * 2 + norm(h)): no declaration makes that safe, so none is granted
READ_ONLY = " (grad_out is read only: write into memory the backward allocates)"


def observation_problem(label: str, obs: dict, device: str, kt) -> str | None:
    """What one backward call's observations break of the integrity rules, or None."""
    from harness.correctness import integrity
    mutated = list(obs.get("mutated", []))
    base = {**obs, "mutated": [], "aliased": False, "plain": True, "device": ""}
    problem = integrity.observation_problem(label, base, device)
    if problem:
        return problem.replace("kernel_fn", "backward_fn")
    for i, g in enumerate(obs.get("grads", [])):
        if not g.get("tensor"):
            continue
        # a gradient aliasing grad_out, out or an input changes when the caller reuses that tensor
        if g.get("alias") is not None:
            return (f"{label}: gradient {i} shares storage with {given_name(g['alias'], kt)}: return a new "
                    "tensor for every gradient")
        if not g.get("plain", True):
            return f"{label}: gradient {i} is not a plain dense torch.Tensor"
        if g.get("device") and not g["device"].startswith(device):
            return f"{label}: gradient {i} is on {g['device']}, not on {device}"
    if mutated:
        # a backward that writes into grad_out (undeclared), out or an input corrupts tensors autograd still holds
        names = ", ".join(given_name(i, kt) for i in mutated)
        return f"{label}: backward_fn modified {names} in place{READ_ONLY if 0 in mutated else ''}"
    return None
