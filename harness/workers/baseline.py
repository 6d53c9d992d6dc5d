"""The clean baseline worker: PyTorch eager and torch.compile timed in a process that never imports
a candidate, and never shares one with a candidate.

A baseline timed beside a candidate, even before its import, is a figure the candidate's process
can speak about: lines on its witness socket, records in its events file. So the judge times every
baseline here instead (harness/workers/baselines.py decides when), and a candidate's process sends
no baseline line at all: one that arrives there is a forgery, and fails the candidate.

Each job is timed as the kernel will be (harness/timing/measurement.py: the same inputs refilled
with fresh values before every rep, the same budget, every rep reported to a witness of the
judge's as it ends, so the send sits inside the timed region exactly as it does for the kernel).

Usage (the judge does this): python -m harness.workers.baseline OUT_DIR --device cpu --jobs JSON --witness PATH
    JOBS: [{"phase": "job0", "kind": "eager" | "compiled", "case": Case JSON, "limits": dict or null}, ...]
    writes OUT_DIR/baselines.json: {"jobs": [{"phase", "timing" or null, "error" or null, "seconds"}]}
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from harness.kernel_types import registry
from harness.kernel_types.registry import Case
from harness.timing import measurement
from harness.timing.fresh_inputs import FreshInputs
from harness.timing.witness import Reporter


def time_job(job: dict, device: str, report) -> dict:
    """One baseline: eager or torch.compile of the type's own op at the job's case."""
    case = Case.from_json(job["case"])
    kt = registry.get(case.kernel_type)
    start = time.perf_counter()
    if job["kind"].startswith("train:"):
        return {**time_training(job, case, device, report), "seconds": time.perf_counter() - start}
    if job["kind"] == "compiled":
        timing, error = measurement.time_compiled(kt, FreshInputs(case, device), device, report,
                                                  f"compiled:{job['phase']}")
    else:
        timing, error = measurement.time_eager(kt, case, device, report, job["phase"], job.get("limits")), None
    return {"phase": job["phase"], "timing": timing.to_json() if timing else None, "error": error,
            "seconds": time.perf_counter() - start}


_compiled: dict[str, object] = {}  # one torch.compile per case, shared by its three steps


def time_training(job: dict, case: Case, device: str, report) -> dict:
    """A training step's piece (`train:<eager|compiled>:<step>`) under autograd; the
    forward+backward job also measures eager's peak memory (harness/timing/backward_timing.py)."""
    from harness.timing import backward_timing
    from harness.timing.compile_cache import baseline_caches
    _, how, step = job["kind"].split(":")
    phase = backward_timing.train_phase(job["kind"], job["phase"])
    kt = registry.get(case.kernel_type)
    memory = None
    try:
        if how == "compiled":
            key = json.dumps(case.to_json(), sort_keys=True)
            fn = _compiled.setdefault(key, torch.compile(kt.eager, dynamic=False))
            with baseline_caches():
                steps = backward_timing.AutogradSteps(case, device, fn)
                steps.prepare(-1)
                steps.forward()  # compilation of the joint graph, outside the timed region
                steps.backward()
                timing = backward_timing.time_step(steps, step, report, phase)
        else:
            steps = backward_timing.AutogradSteps(case, device, kt.eager)
            if step == "forward_backward":
                memory = backward_timing.peak_memory(steps)
            timing = backward_timing.time_step(steps, step, report, phase)
    except Exception as e:  # no C++ compiler, an op without a backward: the baseline is missing, not the kernel
        return {"phase": job["phase"], "timing": None, "error": f"{how} {step} failed: {type(e).__name__}: "
                                                                  f"{str(e)[:200]}", "memory": memory}
    return {"phase": job["phase"], "timing": timing.to_json(), "error": None, "memory": memory}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.workers.baseline")
    p.add_argument("out_dir", type=Path)
    p.add_argument("--device", default="cpu")
    p.add_argument("--jobs", required=True, help="the baselines to time, as JSON")
    p.add_argument("--witness", required=True, help="the judge's witness socket: every rep is reported there")
    ns = p.parse_args(argv)
    if ns.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("the judge's baseline worker must run with the judge's environment (TRITON_INTERPRET=1)")
    from harness.workers.worker import _die_with_parent
    _die_with_parent()
    report = Reporter(ns.witness)
    results = [time_job(job, ns.device, report) for job in json.loads(ns.jobs)]
    (ns.out_dir / "baselines.json").write_text(json.dumps({"jobs": results, "pid": os.getpid(),
                                                           "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    _code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)
