"""The timings: the baselines (PyTorch eager and torch.compile, timed in a clean worker that never
imports a candidate: harness/workers/baseline.py), the calibration of the judge's clock and the
candidate's own timing once every stage passed (in the candidate's worker).

Order matters. The baselines are timed where no candidate code has run or ever will, so nothing a
candidate does can slow one down or speak for one. The null call is calibrated in the candidate's
worker before the import: the overhead the judging process's clock sees around an empty timed
region (harness/timing/witness.py), measured before the candidate could make it look larger. Every rep of every
phase is reported to the judging process as it ends, and every rep of every phase runs on values no
call has seen (harness/timing/fresh_inputs.py). The candidate's timed calls are watched and recorded like
checked calls (harness/timing/timed_calls.py); a first round that needs a second look (harness/timing/spread.py)
is measured again, its reps numbered on from the first round's.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from harness.kernel_types import registry
from harness.timing import spread
from harness.timing.fresh_inputs import FreshInputs
from harness.kernel_types.registry import Case
from harness.timing.timed_calls import TimedCalls
from harness.timing.timer import Timing, calibrate, time_fn

# the interpreter's timings say nothing about a GPU: on a CPU they only rank candidates, and a few
# reps do that; spending longer makes every CPU judgement slower, not truer. Five at least: the
# witness wants more than half the reps to agree with its clock, and on a busy machine a rep now
# and then is stretched by preemption outside the timed call: of five reps three must be stretched
# to outvote it, of three reps two were enough.
CPU_BUDGET = dict(budget_ms=300.0, warmup=1, min_reps=5, max_reps=20)
GPU_BUDGET = dict(budget_ms=300.0, warmup=5, min_reps=10, max_reps=500)
NULL_REPS = {"cpu": 20, "cuda": 100}


def budget(device: str) -> dict:
    return dict(CPU_BUDGET if device == "cpu" else GPU_BUDGET)


def calibration(case: Case, device: str, report) -> dict:
    """The null call, every rep reported as it ends: the overhead the judge's clock sees around an
    empty timed region in this process, before the candidate is imported. The baselines are not
    timed here: a clean worker times them (harness/workers/baseline.py)."""
    start = time.perf_counter()
    inputs = FreshInputs(case, device)
    null = calibrate(device=device, report=report, reps=NULL_REPS.get(device, 20), before_each=inputs.refill)
    return {"null": null.to_json(), "seconds": time.perf_counter() - start}


def time_compiled(kt, inputs: FreshInputs, device: str, report, phase: str = "compiled"):
    """torch.compile of PyTorch's own op, timed like the kernel: the baseline a user could get for
    free. (Timing or None, why it is missing or None.)"""
    from harness.timing.compile_cache import baseline_caches
    try:
        fn = torch.compile(kt.eager, dynamic=False)
        with torch.no_grad(), baseline_caches():
            fn(*inputs.args, **inputs.kwargs)  # compilation happens here, outside the timed region
            return time_fn(lambda: fn(*inputs.args, **inputs.kwargs), device=device, before_each=inputs.refill,
                           report=report, phase=phase, **budget(device)), None
    except Exception as e:  # no C++ compiler, an unsupported op: the baseline is missing, not the kernel
        return None, f"torch.compile failed: {type(e).__name__}: {str(e)[:200]}"


def kernel_phase(stage: str) -> str:
    """The witness phase of a timing stage: "kernel" at the target, "kernel:around:0" around it."""
    return "kernel" if stage == "timing" else f"kernel:{stage}"


def eager_phase(stage: str) -> str:
    return "eager" if stage == "timing" else f"eager:{stage}"


def time_eager(kt: registry.KernelType, case: Case, device: str, report, stage: str, limits: dict | None = None):
    """PyTorch eager at `case`, timed as the kernel will be; before the candidate is imported."""
    inputs = FreshInputs(case, device)
    with torch.no_grad():
        return time_fn(lambda: kt.eager(*inputs.args, **inputs.kwargs), device=device, before_each=inputs.refill,
                       report=report, phase=eager_phase(stage), **(limits or budget(device)))


@dataclass
class TimedRun:
    """The kernel's timing: its rounds (a second when the first needed another look, and why) and
    the outputs drawn for the judge that were held on the device until the end ({rep: name})."""
    rounds: list[Timing]
    second_look: str | None = None
    held_outputs: dict[int, str] = field(default_factory=dict)

    @property
    def final(self) -> Timing:
        return self.rounds[-1]

    @property
    def median_us(self) -> float:
        return self.final.median_us


def time_kernel(kernel_fn, case: Case, device: str, report, monitor, log, stage: str, check=None,
                phase: str = "kernel", limits: dict | None = None, eager_median_us: float | None = None,
                second_look: bool = True, salt: int = 0, key: int = 0) -> TimedRun:
    """kernel_fn timed like eager, every timed call watched, checked on the device and recorded
    (harness/timing/timed_calls.py), on fresh values every rep; `key` chooses the outputs saved and keys
    their checksums (harness/timing/timed_outputs.py). `check()` runs after every call, outside the timed
    region; `limits`: the timing budget (budget_ms, warmup, min_reps, max_reps), the device's by default.
    A first round whose spread is too wide, or whose speedup over `eager_median_us` is excessive
    (harness/timing/spread.py), is measured again: a second round, its reps numbered on from the first."""
    inputs = FreshInputs(case, device, salt)
    limits = limits or budget(device)
    calls = TimedCalls(kernel_fn, inputs, monitor, log, stage, check, limits, key)
    first = time_fn(calls.call, device=device, before_each=calls.before, report=report, phase=phase, **limits)
    calls.finish(last=True)
    run = TimedRun([first])
    if second_look:
        run.second_look = spread.second_look(first.median_us, first.iqr_us, eager_median_us, device)
    if run.second_look:
        again = time_fn(calls.call, device=device, before_each=calls.before, report=report, phase=phase,
                        first_rep=first.reps, **{**limits, "warmup": 0})
        calls.finish(last=True)
        run.rounds.append(again)
    run.held_outputs = calls.close()
    return run
