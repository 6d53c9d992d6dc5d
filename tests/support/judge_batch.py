"""Judge a batch of kernel files the way `autokernel optimize` judges them: one judge session,
workers forked from its pre-imported zygotes, two candidates at a time. The attack suites judge
their attacks and the honest kernels beside them with it.
"""
from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest


@contextmanager
def other_core_busy() -> Iterator[None]:
    """A process spinning on a core while the block runs: the judge's timing must hold up beside it."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        busy.kill()
        busy.wait()


def judge_batch(paths: dict[str, Path], target, *, busy_for=(), static_check: bool = True,
                **judge_kw) -> dict[str, dict]:
    """Verdicts by name. The names in `busy_for` are judged first, with the other core kept busy;
    `static_check=False` switches the judge's static check off, so that the files reach the
    layers behind it (the sandbox, the audit hook, the parent's checks), which must hold on their own."""
    from harness.judge import judge
    from harness.workers.judge_session import judge_session

    def judged(names):
        return dict(zip(names, pool.map(
            lambda name: judge(paths[name], target=target, device="cpu", timeout_s=300, **judge_kw), names)))

    first = [name for name in paths if name in busy_for]
    with pytest.MonkeyPatch.context() as mp, judge_session(fork=True), ThreadPoolExecutor(2) as pool:
        if not static_check:
            mp.setenv("AUTOKERNEL_STATIC_CHECK", "off")
        verdicts = {}
        if first:
            with other_core_busy():
                verdicts = judged(first)
        verdicts.update(judged([name for name in paths if name not in busy_for]))
    return verdicts
