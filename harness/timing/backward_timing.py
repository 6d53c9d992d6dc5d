"""Timing a training step's pieces: forward, backward and forward+backward, and their peak memory.

The candidate's (its kernel_fn and backward_fn) are timed in its worker once every backward stage
passed; eager autograd's and torch.compile's joint graph (AOTAutograd compiles forward and
backward together: a compiled forward's backward runs the compiled backward) are timed in the
clean baseline worker (harness/workers/baseline.py), which never imports a candidate. All are
timed alike: the same budget, inputs and grad_out refilled in place with fresh values before
every rep (harness/timing/fresh_inputs.py; grad_out's noise from a seed of its own, under the
same secret salt), every rep reported to the judge's witness as it ends, the parent taking the
figures from its witness, not from a record. A backward rep's forward runs before the timed
region, in `before_each`. The candidate's timed calls are recorded and checked like its checked
calls (harness/timing/backward_timed.py).

Memory: the peak allocated by one forward+backward at the timing shape, above what was allocated
before it (torch.cuda.max_memory_allocated). The CPU's allocator keeps no such count: there the
figure is not measured, and said so.
"""
from __future__ import annotations

import torch

from harness.correctness import backward_values
from harness.kernel_types import gradients, registry
from harness.kernel_types.registry import Case
from harness.timing.fresh_inputs import FreshInputs, perturbed, scales

STEPS = ("forward", "backward", "forward_backward")
NOT_ON_CPU = "not measured on the CPU: its allocator keeps no peak; measured on a GPU only"


def train_phase(kind: str, phase: str) -> str:
    """The witness phase of a clean-worker training job: train:eager:backward -> eager:train:backward:job3
    (its first word says a baseline's, which a candidate's process may never send)."""
    how, step = kind.split(":")[1:]
    return f"{how}:train:{step}:{phase}"


def upstream_case(case: Case) -> Case:
    """The case whose rep seeds grad_out's noise: apart from the inputs' (same rep, same salt)."""
    return case.replace(seed=case.seed + gradients.UPSTREAM_SEED)


def fresh_upstream(case: Case, rep: int, args: list, kwargs: dict, device: str | torch.device,
                   salt: int = 0) -> torch.Tensor:
    """Rep `rep`'s grad_out (the judging process's copy): the case's upstream gradient plus noise."""
    base = backward_values.upstream(case, args, kwargs, device)
    return perturbed([base], scales([base]), upstream_case(case), rep, device, salt)[0]


class FreshUpstream:
    """The timed case's grad_out, one buffer refilled in place with rep r's fresh values before rep r."""

    def __init__(self, case: Case, args: list, kwargs: dict, device: str, salt: int = 0):
        self.grad_out = backward_values.upstream(case, args, kwargs, device)
        base = [self.grad_out.clone()]
        scale = scales(base)

        def values(rep: int) -> torch.Tensor:  # the salt in a closure, not an attribute
            return perturbed(base, scale, upstream_case(case), rep, device, salt)[0]
        self._values = values

    def refill(self, rep: int) -> None:
        with torch.no_grad():
            self.grad_out.copy_(self._values(rep))


class Steps:
    """The three callables and their before_each, on one case's fresh inputs and grad_out."""

    def __init__(self, case: Case, device: str, salt: int = 0):
        self.case, self.device = case, device
        self.kt = registry.get(case.kernel_type)
        self.inputs = FreshInputs(case, device, salt)
        self.upstream = FreshUpstream(case, self.inputs.args, self.inputs.kwargs, device, salt)
        self.grad_out = self.upstream.grad_out
        self.state: dict = {}

    def prepare(self, rep: int) -> None:
        self.inputs.refill(rep)
        self.upstream.refill(rep)

    def forward(self):
        raise NotImplementedError

    def backward(self):
        raise NotImplementedError

    def before(self, step: str):
        if step != "backward":
            return self.prepare

        def with_forward(rep: int) -> None:  # a backward rep's forward, outside the timed region
            self.prepare(rep)
            self.forward()
        return with_forward

    def call(self, step: str):
        if step == "forward":
            return self.forward
        if step == "backward":
            return self.backward
        return lambda: (self.forward(), self.backward())


class AutogradSteps(Steps):
    """PyTorch's own op under autograd: eager, or torch.compile of it (its joint graph)."""

    def __init__(self, case: Case, device: str, fn):
        super().__init__(case, device)
        self.fn = fn

    def prepare(self, rep: int) -> None:
        super().prepare(rep)
        self.state["args"] = [a.detach().requires_grad_(name in self.kt.grad_params)
                              if isinstance(a, torch.Tensor) and a.is_floating_point() else a
                              for name, a in zip(self.kt.params, self.inputs.args)]

    def forward(self):
        self.state["out"] = self.fn(*self.state["args"], **self.inputs.kwargs)

    def backward(self):
        leaves = [a for name, a in zip(self.kt.params, self.state["args"]) if name in self.kt.grad_params]
        return torch.autograd.grad(self.state["out"], leaves, self.grad_out)


class CandidateSteps(Steps):
    """The file's kernel_fn and backward_fn, each call under the op recorder the checked calls had."""

    def __init__(self, case: Case, device: str, module, recorder, salt: int = 0):
        super().__init__(case, device, salt)
        self.module, self.recorder = module, recorder

    def forward(self):
        with self.recorder():
            self.state["out"] = self.module.kernel_fn(*self.inputs.args, **self.inputs.kwargs)

    def backward(self):
        with self.recorder():
            return self.module.backward_fn(self.grad_out, self.state["out"], *self.inputs.args, **self.inputs.kwargs)


def peak_memory(steps: Steps) -> dict:
    """The peak bytes one forward+backward allocates above what was allocated before it."""
    if steps.device != "cuda":
        return {"measured": False, "detail": NOT_ON_CPU}
    steps.prepare(0)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    steps.forward()
    steps.backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    steps.state.clear()
    return {"measured": True, "peak_bytes": int(peak)}


def time_step(steps: Steps, step: str, report, phase: str, limits: dict | None = None):
    from harness.timing.measurement import budget
    from harness.timing.timer import time_fn
    return time_fn(steps.call(step), device=steps.device, before_each=steps.before(step), report=report,
                   phase=phase, **(limits or budget(steps.device)))
