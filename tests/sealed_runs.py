"""Runs written by hand for tests, with records the search itself would have written: each winner
an experiment file, a leaderboard row carrying its sha256, a state history entry, and best/."""
from __future__ import annotations

from autokernel.leaderboard import Leaderboard, make_row
from autokernel.run import RunDir, TargetState
from autokernel.seal import source_sha256, write_source


def record_baseline(run: RunDir, target: TargetState, source: str, median_us: float = 100.0) -> None:
    """Record `source` as `target`'s passing baseline (experiment 0) and its best kernel."""
    path = run.experiment_file(target, 0)
    write_source(path, source)
    write_source(run.best_file(target), source)
    verdict = {"verdict": "PASS", "failed_stage": None, "timing": {"median_us": median_us}, "device": {"type": "cpu"}}
    row = make_row(experiment=0, target=target.name, kernel_type=target.kernel_type, agent="tune",
                   decision="BASELINE", verdict=verdict, candidate=run.relative(path),
                   source_sha256=source_sha256(source))
    Leaderboard(run.leaderboard_path).append(row)
    target.history.append({"number": 0, "decision": "BASELINE", "verdict": "PASS", "row": row})
    target.best_experiment, target.next_experiment = 0, 1
