"""Runs written by hand for tests, with records the search itself would have written: each winner
an experiment file, a leaderboard row carrying its sha256, a state history entry, and best/; and a
real tuner search with the judge replaced at its seam."""
from __future__ import annotations

from autokernel import loop, run_search
from autokernel.leaderboard import Leaderboard, make_row
from autokernel.run import RunDir, RunState, TargetState
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


def tuned_run(folder, judge, max_experiments=1):
    """A real search of the offline tuner on softmax[8x128:float32] with `judge` at the loop's seam:
    runs/run under `folder` (with a config.json, so it can be resumed); (RunDir, RunState)."""
    run = RunDir(folder / "runs" / "run")
    run.create()
    run.write_json(run.config_path, {"options": {"budget_s": 3600.0}})
    target = TargetState(name="softmax[8x128:float32]", kernel_type="softmax", dims={"M": 8, "N": 128},
                         dtype="float32", share=1.0)
    state = RunState(run_id="run", agent="tune", budget_s=3600.0, targets=[target])
    settings = loop.SearchSettings(max_experiments=max_experiments, plateau=99)
    run_search.search_all(run, state, settings, run_search.proposer_factory("tune", seed=0),
                          starter_source=run_search.starter_sources(run), judge=judge)
    return run, state
