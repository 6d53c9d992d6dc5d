"""Opening a run: a new one (profile, plan, the run folder, each module target's problem) or one
to resume (its saved options, its records checked first), and the options `optimize` takes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from autokernel.errors import UserError
from autokernel.search.run import RunDir, RunState, TargetState, new_run_id, open_for_resume, repair_leaderboard

DEFAULT_LLM = "gpt-4.1"


@dataclass
class OptimizeOptions:
    agent: str | None = None  # "llm" or "tune"; None: llm when an API key is configured
    llm: str = DEFAULT_LLM
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    budget_s: float = 8 * 3600.0
    max_experiments: int | None = None  # proposals per target after the baseline
    top: int | None = None  # a cap on the plan's targets searched, in Amdahl order (None: every one)
    only: list[str] | None = None  # only targets of these kernel types ("module") or names' prefixes
    timeout_s: float | None = None  # per judge call
    plateau: int = 8
    seed: int = 0
    workers: int = 1  # judge slots: one per device (CPU slots on the CPU)
    devices: list[str] | None = None  # CUDA device indices, one slot each
    concurrency: int = 1  # LLM requests in flight
    ray: str | None = None  # a Ray cluster address (or "auto"): judge slots are Ray actors
    max_unusable: int = 20  # LLM replies in a row with nothing that compiles before the run stops
    max_tokens: int | None = None  # the LLM's reply limit, per request
    reasoning_effort: str | None = None  # passed to the LLM where the server accepts it

    def resolved_agent(self) -> str:
        from autokernel.search.llm import choose_agent
        return choose_agent(self.agent, self.api_key_env)


def pick_targets(plan: dict, top: int | None, only: list[str] | None = None, count_modules: bool = True) -> list[TargetState]:
    """The top `top` entries of the plan that a starter kernel exists for, or that are module
    targets, in plan (Amdahl) order; `only`: of these kernel types, or targets named so (a prefix:
    "module[MLP.gelu"), alone. Without `count_modules` (the tuner, which skips them) module targets
    are listed where they rank but take none of the `top` places. Then the plan's chains
    (chain_targets): alternatives to their members, so they take none of the places either."""
    from starter_kernels import KERNEL_TYPES
    targets, names = [], set()
    for e in plan.get("entries", []):
        if top is not None and sum(1 for t in targets if count_modules or t.kernel_type != "module") >= top:
            break
        if only and not _chosen(e, only):
            continue
        if e.get("kernel_type") == "module" and e.get("module") and e.get("target") and e["target"] not in names:
            # a module target: the module's KernelBench problem, searched by the LLM agent
            from autokernel.search.module_search import module_state
            names.add(e["target"])
            targets.append(module_state(e, e["target"]))
            continue
        if e.get("kernel_type") not in KERNEL_TYPES or not e.get("dims") or not e.get("target"):
            continue
        name = e["target"]
        kwargs = {"causal": True} if e.get("causal") else {}
        if kwargs:
            name = name[:-1] + ",causal]"
        unique, n = name, 1
        while unique in names:  # two groups with one name (other modules): keep folders apart
            n += 1
            unique = f"{name}#{n}"
        name = unique
        names.add(name)
        targets.append(TargetState(name=name, kernel_type=e["kernel_type"], dims=dict(e["dims"]),
                                   dtype=e["dtype"], rank=e.get("rank", 0), share=e.get("share", 0.0),
                                   ceiling_speedup=e.get("ceiling_speedup"), kwargs=kwargs))
    return targets + chain_targets(plan, {t.name for t in targets}, top is not None, only)


def chain_targets(plan: dict, picked: set[str], limited: bool, only: list[str] | None = None) -> list[TargetState]:
    """The plan's chains (plan["chains"]) as targets: each row whose chain type has a starter. A
    chain's time is inside its members' rows (chain_plan.members), so it is their alternative, not
    another place: under --top (`limited`) a chain is searched when one of its members was picked,
    and takes no place of its own; without --top every chain is. A row never holds a chain whose
    intermediate is read elsewhere (autokernel.profile.chains leaves it out, under `rejected`). A
    generic chain (no registry type) with a replay becomes a module-style target (its problem replays
    the chain's ops), searched by the LLM agent and skipped by the tuner, as module targets are."""
    from autokernel.profile.generic_chains import CHAIN_TYPE as GENERIC
    from autokernel.search.module_search import chain_state
    from starter_kernels import CHAIN_TYPES
    rows = (plan.get("chains") or {}).get("entries", [])
    targets = []
    for i, row in enumerate(rows):
        generic = row.get("chain_type") == GENERIC and bool(row.get("replay"))
        if not generic and (row.get("chain_type") not in CHAIN_TYPES or not row.get("dims")) or not row.get("target"):
            continue  # a chain with no contract type and no replay: nothing to search it as
        if row["target"] in picked or (only and not _chosen(row, only)):
            continue
        if limited and not picked & set(row.get("members", [])):
            continue
        picked.add(row["target"])
        if generic:  # a module-style target: its replay is the reference, the LLM agent searches it
            targets.append(chain_state(row, len(plan.get("entries", [])) + i + 1))
            continue
        targets.append(TargetState(name=row["target"], kernel_type=row["chain_type"], dims=dict(row["dims"]),
                                   dtype=row["dtype"], rank=len(plan.get("entries", [])) + i + 1,
                                   share=min(row.get("share", 0.0), 1.0), ceiling_speedup=row.get("ceiling_speedup"),
                                   kwargs=dict(row.get("options") or {})))
    return targets


def _chosen(row: dict, only: list[str]) -> bool:
    return row.get("kernel_type") in only or any(str(row.get("target")).startswith(o) for o in only)


def model_names(llm: str) -> list[str]:
    """--llm cheap,strong -> ["cheap", "strong"]: the second takes over a target after its plateau."""
    names = [m.strip() for m in str(llm).split(",") if m.strip()]
    if not names:
        from autokernel.errors import UsageError
        raise UsageError(f"--llm {llm!r} names no model", "e.g. --llm gpt-4.1 or --llm gpt-4.1-mini,gpt-4.1")
    return names


def llm_clients(options: OptimizeOptions) -> dict:
    """One client per model of --llm, in order."""
    from autokernel.search.llm import LLMClient
    return {m: LLMClient(m, base_url=options.base_url, api_key_env=options.api_key_env,
                         max_tokens=getattr(options, "max_tokens", None),
                         reasoning_effort=getattr(options, "reasoning_effort", None))
            for m in model_names(options.llm)}


def llm_client(options: OptimizeOptions):
    """The client of the first model of --llm (what a startup check needs)."""
    return next(iter(llm_clients(options).values()))


def start(spec: Any, options: OptimizeOptions, runs_dir: Path, log: Any = None) -> tuple[RunDir, RunState, dict]:
    """Profile the model, plan, and write a new run's folder; the LLM endpoint is checked first so a
    missing key fails before minutes of profiling."""
    from autokernel.profile import plan as planner
    from autokernel.profile.modelfile import load_model
    from autokernel.profile.profiler import profile_model
    from harness.device.versions import versions
    from harness.device.peaks import device_name, measured_peaks
    from harness.isolation.sandbox import host_support
    agent = options.resolved_agent()
    if agent == "llm":
        llm_client(options).check()
    loaded = load_model(spec)
    (log or (lambda m: None))(f"profiling {spec.path} on {spec.device}")
    profile = profile_model(loaded)
    peaks = measured_peaks(spec.device, at_least=planner.achieved_tflops(profile))
    plan = planner.make_plan(profile, peaks, model=spec.to_json())
    targets = pick_targets(plan, options.top, options.only, count_modules=agent == "llm")
    if not targets:
        raise UserError(f"the profile of {spec.path} has no kernel type autokernel can search for",
                        "run `autokernel profile` on it to see where its time goes")
    run = RunDir(Path(runs_dir) / new_run_id(Path(runs_dir)))
    run.create()
    # absolute, so verify and resume find the model from any working directory
    model = {**spec.to_json(), "path": str(Path(spec.path).resolve())}
    config = {"run_id": run.run_id, "created": datetime.now().isoformat(timespec="seconds"),
              "model": model, "options": {**asdict(options), "agent": agent},
              "device": {"type": spec.device, "name": device_name(spec.device)}, "peaks": peaks,
              "versions": versions(), "sandbox": host_support()}  # what every candidate will run under
    if config["sandbox"]["kind"] == "none":
        (log or (lambda m: None))(f"WARNING: no sandbox for candidates on this machine: {config['sandbox']['reason']}")
    run.write_json(run.plan_path, plan)
    run.write_json(run.config_path, config)
    from autokernel.search.module_search import prepare
    prepare(run, targets, loaded.model, plan, log)
    state = RunState(run_id=run.run_id, agent=agent, budget_s=options.budget_s, targets=targets)
    run.save_state(state)
    return run, state, config


def resume(runs_dir: Path, run_id: str, overrides: dict | None = None,
           log: Any = None) -> tuple[RunDir, RunState, dict]:
    """Reopen a run (also one killed with -9): its saved options, with `overrides` applied. Its
    records are checked first: a resume never builds on a file that is not what was judged."""
    run = open_for_resume(Path(runs_dir), run_id)
    config, state = run.load_config(), run.load_state()
    for key, value in (overrides or {}).items():
        if value is not None:
            config["options"][key] = value
    state.budget_s = float(config["options"]["budget_s"])
    repair_leaderboard(run, state)
    check_for_resume(run, log, state)
    return run, state, config


def check_for_resume(run: RunDir, log: Any = None, state: RunState | None = None) -> None:
    """Refuse a run whose records were changed outside the search; rows from before rows carried a
    hash cannot be checked, and are let through with a note. `state`: the one just loaded (not
    read again)."""
    from autokernel.search.seal import require_sealed
    report = require_sealed(run.path, "--resume refused", allow_unsealed=True, state=state)
    if report.unsealed and log is not None:
        log(f"note: {len(report.unsealed)} row(s) of {run.path.name} carry no source_sha256 (written before "
            "rows were sealed): their files are taken as they are; new rows are sealed")



def options_of(config: dict) -> OptimizeOptions:
    known = {f.name for f in fields(OptimizeOptions)}
    return OptimizeOptions(**{k: v for k, v in config["options"].items() if k in known})
