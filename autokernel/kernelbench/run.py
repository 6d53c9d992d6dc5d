"""`autokernel kernelbench run`: the search loop over KernelBench problems, a ModelNew file as the
candidate.

Each problem is a target of the generic loop (autokernel.search.loop.TargetSearch), named by its file stem
(19_ReLU): the same leaderboard rows, state.json, kernels/<problem>/exp_NNNN.py and .json, and
best/<problem>.py as `autokernel optimize`, so `--resume` and `autokernel leaderboard` work the same
way. The judge is kernelbench.evaluate, with one reference per problem kept in memory. Where the
forward is one of our kernel types (adapters.py) the search starts from that type's Triton starter
wrapped as a ModelNew: the tuner explores its CONFIG, the LLM starts from it. Elsewhere the LLM
writes ModelNew from the problem alone (the tuner has nothing to tune and skips the problem).
After every experiment kernelbench.json is rewritten with each problem's best: what
`autokernel kernelbench score` reads.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from autokernel.errors import BudgetExhausted, Interrupted, Plateau, TargetDone, UsageError, UserError
from autokernel.kernelbench.adapters import match_problem, wrap_starter
from autokernel.judging.kb_evaluate import EvalOptions, RefCache, judge_file, resolve
from autokernel.judging.kb_problems import Problem, find_problems
from autokernel.kernelbench.score import SUMMARY_FILE, SUMMARY_KIND
from autokernel.search.loop import SearchSettings, TargetSearch
from autokernel.search.run_search import replay_into_tuner, stopped_mid_search
from autokernel.search.run import (RunDir, RunState, TargetState, new_run_id, open_for_resume, repair_leaderboard,
                                   write_json_atomic)
from autokernel.search.start import DEFAULT_LLM, check_for_resume
from autokernel.search.slots import local_slots, make_slots
from autokernel.search.seal import check_at_end

RUN_KIND = "kernelbench"


@dataclass
class KBRunOptions:
    agent: str | None = None  # "llm" or "tune"; None: llm when an API key is set
    budget_per_problem_s: float = 1800.0
    max_experiments: int | None = None  # proposals per problem after the baseline
    plateau: int = 8
    seed: int = 0
    llm: str = DEFAULT_LLM
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    device: str | None = None
    precision: str = "fp32"
    timeout_s: float = 300.0  # per judge child
    reps: int | None = None
    warmup: int = 3
    compile_baseline: bool = True
    workers: int = 1  # judge slots (autokernel.search.slots): one per GPU, or CPU slots on the CPU

    def eval_options(self) -> EvalOptions:
        return EvalOptions(device=self.device, precision=self.precision, reps=self.reps, warmup=self.warmup,
                           timeout_s=self.timeout_s, compile_baseline=self.compile_baseline)

    def resolved_agent(self) -> str:
        from autokernel.search.llm import api_key_from_env
        if self.agent is None:
            return "llm" if api_key_from_env(self.api_key_env) else "tune"
        if self.agent not in ("llm", "tune"):
            raise UsageError(f"unknown agent {self.agent!r}", "use --agent llm or --agent tune")
        return self.agent

    @staticmethod
    def from_json(d: dict) -> "KBRunOptions":
        known = {f.name for f in fields(KBRunOptions)}
        return KBRunOptions(**{k: v for k, v in d.items() if k in known})


def start(kb_dir: str | Path, level: int, ids: str | None, options: KBRunOptions,
          runs_dir: str | Path) -> tuple[RunDir, RunState, dict]:
    """A new run's folder, config, state and (empty) kernelbench.json."""
    from harness.device.versions import versions
    problems = find_problems(kb_dir, level, ids)
    agent = options.resolved_agent()
    if agent == "llm":
        llm_client(options).check()
    device = resolve(options.eval_options()).device
    local_slots(device, options.workers)  # a bad --workers fails before the run is made
    run = RunDir(Path(runs_dir) / new_run_id(Path(runs_dir)))
    run.create()
    targets = []
    for rank, p in enumerate(problems):
        match = match_problem(p.source())
        targets.append(TargetState(name=p.key, kernel_type=match.kernel_type if match else RUN_KIND,
                                   dims={}, dtype=options.precision, rank=rank))
    config = {"kind": RUN_KIND, "run_id": run.run_id, "created": datetime.now().isoformat(timespec="seconds"),
              "kb_dir": str(kb_dir), "level": level, "problems": [p.to_json() for p in problems],
              "options": {**asdict(options), "agent": agent, "device": device}, "versions": versions()}
    run.write_json(run.config_path, config)
    state = RunState(run_id=run.run_id, agent=agent, budget_s=options.budget_per_problem_s * len(problems),
                     targets=targets)
    run.save_state(state)
    write_summary(run, state, config)
    return run, state, config


def resume(runs_dir: str | Path, run_id: str, overrides: dict | None = None,
           log: Callable[[str], None] | None = None) -> tuple[RunDir, RunState, dict]:
    run = open_for_resume(Path(runs_dir), run_id)
    config, state = run.load_config(), run.load_state()
    if config.get("kind") != RUN_KIND:
        raise UserError(f"run {run_id} is not a KernelBench run", "resume it with `autokernel optimize --resume`")
    for key, value in (overrides or {}).items():
        if value is not None:
            config["options"][key] = value
    state.budget_s = float(config["options"]["budget_per_problem_s"]) * len(state.targets)
    repair_leaderboard(run, state)
    check_for_resume(run, log, state)
    return run, state, config


def llm_client(options: KBRunOptions):
    from autokernel.search.llm import LLMClient
    return LLMClient(options.llm, base_url=options.base_url, api_key_env=options.api_key_env)


class ProblemSearch(TargetSearch):
    """TargetSearch where the baseline is optional (no starter fits most problems) and every
    experiment is followed by `after_each` (the run's kernelbench.json)."""

    def __init__(self, *args: Any, after_each: Callable[[], None], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._after_each = after_each

    def search(self) -> None:
        t = self.target
        t.status, t.stop_reason = "searching", ""
        if t.next_experiment == 0 and self.starter_source:
            self.experiment(self._starter_candidate())
            if t.best_median_us is None and self.proposer.name == "tune":
                raise TargetDone(f"the wrapped starter did not pass: {t.history[-1].get('message', '')}")
        if self.concurrent:  # --workers: several solutions judged at once, one writer (autokernel.search.parallel)
            from autokernel.search.parallel import ConcurrentSearch
            ConcurrentSearch(self).run()  # ends by raising a stop
        t.pending = []
        while True:
            self.check_stops()
            self.experiment(None)

    def _record(self, *args: Any, **kwargs: Any):
        # every recorded experiment, one at a time or from the concurrent search, rewrites kernelbench.json
        try:
            return super()._record(*args, **kwargs)
        finally:
            self._after_each()



def starter_source(run: RunDir, target: TargetState, problem: Problem) -> str:
    """The wrapped starter for a matching problem (the run's own copy on resume), else ''."""
    match = match_problem(problem.source())
    if match is None:
        return ""
    own = run.experiment_file(target, 0)
    if own.exists():
        return own.read_text(encoding="utf-8")
    from starter_kernels import starter_path
    return wrap_starter(problem.source(), match, starter_path(match.kernel_type).read_text(encoding="utf-8"))


def make_proposer(agent: str, target: TargetState, starter: str, problem: Problem, options: KBRunOptions,
                  client: Any, tolerance: float):
    if agent == "llm":
        from autokernel.search.modelnew_agent import kernelbench_proposer
        return kernelbench_proposer(client, problem.source(), tolerance)
    from autokernel.search.kernel_source import read_literals
    from autokernel.search.tuner import Tuner
    tuner = Tuner(starter, seed=options.seed + target.rank, dims={})
    replay_into_tuner(tuner, target, read_literals(starter).get("CONFIG"))
    return tuner


class Progress:
    """One line per experiment on stderr (the CLI passes its console's print)."""

    def __init__(self, log: Callable[[str], None]):
        self.log = log

    def status(self, message: str) -> None:
        pass

    def experiment(self, target: TargetState, e: Any) -> None:
        median = f"{e.median_us:.1f} us" if e.median_us else ""
        self.log(f"{target.name} #{e.number}: {e.decision} {e.verdict} {e.failed_stage or ''} {median} {e.description[:60]}")


def execute(run: RunDir, state: RunState, config: dict, *, client: Any = None,
            log: Callable[[str], None] = lambda m: None) -> RunState:
    """Search every problem not yet done, until done, out of budget or interrupted."""
    from harness.isolation.process import kill_all
    from harness.workers.judge_session import judge_session
    options = KBRunOptions.from_json(config["options"])
    opts = resolve(options.eval_options())
    problems = {p["key"]: Problem(Path(p["path"]), p["problem_id"], p["name"], p["level"]) for p in config["problems"]}
    if state.agent == "llm" and client is None:
        client = llm_client(options)
        client.check()
    settings = SearchSettings(max_experiments=options.max_experiments, plateau=options.plateau,
                              device=opts.device, timeout_s=opts.timeout_s)
    cache = RefCache()
    state.status, state.stop_reason, state.sessions = "running", "", state.sessions + 1
    try:
        with judge_session():  # every solution's children fork from pre-imported workers
            for target in state.targets:
                if target.status != "done":
                    _search_problem(run, state, config, target, problems[target.name], options, opts, settings,
                                    cache, client, log)
        state.status, state.stop_reason = "done", "every problem searched"
    except BudgetExhausted as stop:
        state.status, state.stop_reason = "done", str(stop)
    except (KeyboardInterrupt, Interrupted) as stop:
        kill_all()
        state.status, state.stop_reason = "interrupted", str(stop) or "stopped by Ctrl-C"
    finally:
        run.compact_state(state)  # at rest: state.json whole, its journal empty
        write_summary(run, state, config)
    if state.status == "done":
        check_at_end(run, state, log)
    return state


def _search_problem(run, state, config, target, problem, options, opts, settings, cache, client, log) -> None:
    starter = starter_source(run, target, problem)
    if state.agent == "tune" and not starter:
        target.status = "done"
        target.stop_reason = "no starter kernel fits this problem's forward: the tuner needs one (use --agent llm)"
        log(f"{target.name}: skipped: {target.stop_reason}")
        return
    log(f"{target.name}: searching ({state.agent}, {target.kernel_type})")
    proposer = make_proposer(state.agent, target, starter, problem, options, client, opts.tolerance)

    def judge(kernel_file: Path, visible_devices: str | None = None, **kwargs: Any) -> dict:
        return judge_file(kernel_file, problem=problem.path, opts=opts, cache=cache, visible_devices=visible_devices)

    slots = make_slots(judge, opts.device, workers=options.workers)
    search = ProblemSearch(run, state, target, proposer, settings, starter_source=starter, judge=judge,
                           display=Progress(log), time_cap_s=options.budget_per_problem_s,
                           after_each=lambda: write_summary(run, state, config), slots=slots)
    try:
        search.search()
    except (Plateau, TargetDone) as stop:
        target.status, target.stop_reason = "done", str(stop)
    except UserError as e:  # the problem itself does not run: no solution can be judged
        target.status, target.stop_reason = "done", e.message
    except (BudgetExhausted, Interrupted, KeyboardInterrupt) as stop:
        target.stop_reason = stopped_mid_search(stop)  # still "searching": a resume continues it
        raise
    finally:
        slots.close()
        run.save_state(state)
    log(f"{target.name}: {target.stop_reason}")


def _best_verdict(path: Path) -> dict | None:
    """A best experiment's verdict, read once while the file is unchanged (kernelbench.json is
    rewritten after every experiment: its cost stays with the number of problems)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return _read_verdict(str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@lru_cache(maxsize=4096)
def _read_verdict(path: str, size: int, mtime_ns: int, ctime_ns: int) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def write_summary(run: RunDir, state: RunState, config: dict) -> None:
    """kernelbench.json: each problem's best (correct by construction: only a PASS becomes best)."""
    by_key = {t.name: t for t in state.targets}
    rows = []
    for p in config["problems"]:
        t = by_key[p["key"]]
        row = {**p, "solution": None, "correct": False, "verdict": None, "speedup_vs_eager": None,
               "speedup_vs_compile": None, "median_us": None, "flags": [], "experiments": len(t.history),
               "status": t.status, "stop_reason": t.stop_reason}
        verdict_path = run.experiment_file(t, t.best_experiment, ".json") if t.best_experiment is not None else None
        v = _best_verdict(verdict_path) if verdict_path is not None else None
        if v is not None:
            row.update(solution=run.relative(run.best_file(t)), correct=bool(v.get("correct")),
                       verdict=v.get("verdict"), speedup_vs_eager=v.get("speedup_vs_eager"),
                       speedup_vs_compile=v.get("speedup_vs_compile"),
                       median_us=(v.get("timing") or {}).get("median_us"), flags=v.get("flags") or [])
        rows.append(row)
    options = config["options"]
    # rewritten from the state after every experiment: a crash of the machine loses nothing it holds
    write_json_atomic(run.path / SUMMARY_FILE, {
        "kind": SUMMARY_KIND, "version": 1, "run_id": run.run_id, "level": config.get("level"),
        "precision": options.get("precision"), "device": options.get("device"), "agent": state.agent,
        "problems": rows}, durable=False)
