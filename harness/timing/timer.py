"""Timing a kernel honestly.

On a GPU: CUDA events around each call, an L2 flush (zeroing a buffer at least twice the L2) before
each call so every rep starts cold, warm-up first, a time budget in milliseconds that decides the
number of reps, a device-wide synchronize, and every raw sample kept. On the CPU the same
statistics with a wall clock, labelled for what they are: Triton-interpreter time, which says
nothing about a GPU.

`before_each(i)` runs outside the timed region: the judge uses it to refill the inputs in place with
fresh values, so a kernel that caches results by buffer address returns stale answers, which the
judge then catches by checking timed outputs.

`report` (harness/timing/witness.py's Reporter) hears of each rep as its timed region starts (on the
CPU from inside it, on a GPU just before the start event) and just after it ends, so the judging
process can hold the samples to its own clock. `calibrate` times a null call the same way: the
overhead the judge's clock sees around an empty timed region.

The clocks and sync points the loops read are bound here, when the judge imports this module,
before any candidate is imported: a candidate that swaps `time.perf_counter` or a method of
`torch.cuda.Event` for the length of one call changes nothing these loops read.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from time import perf_counter as _clock
from typing import Any, Callable

import torch

_Event = torch.cuda.Event
_record, _elapsed_ms = torch.cuda.Event.record, torch.cuda.Event.elapsed_time
_synchronize = torch.cuda.synchronize

CPU_METHOD = "cpu wall clock (Triton interpreter): not representative of GPU"
GPU_METHOD = "cuda events, L2 flushed before each rep, median of reps"
NULL_PHASE = "null"


@dataclass
class Timing:
    median_us: float
    iqr_us: float
    reps: int
    samples_us: list[float] = field(repr=False)
    method: str
    representative_of_gpu: bool

    def to_json(self) -> dict:
        return asdict(self)


def quartiles(samples: list[float]) -> tuple[float, float, float]:
    if len(samples) == 1:
        return samples[0], samples[0], samples[0]
    q1, q2, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return q1, q2, q3


def _summarise(samples_us: list[float], method: str, gpu: bool) -> Timing:
    q1, median, q3 = quartiles(samples_us)
    return Timing(median, q3 - q1, len(samples_us), samples_us, method, gpu)


def summary(samples_us: list[float], device: str) -> Timing:
    """The statistics of raw samples, labelled as time_fn labels them on `device`."""
    gpu = torch.device(device).type == "cuda"
    return _summarise(list(samples_us), GPU_METHOD if gpu else CPU_METHOD, gpu)


class _L2Flusher:
    def __init__(self, device: torch.device):
        props = torch.cuda.get_device_properties(device)
        l2_bytes = getattr(props, "L2_cache_size", 0) or 64 * 2**20
        # twice the L2 so nothing the kernel touched before survives
        self.buffer = torch.empty(2 * l2_bytes // 4, dtype=torch.int32, device=device)

    def __call__(self) -> None:
        self.buffer.zero_()


class _Silent:
    """No witness: the loops call the same methods either way."""

    def start(self, phase: str, i: int) -> None:
        pass

    def end(self, phase: str, i: int, us: float) -> None:
        pass


def _null() -> None:
    """The null call: what a timed region costs with nothing in it."""


def time_fn(fn: Callable[[], Any], *, device: str, budget_ms: float = 1000.0, warmup: int = 3,
            min_reps: int = 5, max_reps: int = 100, before_each: Callable[[int], None] | None = None,
            report=None, phase: str = "timed", first_rep: int = 0) -> Timing:
    """Time fn() until budget_ms is spent (at least min_reps, at most max_reps); `report` hears of
    every rep as `phase`, numbered from `first_rep` (a second round of a phase goes on counting)."""
    dev = torch.device(device)
    report = report or _Silent()
    if dev.type == "cuda":
        return _time_cuda(fn, dev, budget_ms, warmup, min_reps, max_reps, before_each, report, phase, first_rep)
    return _time_cpu(fn, budget_ms, warmup, min_reps, max_reps, before_each, report, phase, first_rep)


def calibrate(*, device: str, report, reps: int = 20,
              before_each: Callable[[int], None] | None = None) -> Timing:
    """The null call timed like a kernel, every rep reported: the judge's measure of its own overhead."""
    return time_fn(_null, device=device, budget_ms=0.0, warmup=2, min_reps=reps, max_reps=reps,
                   before_each=before_each, report=report, phase=NULL_PHASE)


def _time_cpu(fn, budget_ms, warmup, min_reps, max_reps, before_each, report, phase, first_rep=0) -> Timing:
    for i in range(warmup):
        if before_each:
            before_each(-1 - i)
        fn()
    samples: list[float] = []
    spent_ms = 0.0
    while len(samples) < max_reps and (len(samples) < min_reps or spent_ms < budget_ms):
        i = first_rep + len(samples)
        if before_each:
            before_each(i)
        start = _clock()
        report.start(phase, i)  # inside the clock: a preemption at this send is the worker's time too
        fn()
        elapsed = _clock() - start
        report.end(phase, i, elapsed * 1e6)
        samples.append(elapsed * 1e6)
        spent_ms += elapsed * 1e3
    return _summarise(samples, CPU_METHOD, False)


def _time_cuda(fn, dev, budget_ms, warmup, min_reps, max_reps, before_each, report, phase, first_rep=0) -> Timing:
    flush = _L2Flusher(dev)
    for i in range(warmup):
        if before_each:
            before_each(-1 - i)
        fn()
    _synchronize(dev)
    samples: list[float] = []
    spent_ms = 0.0
    while len(samples) < max_reps and (len(samples) < min_reps or spent_ms < budget_ms):
        i = first_rep + len(samples)
        if before_each:
            before_each(i)
        flush()
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        report.start(phase, i)
        _record(start)
        fn()
        _record(end)
        _synchronize(dev)
        elapsed_ms = _elapsed_ms(start, end)
        report.end(phase, i, elapsed_ms * 1e3)
        samples.append(elapsed_ms * 1e3)
        spent_ms += elapsed_ms
    return _summarise(samples, GPU_METHOD, True)
