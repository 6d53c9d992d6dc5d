"""The backward of a kernel file: its cases, one observed call, and the check of what it returned.

A file with `backward_fn(grad_out, out, <the type's params>)` is judged twice, forward then
backward, and gated apart (docs/judge.md). The backward's cases are the forward's (same shape
sweep, stability extremes and edge cases, same inputs from the same seeds) under a random
upstream gradient (harness/kernel_types/gradients.py), plus the accumulation stage: the largest
sweep shapes again, where a weight gradient is a sum over the most rows and blocks. Each call
runs the file's own forward first (its `out` is what a served backward receives), then the
backward, watched like a forward call: launches, PyTorch compute, host reads, what it wrote.

Shared by the worker (which stops at a first failure) and the judging process (which decides,
from the outputs it reloads and references it rebuilds).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from harness.correctness.candidate import CallResult, _storage_ptr, observed_call
from harness.correctness.cases import Plan
from harness.correctness.compare import check_values
from harness.kernel_types import gradients, registry
from harness.kernel_types.registry import Case

PREFIX = "backward:"  # the worker's records of a backward stage are named backward:<stage>
STAGES = ("compile", "shape_sweep", "stability", "edge_cases", "accumulation", "integrity")
ACCUMULATION_SHAPES = 2  # the largest sweep shapes by rows, and by elements
ACCUMULATION_SEED = 77_000


def event_stage(stage: str) -> str:
    return PREFIX + stage


@dataclass
class BackwardPlan:
    stages: dict[str, list[Case]] = field(default_factory=dict)
    timing: Case | None = None


def build(plan: Plan) -> BackwardPlan:
    """The backward's cases, from the forward's plan: the same cases (so the same inputs), and
    the accumulation stage's largest shapes in fp32 at seeds of their own."""
    bp = BackwardPlan(timing=plan.timing)
    bp.stages["compile"] = list(plan.stages["smoke"])
    for stage in ("shape_sweep", "stability", "edge_cases"):
        bp.stages[stage] = list(plan.stages[stage])
    bp.stages["accumulation"] = accumulation_cases(plan.stages["shape_sweep"])
    bp.stages["integrity"] = list(plan.stages["integrity"])
    return bp


def accumulation_cases(sweep: list[Case]) -> list[Case]:
    """The sweep's shape with the most rows and the one with the most elements (distinct), fp32."""
    def rows(c: Case) -> int:
        return max(1, int(torch.tensor(list(c.dims.values())[:-1] or [1]).prod()))

    def elements(c: Case) -> int:
        return int(torch.tensor(list(c.dims.values())).prod())
    chosen: list[Case] = []
    for key in (rows, elements):
        best = max(sweep, key=key)
        if all(best.shape != c.shape or best.kwargs != c.kwargs for c in chosen):
            chosen.append(best)
    return [c.replace(dtype="float32", variant="plain", seed=ACCUMULATION_SEED + i)
            for i, c in enumerate(chosen[:ACCUMULATION_SHAPES])]


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


def call(module, case: Case, args: list, kwargs: dict, device: str, monitor) -> BackwardCall:
    """The file's forward at the case's inputs, then its backward under the case's upstream gradient."""
    fwd = observed_call(module.kernel_fn, args, kwargs, monitor)
    if fwd.error:
        return BackwardCall(fwd.error, None)
    grad_out = gradients.upstream(case, args, kwargs, device)
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


def values_problem(case: Case, grads: list, inputs: tuple[list, dict]) -> str | None:
    """Each gradient against float64 autograd of the reference (harness/kernel_types/gradients.py)."""
    args, kwargs = inputs
    grad_out = gradients.upstream(case, args, kwargs)
    refs = gradients.reference_grads(case, inputs, grad_out)
    sizes = gradients.magnitudes(case, inputs, grad_out)
    for (name, _, dtype), g, ref, size in zip(gradients.expected(case, args), grads, refs, sizes):
        cmp = check_values(g.detach().to("cpu", torch.float64), ref, gradients.bound(case, name, ref, dtype, size),
                           dtype)
        if not cmp.ok:
            return f"{case.label()}: gradient of {name}: {cmp.detail}"
    return None


def check(case: Case, returned: str, grads: list, inputs: tuple[list, dict]) -> str | None:
    """Why this backward call's gradients are wrong for `case` (on the CPU `inputs`), or None."""
    return returned_problem(case, returned, grads, inputs[0]) or values_problem(case, grads, inputs)


def observation_problem(label: str, obs: dict, device: str, kt, mutates_grad_out: bool) -> str | None:
    """What one backward call's observations break of the integrity rules, or None."""
    from harness.correctness import integrity
    mutated = [i for i in obs.get("mutated", []) if not (i == 0 and mutates_grad_out)]
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
        hint = " (declare MUTATES_GRAD_OUT = True to write into grad_out)" if 0 in mutated else ""
        return f"{label}: backward_fn modified {names} in place{hint}"
    return None
