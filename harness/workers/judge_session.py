"""What a run's judge calls share: the pre-imported workers (harness/workers/forkserver.py) and the
baselines, timed in a clean worker once per target and shape (harness/workers/baselines.py holds the
policy: re-timed after a while, or after so many candidates).

    with judge_session():   # every judge() call inside, from any thread, shares one session
        ...

judge() outside a session opens one of its own for the call, so its baseline worker and its
candidate's worker fork from one pre-imported process, which the next session of the process forks
from too (harness/workers/forkserver.py keeps it); the baselines are the session's own.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from harness.workers import forkserver
from harness.workers.baselines import BaselineStore

_active: "JudgeSession | None" = None
_users = 0  # the judge_session() contexts open now, in any thread: the last one out closes it
_active_lock = threading.Lock()


class JudgeSession:
    def __init__(self, fork: bool | None = None):
        self.pool = forkserver.ZygotePool() if (forkserver.enabled() if fork is None else fork) else None
        self.baselines = BaselineStore(run=run_module)

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
