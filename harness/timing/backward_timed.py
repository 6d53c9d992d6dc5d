"""Every timed call of a training step checked like a checked call (the worker's side).

The backward's timing (forward, backward and forward+backward at the timing shape,
harness/timing/backward_timing.py) is held to what the forward's timing is held to
(harness/timing/timed_calls.py): a backward that could tell a timed call from a checked one could
be honest only when checked (do nothing at the timing shape, return last rep's gradients when
handed the same grad_out again). So before every rep the inputs and grad_out are refilled in place
with fresh values (from a secret salt of each step's own, revealed in the stage's final record),
and after it, outside the timed region and before the next refill:

- its observations are recorded as a checked call's are: launches, PyTorch compute, host reads,
  grad_out and the inputs unchanged, every gradient a plain tensor of its own;
- each output (the forward's, each gradient) is checksummed on the device with a secret key
  (harness/timing/timed_outputs.py) and saved where every rep's fit the save budget, else when the
  key draws it;
- each output is compared on the device with the reference rebuilt there from the rep's own inputs
  and grad_out: float64 autograd of the type's reference for the gradients, under the judge's
  gradient bounds (harness/kernel_types/gradients.py), the forward's device check for its output.

The judging process (harness/verdict/backward_timed_checks.py) fails the backward's timing on any
rep whose record is missing, whose observations break a rule, whose device comparison failed, on a
saved set the revealed key did not choose, a checksum that does not match, or a saved output its
own references reject.
"""
from __future__ import annotations

import gc

import torch

from harness.correctness import backward
from harness.correctness.candidate import CallResult, observe
from harness.correctness.compare import check_values
from harness.correctness.integrity import ComputeRecorder
from harness.kernel_types import gradients
from harness.timing.backward_timing import Steps
from harness.timing.device_check import check_on_device, unaffordable
from harness.timing.timed_outputs import SavedOutputs, keyed_checksum, save_policy

FORWARD, BACKWARD = ("forward", "forward_backward"), ("backward", "forward_backward")


def slots(step: str, n_grads: int) -> list[str]:
    """The outputs a rep of `step` gives, in record order: the forward's, then each gradient."""
    return (["out"] if step in FORWARD else []) + ([f"grad{i}" for i in range(n_grads)] if step in BACKWARD else [])


def policy(case, args: list, kwargs: dict, device: str, limits: dict, step: str):
    """Which reps' outputs are saved (harness/timing/timed_outputs.py): every one where all of them fit."""
    grads = sum(a.numel() * a.element_size() for a in gradients_of(case, args)) if step in BACKWARD else 0
    return save_policy(case, args, kwargs, device, limits, extra_bytes=grads, forward=step in FORWARD)


def gradients_of(case, args: list) -> list:
    from harness.kernel_types import registry
    kt = registry.get(case.kernel_type)
    return [a for name, a in zip(kt.params, args) if name in kt.grad_params]


def gradient_check(case, grads, args: list, kwargs: dict, grad_out: torch.Tensor, device: str) -> dict:
    """The gradients of one rep against float64 autograd of the reference on `device`:
    {"ok", "worst_ratio", "detail"}."""
    returned = type(grads).__name__
    grads = list(grads) if isinstance(grads, (tuple, list)) else []
    problem = backward.returned_problem(case, returned, grads, args)
    if problem:
        return {"ok": False, "worst_ratio": None, "detail": problem}
    refs = gradients.reference_grads(case, (args, kwargs), grad_out, device)
    sizes = gradients.magnitudes(case, (args, kwargs), grad_out, device)
    worst = 0.0
    for (name, _, dtype), g, ref, size in zip(gradients.expected(case, args), grads, refs, sizes):
        with torch.no_grad():
            cmp = check_values(g.detach().to(ref.device, torch.float64), ref,
                               gradients.bound(case, name, ref, dtype, size), dtype)
        if not cmp.ok:
            return {"ok": False, "worst_ratio": cmp.worst_ratio, "detail": f"gradient of {name}: {cmp.detail}"}
        worst = max(worst, cmp.worst_ratio)
    return {"ok": True, "worst_ratio": worst, "detail": f"gradients within {worst:.2f} of the tolerance"}


class TimedStep:
    """One step's timed callable and its before_each(rep), every call recorded and checked.
    `key`: the step's secret (which outputs are saved, the checksums' key), held in closures."""

    def __init__(self, module, case, device: str, step: str, monitor, log, stage: str, salt: int, key: int,
                 limits: dict, check=None):
        self.module, self.case, self.device, self.step = module, case, device, step
        self.monitor, self.log, self.stage = monitor, log, stage
        self.check = check  # after every rep, outside the timed region: the clocks are still the judge's
        self.steps = Steps(case, device, salt)
        args, kwargs = self.steps.inputs.args, self.steps.inputs.kwargs
        self.policy = policy(case, args, kwargs, device, limits, step)
        self._saved = [SavedOutputs(self.policy, key, log.save) for _ in slots(step, len(gradients_of(case, args)))]
        tables: dict = {}
        self._checksum = lambda t: keyed_checksum(t, key, tables)
        self._skipped = unaffordable(case, torch.device(device).type)
        self._pending: tuple | None = None
        self._out = self._grads = None
        self._forward_obs: dict | None = None
        self._out_snapshot = None  # the forward's output as the backward got it (the backward step's)
        self._recorders: tuple = ()
        self._mid = 0  # the launch count between a forward+backward rep's two calls
        self.recorded = 0

    # -- around each rep ----------------------------------------------------------------------
    def before(self, rep: int) -> None:
        self.finish()
        self._out = self._grads = self._forward_obs = self._out_snapshot = None
        self._recorders = ()
        gc.disable()  # as timed_calls.py: no collector (and no finalizer of the candidate's) from here to the call
        self.steps.prepare(rep)
        args = self.steps.inputs.args
        snapshots = [t.clone() if isinstance(t, torch.Tensor) else None for t in (self.steps.grad_out, *args)]
        if self.step == "backward":  # its forward, outside the timed region, watched like any call
            recorder, launches = ComputeRecorder(self.monitor), self.monitor.launches
            with recorder:
                self._out = self.module.kernel_fn(*args, **self.steps.inputs.kwargs)
            self._forward_obs = observe(CallResult(), self._out, args, snapshots[1:], recorder,
                                        self.monitor.launches - launches).observations()
            self._out_snapshot = self._out.clone() if isinstance(self._out, torch.Tensor) else None
        self._recorders = (ComputeRecorder(self.monitor), ComputeRecorder(self.monitor))
        self._pending = (rep, snapshots, self.monitor.launches)

    def call(self) -> None:
        args, kwargs = self.steps.inputs.args, self.steps.inputs.kwargs
        forward, back = self._recorders
        try:
            if self.step in FORWARD:
                with forward:
                    self._out = self.module.kernel_fn(*args, **kwargs)
                self._mid = self.monitor.launches
            if self.step in BACKWARD:
                with back:
                    self._grads = self.module.backward_fn(self.steps.grad_out, self._out, *args, **kwargs)
        finally:
            gc.enable()

    def finish(self, last: bool = False) -> None:
        """Record the rep that last ran (outside the timed region); `last`: it ended a round."""
        gc.enable()
        if self._pending is None:
            return
        rep, snapshots, start = self._pending
        self._pending = None
        if self.check is not None:
            self.check()
        outputs = ([self._out] if self.step in FORWARD else []) + \
            (list(self._grads) if self.step in BACKWARD and isinstance(self._grads, (tuple, list)) else [])
        checksums = [self._checksum(t) for t in outputs]  # first, closest to the call
        obs = self._observations(snapshots, start)
        check = self._device_check(snapshots)
        names = [saved.keep(rep, t, last) for saved, t in zip(self._saved, outputs)]
        self.log.event(event="case", stage=self.stage, role=f"timed:{self.step}", step=self.step, rep=rep,
                       case=self.case.to_json(), label=self.case.label(), outputs=names, checksums=checksums,
                       returned=type(self._grads).__name__ if self.step in BACKWARD else None,
                       obs=obs, device_check=check, error=None, seconds=0.0)
        self.recorded += 1

    def close(self) -> list[dict[int, str]]:
        """After the last round: the drawn outputs still held, saved, per output slot {rep: name}."""
        return [saved.close() for saved in self._saved]

    # -- what a rep did -----------------------------------------------------------------------
    def _observations(self, snapshots: list, start: int) -> dict:
        args = self.steps.inputs.args
        obs: dict = {}
        end = self.monitor.launches
        if self.step in FORWARD:
            mid = self._mid if self.step == "forward_backward" else end
            obs["forward"] = observe(CallResult(), self._out, args, snapshots[1:], self._recorders[0],
                                     mid - start).observations()
            start = mid
        elif self._forward_obs is not None:
            obs["forward"] = self._forward_obs
        if self.step in BACKWARD:
            given = [self.steps.grad_out, self._out, *args]
            # out: checked where the forward ran outside the timed region (the backward step)
            res = observe(CallResult(), self._grads, given, [snapshots[0], self._out_snapshot, *snapshots[1:]],
                          self._recorders[1], end - start)
            backward.observe_grads(res, given)
            obs["backward"] = backward.observations(res)
        return obs

    def _device_check(self, snapshots: list) -> dict:
        """The rep's outputs against references rebuilt on the device from its own inputs."""
        if self._skipped:
            return {"skipped": self._skipped}
        grad_out = snapshots[0]
        inputs = [s if s is not None else a for s, a in zip(snapshots[1:], self.steps.inputs.args)]
        kwargs = self.steps.inputs.kwargs
        if self.step in FORWARD:
            forward = check_on_device(self.case, self._out, inputs, kwargs, self.device)
            if not forward["ok"]:
                return {**forward, "detail": f"kernel_fn's output: {forward['detail']}"}
        if self.step in BACKWARD:
            return {**gradient_check(self.case, self._grads, inputs, kwargs, grad_out, self.device), "how": "float64"}
        return forward
