"""Runs written by hand for tests, with records the search itself would have written: each winner
an experiment file, a leaderboard row carrying its sha256, a state history entry, and best/; and a
real tuner search with the judge replaced at its seam."""
from __future__ import annotations

from autokernel.search import loop, run_search
from autokernel.search.leaderboard import Leaderboard, make_row
from autokernel.search.run import RunDir, RunState, TargetState
from autokernel.search.seal import source_sha256, write_source


def record_baseline(run: RunDir, target: TargetState, source: str, median_us: float = 100.0,
                    device: str = "cpu") -> None:
    """Record `source` as `target`'s passing baseline (experiment 0) and its best kernel."""
    path = run.experiment_file(target, 0)
    write_source(path, source)
    write_source(run.best_file(target), source)
    verdict = {"verdict": "PASS", "failed_stage": None, "timing": {"median_us": median_us}, "device": {"type": device}}
    row = make_row(experiment=0, target=target.name, kernel_type=target.kernel_type, agent="tune",
                   decision="BASELINE", verdict=verdict, candidate=run.relative(path),
                   source_sha256=source_sha256(source))
    Leaderboard(run.leaderboard_path).append(row)
    target.history.append({"number": 0, "decision": "BASELINE", "verdict": "PASS", "row": row})
    target.best_experiment, target.next_experiment = 0, 1


def write_run(root, spec, targets, name: str = "run", dtype: str = "float32", verdict=None,
              figures=None, plan_extra=None) -> RunDir:
    """A finished run of the model `spec` (a ModelSpec) whose winners are given as sources:
    targets are (target, kernel type, dims, kwargs, route, modules, source), in plan order; a
    target of a chain type is a row of the plan's chains (its members found among the rest);
    `verdict(target_state)`, where given, is the verdict recorded beside a winner (or None);
    `figures`: {target: (share, best us, eager us)}, else (0.1, 100, 50); `plan_extra`: more keys of
    plan.json (`cpu_figures`: a run whose figures are the interpreter's)."""
    from autokernel.profile.chain_plan import members
    from autokernel.search.run import RunState
    from starter_kernels import CHAIN_TYPES
    run = RunDir(root / name)
    run.create()
    state = RunState(run_id=run.run_id, agent="tune", status="done")
    entries, chains = [], []
    for rank, (target, kernel_type, dims, kwargs, route, modules, source) in enumerate(targets, 1):
        share, best_us, eager_us = (figures or {}).get(target, (0.1, 100.0, 50.0))
        t = TargetState(name=target, kernel_type=kernel_type, dims=dims, dtype=dtype, rank=rank, share=share,
                        kwargs=kwargs, status="done", best_experiment=0, best_median_us=best_us,
                        baseline_median_us=best_us, eager_median_us=eager_us)
        state.targets.append(t)
        record_baseline(run, t, source, median_us=best_us, device=spec.device or "cpu")
        recorded = verdict(t) if verdict is not None else None
        if recorded is not None:
            run.write_json(run.experiment_file(t, 0, ".json"), recorded)
        row = {"rank": rank, "kernel_type": kernel_type, "target": target, "route": route, "modules": modules,
               "dims": dims, "dtype": dtype}
        if kernel_type in CHAIN_TYPES:
            chains.append({**row, "chain_type": kernel_type, "options": kwargs, "share": share})
        else:
            entries.append(row)
    for row in chains:
        row["members"] = members(row, entries)
    device = spec.device or "cpu"
    run.write_json(run.config_path, {"run_id": run.run_id, "model": spec.to_json(), "device": {"type": device}})
    run.write_json(run.plan_path, {"device": device, "entries": entries, "chains": {"entries": chains},
                                   **(plan_extra or {})})
    run.save_state(state)
    return run


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
