"""The judge's parent side: `judge(kernel_file) -> verdict`, a pure function of (file, target, device).

It starts harness.workers.worker in an isolated subprocess, then decides everything itself from what the
worker saved: it rebuilds the stage plan and every case's inputs from their seeds, computes float64
references without ever importing the candidate, compares, and checks the integrity observations.
What the candidate's process says about its own correctness is never taken on trust.

Threat model, for the record: code in the worker can, with deliberate effort, tamper with the
worker's own records (it shares the process). Forging a record is pointless for correctness, since
every output is recomputed here against a plan built here, and for speed, since every timed rep was
reported as it ended and stamped outside the worker (harness/timing/witness.py); the residual risk is an
attack on the in-process observers (launch counting, the aten-op recorder), which no wrong answer
survives anyway. The audit hook and the OS sandbox keep the worker's code from the judge's frames,
the run's records, the user's files and the network.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import harness
from harness.workers import judge_session
from harness.kernel_types import references
from harness.isolation.sandbox import private_caches
from harness.verdict.around import around_lie
from harness.correctness import backward
from harness.correctness.candidate import ContractError, check_header, read_header
from harness.correctness.cases import CORRECTNESS_STAGES, STAGES, Capabilities, build_plan
from harness.isolation.process import ChildResult, child_env, scrubbed_env
from harness.kernel_types.registry import Case
from harness.isolation.static_check import check_source, describe
from harness.verdict import backward_checks, grid_fill
from harness.verdict.verdict_checks import Assessment, assess
from harness.device.versions import versions
from harness.timing.witness import Witness

DEFAULT_TIMEOUT_S = {"cpu": 600.0, "cuda": 180.0}


class JudgeUsageError(Exception):
    """The request cannot be judged at all (missing file, unknown device): exit status 2."""


def resolve_device(device: str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise JudgeUsageError(f"unknown device {device!r}: use cuda or cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise JudgeUsageError("--device cuda but no CUDA device is visible: use --device cpu")
    return device


def sandbox_argv(scratch: Path, extensions: bool = False) -> list[str]:
    """The folders a child may write: its scratch folder, which holds its own compiler caches
    (harness/isolation/sandbox.py's private_caches; `extensions` is kept for the callers' signature)."""
    return ["--sandbox-write", str(scratch)]


def sandbox_record(events: list[dict], requested: bool) -> dict:
    """What the worker reported it enforced; said loudly on stderr when nothing was."""
    from harness.isolation.sandbox import not_requested, warn_if_open
    state = next(({k: v for k, v in e.items() if k not in ("event", "t")}
                  for e in events if e.get("event") == "sandbox"), None)
    if state is None:
        state = not_requested() if not requested else {"kind": "none", "reason": "the worker reported no sandbox"}
    warn_if_open(state, "the judge's worker")
    return state


def read_events(out_dir: Path) -> list[dict]:
    events = []
    path = out_dir / "events.jsonl"
    if not path.exists():
        return events
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line cut short by a crash ends the record
    return events


def judge(kernel_file: str | Path, *, target: Case | None = None, device: str | None = None,
          arch: str = "sm_90", timeout_s: float | None = None, compile_baseline: bool = False,
          visible_devices: str | None = None, sandbox: bool = True, time_around: bool = False,
          around_below_us: float | None = None, backward: bool = False) -> dict[str, Any]:
    """Judge one kernel file; always returns the verdict JSON of DESIGN.md (as a dict).
    `visible_devices`: the CUDA device index the child runs on (None: the parent's own view).
    `time_around`: a passing kernel is also checked and timed at the shapes around `target`
    (harness/verdict/around.py), when its time at the target is below `around_below_us` (None: always);
    the verdict's "timing_around" holds each shape's figures.
    `backward`: also judge the file's backward_fn, where it has one (a training target); without it
    the forward alone is judged, which is all an inference target serves (and the backward's stages
    cost more than the forward's on the interpreter).

    The file is read once: the text read here is the text judged (its sha256 is in the verdict),
    and the worker imports a copy of it from its own scratch folder, never the caller's file."""
    path = Path(kernel_file)
    if not path.is_file():
        raise JudgeUsageError(f"no such kernel file: {path}")
    device = resolve_device(device)
    verdict = _skeleton(path, device)
    source = path.read_bytes()
    verdict["source_sha256"] = hashlib.sha256(source).hexdigest()
    verdict["sandbox"] = {"kind": "none", "reason": "no worker was started"}
    # outside a session, one of its own: the baseline worker and the candidate's fork from one zygote
    with judge_session.judge_session(), tempfile.TemporaryDirectory(prefix="ak-judge-") as tmp:
        copy = Path(tmp, "src", path.name if path.suffix == ".py" else "candidate.py")
        copy.parent.mkdir()
        copy.write_bytes(source)
        around = {"below_us": around_below_us} if time_around and target is not None else None
        return _judge_copy(verdict, copy, Path(tmp), target, device, arch, timeout_s, compile_baseline, sandbox,
                           origin=path.resolve(), visible_devices=visible_devices, around=around, judge_backward=backward)


def _judge_copy(verdict: dict, path: Path, tmp: Path, target: Case | None, device: str, arch: str,
                timeout_s: float | None, compile_baseline: bool, sandbox: bool, origin: Path,
                visible_devices: str | None, around: dict | None = None, judge_backward: bool = False) -> dict[str, Any]:
    try:
        header = read_header(path)
        check_header(header)
        if not judge_backward:  # an inference target: the forward is all that is judged and served
            header = {**header, "has_backward_fn": False}
    except ContractError as e:
        return _usage_failure(verdict, str(e))
    except SyntaxError as e:
        header = {}
        early_failure = f"syntax error: {e}"
    else:
        early_failure = None
    verdict["kernel_type"] = header.get("KERNEL_TYPE")
    verdict["backend"] = header.get("BACKEND", "triton")
    if early_failure:
        return _finish(verdict, Assessment.failed("compile", early_failure))
    violations = check_source(path.read_text(encoding="utf-8"), verdict["backend"])
    if violations:  # refused before any process imports it
        return _finish(verdict, Assessment.failed("compile", describe(violations, path.name)))
    timeout_s = timeout_s or DEFAULT_TIMEOUT_S[device]
    out_dir, cwd, scratch_tmp = tmp / "out", tmp / "cwd", tmp / "tmp"
    for folder in (out_dir, cwd, scratch_tmp):
        folder.mkdir()
    bf16 = device == "cuda" and torch.cuda.is_bf16_supported()
    caps = Capabilities(device, bf16)
    plan = build_plan(header["KERNEL_TYPE"], caps, target)
    baseline_start = time.time()
    base = _baselines(plan, target, device, visible_devices, timeout_s, compile_baseline, around,
                      verdict["backend"] == "cuda" and device == "cpu", bool(header.get("has_backward_fn")))
    baseline_s = time.time() - baseline_start
    argv = [str(path), str(out_dir), "--device", device, "--arch", arch,
            "--origin", str(origin)]  # named for process listings only: the worker never opens it
    argv += sandbox_argv(tmp) if sandbox else ["--no-sandbox"]
    if target is not None:
        argv += ["--target", json.dumps(target.to_json())]
    eager = base.eager_median_us()
    if eager is not None:
        argv += ["--eager-median-us", repr(eager)]
    if around is not None:
        argv += ["--time-around", json.dumps(around)]
    witness = Witness()  # the judge's own clock on every timed rep (harness/timing/witness.py)
    argv += ["--witness", str(witness.path)]
    if header.get("has_backward_fn"):
        argv.append("--backward")
    spawned = time.time()
    try:
        child, started_by = judge_session.run_worker(
            argv, timeout_s, {**child_env(device, visible_devices), "TMPDIR": str(scratch_tmp), **private_caches(tmp)},
            cwd, out_dir,
            restart=witness.reset)
    finally:
        witnessed = witness.close()
    events = read_events(out_dir)
    base.put_beside(events)  # the clean worker's figures: nothing the candidate's records say of a baseline
    checks_start = time.time()
    bp = backward.build(plan, caps, backward_checks.around_cases(events, plan, target, around is not None)) \
        if header.get("has_backward_fn") else None
    with references.on_device(device, visible_devices), references.one_thread(device):  # the slot's own GPU
        shapes = _around_cases(plan, target) if around is not None else []
        assessment = assess(events, out_dir, plan, device, witnessed, shapes,
                            backward_checks.planned(bp, events, device) if bp is not None else None)
        shapes_around = (_assess_around(events, out_dir, plan, target, device, witnessed)
                         if around is not None and assessment.verdict == "PASS" else None)
        lie = around_lie(shapes_around)
        if lie:  # a time at a shape around the target that the judge's clock does not back is a lie
            assessment = assessment.fail("integrity", lie)
        back = _backward_verdict(events, out_dir, bp, device, witnessed, header, assessment, child, timeout_s)
        if back is not None and back["verdict"] == "PASS":
            from harness.verdict import backward_timing_checks
            back = backward_timing_checks.assess(back, events, witnessed, device, base.training(), bp.timing,
                                                 out_dir)
    checks_s = time.time() - checks_start
    verdict["sandbox"] = sandbox_record(events, sandbox)
    if not backward_started(events):  # past the forward, a dying worker is the backward's verdict
        assessment = _account_for_child(assessment, child, timeout_s)
    verdict["device"] = _device_info(device, events)
    verdict = _finish(verdict, assessment)
    verdict["backward"] = back
    verdict["serves"] = serves(verdict["verdict"], back)
    verdict.update(plan.dtype_record())  # a dtype that stood in for the target's is said so
    if around is not None:
        verdict["timing_around"] = shapes_around if verdict["verdict"] == "PASS" else None
    if verdict["timing"]:
        verdict["timing"].update(base.record())
        if device == "cpu":  # CPU timings do not choose for a GPU: the grid it would need there
            verdict["timing"]["grid"] = grid_fill.assess(plan.timing, grid_fill.recorded(events), arch)
    verdict["judge_seconds"] = {**wall_time_split(events, spawned, child.seconds, checks_s), "baselines": baseline_s,
                                "worker": started_by}
    if device == "cuda" and around is not None and verdict["verdict"] == "PASS":  # about to be kept
        from harness.verdict import sanitizer
        env = {**child_env(device, visible_devices), "TMPDIR": str(scratch_tmp), **private_caches(tmp)}
        verdict = sanitizer.judged(verdict, path, plan.timing, env, timeout_s, tmp, sandbox)
    return verdict


def backward_started(events: list[dict]) -> bool:
    return any(e.get("event") == "stage_start" and str(e.get("stage", "")).startswith(backward.PREFIX)
               for e in events)


def _backward_verdict(events: list[dict], out_dir: Path, bp, device: str, witnessed, header: dict,
                      forward: Assessment, child: ChildResult, timeout_s: float) -> dict | None:
    """The verdict's `backward` object: None for a forward-only file; judged only past a forward
    that passed (harness/verdict/backward_checks.py)."""
    if bp is None:
        return None
    if forward.verdict != "PASS" or forward.timing is None:
        return backward_checks.not_run("not run: the forward did not pass, and a backward is judged only after it")
    back = backward_checks.assess(events, out_dir, bp, device, witnessed, header["KERNEL_TYPE"])
    running = back.pop("running_stage", None)
    if running is not None or back["verdict"] == "PASS" and (child.timed_out or child.returncode != 0):
        return backward_checks.died(back, running or "timing", child, timeout_s)
    return back


def serves(verdict: str, back: dict | None) -> str | None:
    """What a verdict lets a file serve, in words the search and the report show."""
    if verdict != "PASS":
        return None
    if back is None:
        return "forward only: serves inference"
    if back["verdict"] == "PASS":
        return "training and inference"
    return f"inference only: the backward failed {back['failed_stage'] or 'to run'}"


def _assess_around(events: list[dict], out_dir: Path, plan: Any, target: Case, device: str, witnessed) -> dict:
    from harness.verdict import around
    return around.assess(events, out_dir, around.cases(target, plan.timing.dtype), device, witnessed)


def _around_cases(plan: Any, target: Case | None) -> list[Case]:
    from harness.verdict import around
    return around.cases(target, plan.timing.dtype) if target is not None else []


def _baselines(plan: Any, target: Case | None, device: str, visible_devices: str | None, timeout_s: float,
               compile_baseline: bool, around: dict | None, compile_only: bool, training: bool = False) -> "Baselines":
    """The baselines this judgement compares with, from the session's clean worker (timed now where
    none is fresh); none for a kernel that is compiled only and never timed. `training`: the file
    has a backward, so eager autograd and torch.compile's joint graph are timed step by step too."""
    from harness.workers import baselines
    if compile_only:
        return Baselines([], [])
    jobs = baselines.needed(plan.timing, compile_baseline, _around_cases(plan, target) if around is not None else [],
                            training, device)
    session = judge_session.active()
    # the judge's own work: a deadline of its own, not the candidate's (a hang's is a few seconds)
    deadline_s = max(timeout_s, DEFAULT_TIMEOUT_S[device])
    return Baselines(jobs, baselines.obtain(jobs, device, visible_devices, deadline_s,
                                            session.baselines if session else None))


class Baselines:
    """The clean worker's figures for one judgement, put where the verdict reads them."""

    def __init__(self, jobs: list, figures: list):
        self.jobs, self.figures = jobs, figures

    def eager_median_us(self) -> float | None:
        timing = self.figures[0][0].timing if self.figures else None
        return timing["median_us"] if timing else None

    def training(self) -> dict:
        """step -> {"eager": figure, "compiled": figure} of a file with a backward (train:<how>:<step> jobs)."""
        out: dict[str, dict] = {}
        for (kind, _), (figure, _) in zip(self.jobs, self.figures):
            if kind.startswith("train:"):
                _, how, step = kind.split(":")
                out.setdefault(step, {})[how] = figure
        return out

    def put_beside(self, events: list[dict]) -> None:
        """Into each timing record, whatever the worker wrote there: the target's eager and
        torch.compile figures, and eager at each shape around it."""
        around = [figure for (kind, case), (figure, _) in zip(self.jobs, self.figures)
                  if case != self.jobs[0][1] and kind == "eager"]
        compiled = next((f for (kind, _), (f, _) in zip(self.jobs, self.figures) if kind == "compiled"), None)
        eager = self.figures[0][0] if self.figures else None
        for e in events:
            if e.get("event") != "stage_end":
                continue
            stage = str(e.get("stage"))
            if stage == "timing":
                e["eager"] = eager.timing if eager else None
                e["compiled"] = compiled.timing if compiled else None
                e["compiled_error"] = (compiled.error if compiled else "not requested")
            elif stage.startswith("around:"):
                i = int(stage.split(":")[1]) if stage.split(":")[1].isdigit() else -1
                e["eager"] = around[i].timing if 0 <= i < len(around) else None

    def record(self) -> dict:
        """The verdict's `timing.baseline_source` (and `compile_cached` where torch.compile's was reused)."""
        from harness.workers.baselines import source
        if not self.figures:
            return {}
        figure, reused = self.figures[0]
        out = {"baseline_source": source(figure, reused)}
        for (kind, _), (f, was_reused) in zip(self.jobs, self.figures):
            if kind == "compiled":
                out["compile_cached"] = was_reused
        return out


def wall_time_split(events: list[dict], spawned: float, child_s: float, checks_s: float) -> dict:
    """Where the judge's time went: the worker's start-up (interpreter, torch, triton), the null
    call's calibration before the import, compile, the kernel's own calls, the candidate's timing,
    and the parent's rechecking (the clean worker's baselines are added by the caller)."""
    started = next((e["t"] for e in events if e.get("event") == "started"), None)
    ends = {e["stage"]: e.get("seconds", 0.0) for e in events if e.get("event") == "stage_end"}
    calls = sum(e.get("seconds", 0.0) for e in events if e.get("event") == "case")
    calibration = next((e for e in events if e.get("event") == "calibration"), {})
    around = sum(v for k, v in ends.items() if k.startswith("around:"))
    return {"startup": (started - spawned) if started else None, "calibration": calibration.get("seconds"),
            "compile": ends.get("compile"), "kernel_calls": calls,
            "stages": sum(v for k, v in ends.items() if k not in ("compile", "timing") and not k.startswith("around:")),
            "timing": ends.get("timing"), **({"around": around} if around else {}), "worker_total": child_s,
            "parent_checks": checks_s}


def _account_for_child(a: Assessment, child: ChildResult, timeout_s: float) -> Assessment:
    """A worker that hung or died decides the verdict, whatever it recorded before."""
    if a.complete and not child.timed_out and child.returncode == 0:
        return a
    running = a.running_stage or "compile"
    if child.timed_out:
        return a.with_end("TIMEOUT", running, f"no result after {timeout_s:.0f} s during {running}; "
                                               "the worker's whole process group was killed")
    if child.returncode != 0:
        how = child.signal_name or f"exit status {child.returncode}"
        tail = child.stderr_tail()
        return a.with_end("CRASH", running, f"the worker died ({how}) during {running}"
                                            + (f":\n{tail}" if tail else ""))
    if not a.complete and a.verdict == "PASS":
        return a.with_end("CRASH", running, f"the worker exited during {running} without finishing"
                                            + (f":\n{child.stderr_tail()}" if child.stderr else ""))
    return a


def _skeleton(path: Path, device: str) -> dict[str, Any]:
    return {"kernel_file": str(path), "kernel_type": None, "backend": None, "verdict": "FAIL",
            "failed_stage": None, "stages": [], "timing": None, "roofline": None, "resources": None,
            "device": {"type": device}, "versions": versions()}


def _usage_failure(verdict: dict, message: str) -> dict:
    a = Assessment.failed("compile", message)
    verdict = _finish(verdict, a)
    verdict["usage_error"] = message
    return verdict


def _finish(verdict: dict, a: Assessment) -> dict:
    verdict.update(verdict=a.verdict, failed_stage=a.failed_stage, stages=a.stage_list(),
                   timing=a.timing, roofline=a.roofline, resources=a.resources)
    if a.usage_error:
        verdict["usage_error"] = a.usage_error
    if a.notes:
        verdict["notes"] = a.notes
    return verdict



def _device_info(device: str, events: list[dict]) -> dict[str, Any]:
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return {"type": "cuda", "name": props.name, "capability": f"sm_{props.major}{props.minor}",
                "sms": props.multi_processor_count, "memory_gb": round(props.total_memory / 2**30, 1)}
    return {"type": "cpu", "name": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "triton_interpreter": True}


__all__ = ["judge", "JudgeUsageError", "resolve_device", "STAGES", "CORRECTNESS_STAGES"]
