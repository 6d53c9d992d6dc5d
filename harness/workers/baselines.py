"""The judge's baselines: timed in the clean worker (harness/workers/baseline.py), once per target
and shape per judge session, and re-timed now and then.

Policy. A baseline (PyTorch eager, or torch.compile of it, at one case on one device) is the same
code on the same inputs for every candidate of a target, so its time does not depend on the
candidate: the first candidate of a target that needs it has it timed in a clean worker before its
own worker starts (never while a candidate runs), and later candidates of the session reuse the
figure. A figure older than MAX_AGE_S, or already handed to MAX_USES candidates, is timed again, so a
night's figures follow the machine (a GPU's clocks and temperature, a CPU's load) rather than its
first minutes. Outside a judge session every judge() call times its own.

Every verdict says where its baseline was timed (`timing.baseline_source`, `source()` below).
"""
from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from harness.kernel_types.registry import Case

MAX_AGE_S = 900.0
MAX_USES = 64
PROCESS = "a clean baseline worker that never imports a candidate"


@dataclass
class Figure:
    """One baseline as the clean worker timed it."""
    timing: dict | None
    error: str | None
    timed_at: float
    pid: int | None
    started_by: str
    uses: int = 0
    memory: dict | None = None  # a training job's peak memory (harness/timing/backward_timing.py)


@dataclass
class BaselineStore:
    """The session's baselines, keyed by (kind, case, device, GPU); one clean worker at a time."""
    figures: dict[tuple, Figure] = field(default_factory=dict)
    runs: int = 0  # clean workers started for this store
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # how a clean worker is started: the judge session's run_module (forked from its zygote);
    # None: spawned (a store of its own, outside any session)
    run: Callable | None = field(default=None, repr=False)

    def fresh(self, key: tuple, now: float) -> Figure | None:
        figure = self.figures.get(key)
        if figure is None or now - figure.timed_at > MAX_AGE_S or figure.uses >= MAX_USES:
            return None
        return figure


def key(kind: str, case: Case, device: str, visible_devices: str | None) -> tuple:
    return kind, json.dumps(case.to_json(), sort_keys=True), device, visible_devices


def needed(target: Case, compile_baseline: bool, around: list[Case], training: bool = False,
           device: str = "cuda") -> list[tuple[str, Case]]:
    """(kind, case) of every baseline one judgement compares with: eager at the target, torch.compile
    there on request, eager at each shape around it; for a file with a backward, eager autograd and
    torch.compile's joint graph at the target, step by step (`train:<how>:<step>`): the joint graph
    on a GPU always, on the CPU on request (`compiled_training`)."""
    from harness.timing.backward_timing import STEPS
    hows = ("eager", "compiled") if compiled_training(device, compile_baseline) else ("eager",)
    train = [(f"train:{how}:{step}", target) for how in hows for step in STEPS] if training else []
    return ([("eager", target)] + ([("compiled", target)] if compile_baseline else []) + [("eager", c) for c in around]
            + train)


def compiled_training(device: str, compile_baseline: bool) -> bool:
    """Whether torch.compile's joint graph is timed for a training target. On the CPU the candidate
    runs in the Triton interpreter, hundreds of times slower than Inductor's C++, so the figure
    compares nothing and its cold compile costs seconds per kernel type: timed there only when asked
    for, as the forward's torch.compile baseline is everywhere."""
    return compile_baseline or device != "cpu"


def obtain(jobs: list[tuple[str, Case]], device: str, visible_devices: str | None, timeout_s: float,
           store: BaselineStore | None) -> list[tuple[Figure, bool]]:
    """(figure, reused) per job: the store's where fresh, the rest timed now in one clean worker.
    Without a store (no judge session) every job is timed now."""
    store = store or BaselineStore()
    with store.lock:  # two slots of one session never time the same baseline twice, nor two at once
        now = time.time()
        keys = [key(kind, case, device, visible_devices) for kind, case in jobs]
        missing = [(k, job) for k, job in zip(keys, jobs) if store.fresh(k, now) is None]
        if missing:
            timed = _time_clean([job for _, job in missing], device, visible_devices, timeout_s, store.run)
            store.runs += 1
            for (k, _), figure in zip(missing, timed):
                store.figures[k] = figure
        out = []
        fresh_keys = {k for k, _ in missing}
        for k in keys:
            figure = store.figures[k]
            out.append((figure, k not in fresh_keys))
            figure.uses += 1
        return out


def source(figure: Figure, reused: bool, now: float | None = None) -> dict:
    """`timing.baseline_source`: where and when the verdict's baseline was timed."""
    now = time.time() if now is None else now
    return {"process": PROCESS, "pid": figure.pid, "started_by": figure.started_by,
            "timed_at": figure.timed_at, "age_s": round(now - figure.timed_at, 3), "reused": reused,
            "candidates_served": figure.uses}


def _spawned(module: str, args: list[str], timeout_s: float, env: dict[str, str], cwd, out_dir,
             restart=None) -> tuple:
    import sys

    from harness.isolation.process import run_isolated
    return run_isolated([sys.executable, "-m", module] + args, timeout_s, env=env, cwd=cwd), "spawn"


def _time_clean(jobs: list[tuple[str, Case]], device: str, visible_devices: str | None,
                timeout_s: float, run: Callable | None = None) -> list[Figure]:
    """Run harness/workers/baseline.py once for `jobs`; the figures are the reps the judge's witness
    was told of as they ended, as a kernel's are."""
    from harness.isolation.sandbox import private_caches
    from harness.isolation.process import child_env
    from harness.timing.timer import summary
    from harness.timing.witness import Witness
    run = run or _spawned
    spec = [{"phase": f"job{i}", "kind": kind, "case": case.to_json(), "limits": _limits(kind, case, jobs, device)}
            for i, (kind, case) in enumerate(jobs)]
    with tempfile.TemporaryDirectory(prefix="ak-baseline-") as tmp:
        out, cwd, scratch = (Path(tmp, name) for name in ("out", "cwd", "tmp"))
        for folder in (out, cwd, scratch):
            folder.mkdir()
        witness = Witness()
        argv = [str(out), "--device", device, "--jobs", json.dumps(spec), "--witness", str(witness.path)]
        env = {**child_env(device, visible_devices), "TMPDIR": str(scratch), **private_caches(Path(tmp))}
        try:
            child, started_by = run("harness.workers.baseline", argv, timeout_s, env, cwd, out,
                                    restart=witness.reset)
        finally:
            witnessed = witness.close()
        result_path = out / "baselines.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {"jobs": []}
    why = _death(child, timeout_s)
    rows = {row.get("phase"): row for row in result.get("jobs", [])}
    figures = []
    for job in spec:
        row = rows.get(job["phase"], {})
        reps = witnessed.reps(witness_phase(job["kind"], job["phase"]))
        timing = summary(reps.samples_us, device).to_json() if reps is not None and reps.samples_us else None
        error = row.get("error") or (None if timing else why or "the clean baseline worker timed nothing")
        figures.append(Figure(timing if row.get("timing") else None, error, time.time(), result.get("pid"),
                              started_by, memory=row.get("memory")))
    return figures


def witness_phase(kind: str, phase: str) -> str:
    """The phase a job's reps are reported under (harness/workers/baseline.py)."""
    from harness.timing.measurement import eager_phase
    if kind.startswith("train:"):
        from harness.timing.backward_timing import train_phase
        return train_phase(kind, phase)
    return eager_phase(phase) if kind == "eager" else f"compiled:{phase}"


def _limits(kind: str, case: Case, jobs: list[tuple[str, Case]], device: str) -> dict | None:
    """A shape around the target is timed on the budget the kernel gets there (harness/verdict/around.py)."""
    from harness.verdict import around
    return around.limits(device) if kind == "eager" and case != jobs[0][1] else None


def _death(child, timeout_s: float) -> str | None:
    if child.timed_out:
        return f"the clean baseline worker gave no result within {timeout_s:.0f} s"
    if child.returncode != 0:
        tail = child.stderr_tail()
        return f"the clean baseline worker died ({child.signal_name or child.returncode})" + (f":\n{tail}" if tail else "")
    return None
