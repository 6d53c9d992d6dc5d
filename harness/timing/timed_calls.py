"""Every timed call watched and checked exactly like a checked call (the worker's side).

A kernel that can tell a timed call from a checked one can be honest only when checked: return
torch.softmax when no op recorder is pushed, or garbage on every timed rep but the one whose output
is compared. So every timed call runs as a checked call does (harness/correctness/candidate.py's
observed_call): the same ComputeRecorder (a TorchDispatchMode) pushed around it, the inputs passed
as served inference passes them (weights as nn.Parameters, under torch.no_grad(): one of the modes
checked calls are made in, harness/correctness/as_passed.py), the same LaunchMonitor, on guarded
buffers refilled with fresh values (harness/timing/fresh_inputs.py). What a kernel can observe from
inside (the dispatch stack's length, grad mode, the shapes, how often it was called) is the same
for both, and every timed output is recorded like a checked one: its observations (PyTorch
compute, launches, input mutation and stores outside an input's elements, read from the whole of
each input's guarded buffer, aliasing, a plain dense tensor on the device) written outside the
timed region before the next rep's refill. The judging process then
holds each timed call to the integrity rules (harness/verdict/timing_checks.py).

Where the outputs go. Copying every output to the host would cost a large target gigabytes per
verdict (a 4096x32000 fp16 softmax: 262 MB a rep), so an output leaves the device only when it is
in the saved sample; every one is checked where it was made, right after its rep, outside the
timed region, by the judge's own code:
- compared with the reference rebuilt on the device from the rep's inputs as refilled, in float64
  (float32 with a derived bound where the device is slow at float64), where that is affordable
  (harness/timing/device_check.py): the verdict and the max scaled error go in the rep's record;
- checksummed on the device with integer arithmetic over its raw bits, keyed by a secret
  (harness/timing/timed_outputs.py), in the rep's record too. The record's digest travels over the
  witness as it is written (harness/workers/worker.py's Log), so neither can be changed later.
Saved: every output where all of them fit SAVE_BYTES (the CPU's timing shapes, small targets: the
judging process keeps its full check there), else the first call's, each round's last and a few a
reservoir draws from every call, held on the device until the timing ends. The draws and the
checksum's key come from a secret the worker drew before the import, held in closures and revealed
only in the stage's final record after its last timed call, so the kernel cannot know which rep
leaves the device. The judging process fails the timing on any device comparison that failed, on a
saved set that is not the one the revealed key chooses, on a saved output whose checksum,
recomputed on the CPU from its bytes, is not the one sent at its rep, and on a saved output that
its own reference rejects. A kernel wrong on any rep is caught on the device; one that also
subverted that comparison must still be wrong on more than half the reps to move a median, and
survives a sample of s with probability (1 - f)^s. The sample's size does not grow with the reps,
so the reps are no longer capped by what saving them would cost: the budget's max_reps stands.

Cost. The recorder sits inside the timed region: pushing and popping it costs a few µs of host
time per call, and each aten op the wrapper dispatches (allocation, views, casts) a Python call of a
few µs more (2 to 5 µs and 4 to 8 µs on a loaded 2-core machine: benchmarks/recording_overhead.py);
nothing per Triton or CUDA launch, nothing on the device. The eager baseline is timed without it,
so recording can only understate a candidate's speedup, never overstate it; on a GPU it shows only
where the host is a kernel's bottleneck (a kernel of a few µs behind a wrapper of a few ops). The
device comparison and the checksum run between reps, outside the timed region and before the next
rep's L2 flush: they lengthen a timing's wall time (a reference, a comparison and two integer
passes over the output per rep), never its figures.
"""
from __future__ import annotations

import gc

import torch

from harness.correctness import as_passed
from harness.correctness.candidate import CallResult, observe
from harness.kernel_types import registry
from harness.timing.device_check import check_on_device, unaffordable
from harness.timing.fresh_inputs import FreshInputs
from harness.timing.timed_outputs import SavedOutputs, keyed_checksum, save_policy
from harness.correctness.integrity import ComputeRecorder


class TimedCalls:
    """The timed callable and its `before_each(rep)`: refill, snapshot and recorder outside the
    timed region, the call alone inside it, the previous rep's record written before the next.
    `limits`: the timing's budget (warmup, max_reps), on which the saved sample rests; `key`: the
    stage's secret, held only in closures here (harness/timing/timed_outputs.py)."""

    def __init__(self, kernel_fn, inputs: FreshInputs, monitor, log, stage: str, check=None,
                 limits: dict | None = None, key: int = 0):
        self.kernel_fn, self.inputs, self.monitor, self.log, self.stage = kernel_fn, inputs, monitor, log, stage
        self.check = check
        # as served inference passes them (harness/correctness/as_passed.py): weights as
        # nn.Parameters, under torch.no_grad(); the same storage as the buffers refilled
        kt = registry.get(inputs.case.kernel_type)
        self._passed = as_passed.wrap(inputs.args, kt.name, kt.params[:len(inputs.args)], "no_grad")
        self._pending: tuple | None = None
        self._recorder = ComputeRecorder(monitor)
        self._out = None
        self.recorded = 0
        case, device = inputs.case, inputs.device
        self.policy = save_policy(case, inputs.args, inputs.kwargs, device, limits or {})
        self._saved = SavedOutputs(self.policy, key, log.save)
        tables: dict = {}  # the key's tables, drawn once: in this closure, beside the key
        self._checksum = lambda out: keyed_checksum(out, key, tables)
        skipped = unaffordable(case, torch.device(device).type)
        self._compare = (lambda out, args: {"skipped": skipped}) if skipped else \
            (lambda out, args: check_on_device(case, out, args, inputs.kwargs, device))

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
        snapshots = self.inputs.placed.snapshot()  # every input's whole buffer, guards included
        self._recorder = ComputeRecorder(self.monitor)
        self._pending = (rep, snapshots, self.monitor.launches)

    def call(self) -> None:
        try:
            with self._recorder, torch.no_grad():
                self._out = self.kernel_fn(*self._passed, **self.inputs.kwargs)
        finally:
            gc.enable()

    def finish(self, last: bool = False) -> None:
        """Record the rep that last ran (after the timing loop's synchronize, outside its region);
        `last`: it ended a round of reps, whose last output is always saved."""
        gc.enable()  # held off only from a refill to its call (a loop that stopped between them)
        if self._pending is None:
            return
        rep, snapshots, launches_before = self._pending
        self._pending = None
        if self.check is not None:
            self.check()
        out = self._out
        # checksummed first, closest to the call: a swap after this point shows in a saved copy
        checksum = self._checksum(out)
        result = observe(CallResult(), out, self.inputs.args, snapshots, self._recorder,
                         self.monitor.launches - launches_before, self.inputs.placed)
        inputs = self.inputs.placed.views(snapshots)  # as refilled
        device_check = self._compare(out, inputs)
        case = self.inputs.case
        self.log.event(event="case", stage=self.stage, role="timed", rep=rep, case=case.to_json(),
                       label=case.label(), output=self._saved.keep(rep, out, last), error=None,
                       obs=result.observations(), seconds=0.0, checksum=checksum, device_check=device_check)
        self.recorded += 1

    def close(self) -> dict[int, str]:
        """After the last round: save the drawn outputs still held on the device, {rep: name}."""
        return self._saved.close()
