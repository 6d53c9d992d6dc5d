"""Every timed call watched and checked exactly like a checked call (the worker's side).

A kernel that can tell a timed call from a checked one can be honest only when checked: return
torch.softmax when no op recorder is pushed, or garbage on every timed rep but the one whose output
is compared. So every timed call runs as a checked call does (harness/correctness/candidate.py's
observed_call): the same ComputeRecorder (a TorchDispatchMode) pushed around it, the same grad mode,
the same LaunchMonitor, on buffers refilled with fresh values (harness/timing/fresh_inputs.py). What a
kernel can observe from inside (the dispatch stack's length, grad mode, the shapes, how often it
was called) is the same for both, and every timed output is recorded like a checked one: its
observations (PyTorch compute, launches, input mutation, aliasing, a plain dense tensor on the
device) and the output itself, saved outside the timed region before the next rep's refill. The
judging process then holds each timed call to the integrity rules and compares the outputs with
the references it rebuilds from (case, rep) (harness/verdict/timing_checks.py).

Where the judge takes no word of the worker's. The outputs are saved to files, every one of them
(on a GPU a host copy after the rep's synchronize; the reps are capped so that all fit
SAVE_BYTES); which of them the parent compares is chosen in the parent after the worker has exited
(all of them where the references are cheap, as on the CPU; else a random sample with the first
and last), so the kernel cannot know which rep counts, and on the device where the references are
large (harness/kernel_types/references.py). A kernel that is wrong on a fraction f of the reps survives a sample
of s with probability (1 - f)^s; to move a median it must be wrong on more than half of them.

Cost. The recorder sits inside the timed region: pushing and popping it costs a few µs of host
time per call, and each aten op the wrapper dispatches (allocation, views, casts) a Python call of a
few µs more (2 to 5 µs and 4 to 8 µs on a loaded 2-core machine: benchmarks/recording_overhead.py);
nothing per Triton or CUDA launch, nothing on the device. The eager baseline is timed without it,
so recording can only understate a candidate's speedup, never overstate it; on a GPU it shows only
where the host is a kernel's bottleneck (a kernel of a few µs behind a wrapper of a few ops).
"""
from __future__ import annotations

import gc
import math

import torch

from harness.correctness.candidate import CallResult, observe
from harness.timing.fresh_inputs import FreshInputs
from harness.correctness.integrity import ComputeRecorder

SAVE_BYTES = {"cpu": 256 * 2**20, "cuda": 512 * 2**20}  # all of one timing's saved outputs, at most


class TimedCalls:
    """The timed callable and its `before_each(rep)`: refill, snapshot and recorder outside the
    timed region, the call alone inside it, the previous rep's record written before the next."""

    def __init__(self, kernel_fn, inputs: FreshInputs, monitor, log, stage: str, check=None):
        self.kernel_fn, self.inputs, self.monitor, self.log, self.stage = kernel_fn, inputs, monitor, log, stage
        self.check = check
        self._pending: tuple | None = None
        self._recorder = ComputeRecorder(monitor)
        self._out = None
        self.recorded = 0

    def before(self, rep: int) -> None:
        self.finish()
        # Drop everything of the previous call's before the refill: the last reference to its output
        # going can run the candidate's code (a weakref callback, a finalizer); run after the refill,
        # that code could compute this rep's answer outside the timed region, leaving the timed call
        # a copy. Dropped here, whatever it does acts on values no timed call will see; and no
        # collection runs between the refill and the call (one could free a cycle that holds an
        # output and so run such code there): the collector waits until the call has returned.
        self._out = None
        self._recorder = None
        gc.disable()
        self.inputs.refill(rep)
        snapshots = [a.clone() if isinstance(a, torch.Tensor) else None for a in self.inputs.args]
        self._recorder = ComputeRecorder(self.monitor)
        self._pending = (rep, snapshots, self.monitor.launches)

    def call(self) -> None:
        try:
            with self._recorder:
                self._out = self.kernel_fn(*self.inputs.args, **self.inputs.kwargs)
        finally:
            gc.enable()

    def finish(self) -> None:
        """Record the rep that last ran (after the timing loop's synchronize, outside its region)."""
        gc.enable()  # held off only from a refill to its call (a loop that stopped between them)
        if self._pending is None:
            return
        rep, snapshots, launches_before = self._pending
        self._pending = None
        if self.check is not None:
            self.check()
        result = observe(CallResult(), self._out, self.inputs.args, snapshots, self._recorder,
                         self.monitor.launches - launches_before)
        case = self.inputs.case
        self.log.event(event="case", stage=self.stage, role="timed", rep=rep, case=case.to_json(),
                       label=case.label(), output=self.log.save(result.output), error=None,
                       obs=result.observations(), seconds=0.0)
        self.recorded += 1


def capped(limits: dict, inputs: FreshInputs, device: str) -> dict:
    """The timing budget with its reps capped so that every timed output can be saved (an output
    is taken to be as large as the inputs; at least min_reps whatever the size)."""
    nbytes = sum(a.numel() * a.element_size() for a in inputs.args if isinstance(a, torch.Tensor))
    most = SAVE_BYTES.get(device, SAVE_BYTES["cuda"]) // max(nbytes, 1)
    limits = dict(limits)
    limits["max_reps"] = max(limits.get("min_reps", 1), min(limits.get("max_reps", math.inf), most))
    return limits
