"""The worker's timings: the baselines and the calibration of the judge's clock, taken before any
candidate code is imported, and the candidate's own timing once every stage passed.

Order matters. PyTorch eager (and torch.compile of it) is timed where no candidate code has run, so
nothing a candidate does at import or in a later call can slow a baseline down. The null call is
calibrated there too: the overhead the judging process's clock sees around an empty timed region
(harness/witness.py), measured before the candidate could make it look larger. Every rep of every
phase is reported to the judging process as it ends.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from harness import registry
from harness.registry import Case
from harness.timing import calibrate, time_fn

# the interpreter's timings say nothing about a GPU: on a CPU they only rank candidates, and a few
# reps do that; spending longer makes every CPU judgement slower, not truer. Five at least: the
# witness wants more than half the reps to agree with its clock, and on a busy machine a rep now
# and then is stretched by preemption outside the timed call: of five reps three must be stretched
# to outvote it, of three reps two were enough.
CPU_BUDGET = dict(budget_ms=300.0, warmup=1, min_reps=5, max_reps=20)
GPU_BUDGET = dict(budget_ms=300.0, warmup=5, min_reps=10, max_reps=500)
NULL_REPS = {"cpu": 20, "cuda": 100}
REFILL_SETS = 3


def budget(device: str) -> dict:
    return dict(CPU_BUDGET if device == "cpu" else GPU_BUDGET)


class TimingInputs:
    """The timed case's buffers, refilled in place with fresh values before every rep (outside the
    timed region): a kernel that caches results by buffer address returns stale answers, caught
    when the last timed output is checked."""

    def __init__(self, case: Case, device: str):
        self.case = case
        self.args, self.kwargs = registry.build_inputs(case, device)
        self.refills = [registry.build_inputs(case.replace(seed=case.seed + 1 + r), device)[0]
                        for r in range(REFILL_SETS)]
        self.last_set: int | None = None

    def refill(self, i: int) -> None:
        r = i % len(self.refills)
        with torch.no_grad():
            for dst, src in zip(self.args, self.refills[r]):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
        self.last_set = r

    def checked_case(self) -> Case:
        """The case whose values the last timed call ran on."""
        return self.case.replace(seed=self.case.seed + 1 + (self.last_set or 0))


def baselines(kt: registry.KernelType, case: Case, device: str, report, compile_baseline: bool) -> dict:
    """The null call, PyTorch eager and (on request) torch.compile, each rep reported as it ends."""
    start = time.perf_counter()
    inputs = TimingInputs(case, device)
    null = calibrate(device=device, report=report, reps=NULL_REPS.get(device, 20), before_each=inputs.refill)
    with torch.no_grad():
        eager = time_fn(lambda: kt.eager(*inputs.args, **inputs.kwargs), device=device,
                        before_each=inputs.refill, report=report, phase=eager_phase("timing"), **budget(device))
    compile_start = time.perf_counter()
    compiled, compile_error = (_time_compiled(kt, inputs, device, report) if compile_baseline
                               else (None, "not requested"))
    return {"null": null.to_json(), "eager": eager.to_json(), "compiled": compiled.to_json() if compiled else None,
            "compiled_error": compile_error,
            "compiled_seconds": time.perf_counter() - compile_start if compile_baseline else 0.0,
            "seconds": time.perf_counter() - start}


def _time_compiled(kt, inputs: TimingInputs, device: str, report):
    """torch.compile of PyTorch's own op, timed like the kernel: the baseline a user could get for free."""
    from harness.compile_cache import baseline_caches
    try:
        fn = torch.compile(kt.eager, dynamic=False)
        with torch.no_grad(), baseline_caches():
            fn(*inputs.args, **inputs.kwargs)  # compilation happens here, outside the timed region
            return time_fn(lambda: fn(*inputs.args, **inputs.kwargs), device=device, before_each=inputs.refill,
                           report=report, phase="compiled", **budget(device)), None
    except Exception as e:  # no C++ compiler, an unsupported op: the baseline is missing, not the kernel
        return None, f"torch.compile failed: {type(e).__name__}: {str(e)[:200]}"


def kernel_phase(stage: str) -> str:
    """The witness phase of a timing stage: "kernel" at the target, "kernel:around:0" around it."""
    return "kernel" if stage == "timing" else f"kernel:{stage}"


def eager_phase(stage: str) -> str:
    return "eager" if stage == "timing" else f"eager:{stage}"


def time_eager(kt: registry.KernelType, case: Case, device: str, report, stage: str, limits: dict | None = None):
    """PyTorch eager at `case`, timed as the kernel will be; before the candidate is imported."""
    inputs = TimingInputs(case, device)
    with torch.no_grad():
        return time_fn(lambda: kt.eager(*inputs.args, **inputs.kwargs), device=device, before_each=inputs.refill,
                       report=report, phase=eager_phase(stage), **(limits or budget(device)))


def time_kernel(kernel_fn, case: Case, device: str, report, check=None, phase: str = "kernel",
                limits: dict | None = None) -> tuple[Any, Any, Case]:
    """(timing, last timed output, the case that output must answer): kernel_fn timed like eager.
    `check()` runs after every timed call, outside the timed region (before the next refill);
    `limits`: the timing budget (budget_ms, warmup, min_reps, max_reps), the device's by default."""
    inputs = TimingInputs(case, device)
    last: dict[str, Any] = {}

    def run_kernel():
        last["out"] = kernel_fn(*inputs.args, **inputs.kwargs)

    def before_each(i: int) -> None:
        if check is not None and i != -1:  # not before the first warm-up: nothing has run yet
            check()
        inputs.refill(i)

    timing = time_fn(run_kernel, device=device, before_each=before_each, report=report, phase=phase,
                     **(limits or budget(device)))
    if check is not None:
        check()
    return timing, last.get("out"), inputs.checked_case()
