"""What a run's judge calls share: the pre-imported workers (harness/workers/forkserver.py) and the
torch.compile baseline, timed once per target.

The baseline cache is fair: the baseline is torch.compile of PyTorch's own eager op, the same code
on the same inputs (the target case, built from its seeds) on the same device for every candidate
of a target, so its time does not depend on the candidate. Rebuilding it per candidate cost a
compile (tens of seconds on a GPU) each time for the same number. It is timed by the first worker
that reaches timing with the baseline requested, inside that worker's process, as before; later
candidates of the target reuse the figure, and their verdicts say so (`compile_cached`).

    with judge_session():   # every judge() call inside, from any thread, shares one session
        ...
"""
from __future__ import annotations

import contextlib
import json
import threading
from typing import Iterator

from harness.workers import forkserver

_active: "JudgeSession | None" = None
_users = 0  # the judge_session() contexts open now, in any thread: the last one out closes it
_active_lock = threading.Lock()


class JudgeSession:
    def __init__(self, fork: bool | None = None):
        self.pool = forkserver.ZygotePool() if (forkserver.enabled() if fork is None else fork) else None
        self._baselines: dict[tuple, dict] = {}
        self._lock = threading.Lock()

    @staticmethod
    def baseline_key(timing_case: dict, device: str, visible_devices: str | None) -> tuple:
        return json.dumps(timing_case, sort_keys=True), device, visible_devices

    def cached_baseline(self, key: tuple) -> dict | None:
        """{"compiled": timing or None, "compiled_error": str or None}, or None when not yet timed."""
        with self._lock:
            return self._baselines.get(key)

    def remember_baseline(self, key: tuple, timing_end: dict) -> None:
        if "compiled" not in timing_end or timing_end.get("compiled_error") == "not requested":
            return
        with self._lock:
            self._baselines.setdefault(key, {"compiled": timing_end.get("compiled"),
                                             "compiled_error": timing_end.get("compiled_error")})

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()


def active() -> JudgeSession | None:
    return _active


@contextlib.contextmanager
def judge_session(fork: bool | None = None) -> Iterator[JudgeSession]:
    """Share zygotes and baselines among the judge calls inside; a session opened while one is open
    (nested, or from another thread) is that one, which closes when the last of them ends."""
    global _active, _users
    with _active_lock:
        if _active is None:
            _active = JudgeSession(fork)
        session = _active
        _users += 1
    try:
        yield session
    finally:
        with _active_lock:
            _users -= 1
            last = _users == 0
            if last:
                _active = None
        if last:
            session.close()


def apply_cached_baseline(events: list[dict], cached: dict) -> None:
    """Put the target's baseline, timed by an earlier worker, into this worker's timing record."""
    for event in events:
        if event.get("event") == "stage_end" and event.get("stage") == "timing" and "kernel" in event:
            event["compiled"], event["compiled_error"] = cached["compiled"], cached["compiled_error"]
            event["compiled_cached"] = True


def timing_end(events: list[dict]) -> dict | None:
    return next((e for e in events if e.get("event") == "stage_end" and e.get("stage") == "timing"
                 and "kernel" in e), None)


def run_worker(worker_args: list[str], timeout_s: float, env: dict[str, str], cwd, out_dir,
               restart=None) -> tuple:
    """(ChildResult, "fork" or "spawn") of `python -m harness.workers.worker WORKER_ARGS`: run_module's."""
    return run_module("harness.workers.worker", worker_args, timeout_s, env, cwd, out_dir, restart)


def run_module(module: str, args: list[str], timeout_s: float, env: dict[str, str], cwd, out_dir,
               restart=None) -> tuple:
    """(ChildResult, "fork" or "spawn"): `python -m MODULE ARGS` (one of the judge's workers,
    harness/workers/zygote.py's WORKERS) forked from the session's zygote where one can serve, else
    spawned. A zygote that failed mid-child leaves nothing behind: the output folder is emptied,
    `restart()` forgets what the first try reported, and the child runs again, spawned."""
    import shutil
    import sys
    from pathlib import Path

    from harness.isolation.process import run_isolated
    session = _active
    if session is not None and session.pool is not None:
        result = session.pool.run(args, timeout_s, env, cwd, module)
        if result is not None:
            return result, "fork"
        shutil.rmtree(out_dir, ignore_errors=True)
        Path(out_dir).mkdir()
        if restart is not None:
            restart()
    return run_isolated([sys.executable, "-m", module] + args, timeout_s, env=env, cwd=cwd), "spawn"
