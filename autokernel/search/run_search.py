"""The run's search: the scheduler (autokernel.search.schedule) gives each next visit to the target
worth most per minute, and a visit is a TargetSearch (autokernel.search.loop; a module target's
ModuleSearch) with its proposer, its starter and its strategy.

`execute` is what `autokernel optimize` runs on a started or resumed run: it sets up the judge slots
and the judge session, turns SIGTERM into Interrupted, kills the judge's processes on a stop, saves
the state whatever happens, and checks the run's records against their hashes when it is done.
The run spends its whole budget: it ends early only when the user stops it, when every target is
done (at its ceiling, or nothing more to try) or when the LLM gives nothing usable; state.json's
`stop_kind` and `stop_reason` say which.
"""
from __future__ import annotations

import signal
import threading
from typing import Any, Callable

from autokernel.errors import BudgetExhausted, Interrupted, NothingUsable, Plateau, Switch, TargetDone
from autokernel.search import schedule
from autokernel.search.loop import JudgeFn, SearchSettings, TargetSearch, default_judge
from autokernel.search.proposer import Proposer
from autokernel.search.run import RunDir, RunState, TargetState
from autokernel.search.seal import check_at_end
from harness.isolation.process import kill_all


def replay_into_tuner(tuner: Any, target: TargetState, starter_config: dict | None) -> None:
    """A resumed tuner learns what this target already tried, so it never proposes it again."""
    for h in target.history:
        config = h.get("config") or (starter_config if h.get("decision") == "BASELINE" else None)
        if config is not None:
            tuner.record(config, h.get("median_us") if h.get("verdict") == "PASS" else None)


class Visits:
    """The targets' searches and proposers, made once each and kept across visits (a tuner keeps
    its memory, a search its best); a revisit after a plateau gets a fresh proposer when its
    strategy asks for one (the tuner's new seed, the stronger model)."""

    def __init__(self, run: RunDir, state: RunState, settings: SearchSettings, make_proposer: Callable,
                 starter_source: Callable[[TargetState], str], **search_kwargs: Any):
        self.run, self.state, self.settings = run, state, settings
        self.make_proposer, self.starter_source = make_proposer, starter_source
        self.search_kwargs = search_kwargs
        self.searches: dict[str, tuple[TargetSearch, tuple]] = {}

    def search_for(self, target: TargetState) -> TargetSearch:
        # a new proposer for each revisit of the tuner (its next seed) and for a change of model
        key = (schedule.model_for(getattr(self.make_proposer, "models", ("",)), target.parks),
               target.parks if self.state.agent != "llm" else 0)
        held = self.searches.get(target.name)
        if held is not None and held[1] == key:
            return held[0]
        source = "" if target.kernel_type == "module" else self.starter_source(target)
        search = _search_class(target)(self.run, self.state, target, self.make_proposer(target, source), self.settings,
                                       starter_source=source, **self.search_kwargs)
        self.searches[target.name] = (search, key)
        return search


def search_all(run: RunDir, state: RunState, settings: SearchSettings, make_proposer: Callable,
               *, starter_source: Callable[[TargetState], str], judge: JudgeFn = default_judge,
               display: Any = None, peaks: dict | None = None,
               paused_s: Callable[[], float] = lambda: 0.0, slots: Any = None,
               choose: Callable[..., schedule.Choice | None] = schedule.choose,
               at_ceiling: Callable[[TargetState], bool] = schedule.at_ceiling) -> None:
    """Give visits to the targets, the one worth most per minute first, until every target is
    done. Raises BudgetExhausted, NothingUsable or Interrupted (and KeyboardInterrupt) to end the
    run early. `slots`: judge slots (autokernel.search.slots) to keep several experiments in flight;
    None judges one at a time. `choose`: the policy, (targets, current, cpu, left_s) -> Choice or None (the
    simulated night compares schedule.choose with plain round robin through it); `at_ceiling`: when
    a target is done (round robin's is schedule.at_roofline, which trusts the plan)."""
    agent = state.agent
    current: list[int | None] = [next((i for i, t in enumerate(state.targets) if t.status == "searching"), None)]

    def next_choice() -> schedule.Choice | None:
        choice = choose(state.targets, current[0], cpu=settings.device == "cpu", left_s=state.budget_left_s)
        if choice is None and any(schedule.eligible(t) for t in state.targets):
            raise BudgetExhausted(f"{state.budget_left_s / 60:.1f} min of the time budget of "
                                  f"{state.budget_s / 3600:.2f} h left: too little for any target's "
                                  f"next experiment to end or pay back")
        return choice

    def should_switch() -> str:
        choice = next_choice()
        if choice is None or choice.index == current[0]:
            return ""
        return f"{state.targets[choice.index].name} comes next: {choice.why}"  # the baseline round

    visits = Visits(run, state, settings, make_proposer, starter_source, judge=judge, display=display, peaks=peaks,
                    paused_s=paused_s, slots=slots, should_switch=should_switch, at_ceiling=at_ceiling)
    while True:
        if state.budget_left_s <= 0:
            raise BudgetExhausted(f"the time budget of {state.budget_s / 3600:.2f} h is spent")
        choice = next_choice()
        if choice is None:
            blocked = [t for t in state.targets if t.blocked]
            if blocked:
                raise NothingUsable(f"nothing usable: no target left that can be searched: {blocked[-1].name}: "
                                    f"{blocked[-1].blocked}")
            return
        current[0] = choice.index
        target = state.targets[choice.index]
        visit(visits, target, choice, agent, display, len(state.targets))
        if target.status in ("parked", "done"):  # its turn is over: the next choice starts even
            current[0] = None


def visit(visits: Visits, target: TargetState, choice: schedule.Choice, agent: str, display: Any,
          count: int) -> None:
    """One visit of one target, from its choice to its stop: parked at a plateau, done, or waiting
    while another target takes over."""
    run, state = visits.run, visits.state
    if target.status == "parked" or not target.strategy:  # a first visit, or a revisit after a plateau
        target.strategy = schedule.strategy_for(agent, target.parks)
        target.ideas = []
        target.stint_start = len(target.history)
    target.status = "searching"
    target.chosen_because = choice.why
    search = visits.search_for(target)
    if display is not None:
        display.start_target(target, choice.index, count)
    made = len(target.history)
    try:
        search.search()
    except Plateau as stop:
        if getattr(stop, "blocked", False):  # no prompt fits the model: parked for good, with the reason
            target.status, target.stop_reason, target.blocked = "parked", f"parked: {stop}", str(stop)
        elif getattr(search.proposer, "exhausted", False) or len(target.history) == made:
            # the tuner tried every configuration, or a fresh proposer had nothing at all to offer
            target.status, target.stop_reason = "done", str(stop)
        else:
            target.status, target.stop_reason = "parked", f"parked: {stop}"
            target.parks += 1
    except Switch as stop:
        target.status, target.stop_reason = "waiting", f"waiting: {stop}"
    except TargetDone as stop:
        target.status, target.stop_reason = "done", str(stop)
    except (BudgetExhausted, Interrupted, KeyboardInterrupt, NothingUsable) as stop:
        target.stop_reason = stopped_mid_search(stop)  # still "searching": a resume continues it
        raise
    finally:
        run.save_state(state)
    if display is not None:
        display.end_target(target)


def stopped_mid_search(stop: BaseException) -> str:
    """What a target the run stopped in the middle of says in the summary, instead of "searching"."""
    return f"stopped mid-search: {str(stop) or 'stopped by Ctrl-C'}; --resume continues it"


def _search_class(target: TargetState) -> type:
    """A module target is a KernelBench problem made from the model (autokernel.search.module_search)."""
    if target.kernel_type == "module":
        from autokernel.search.module_search import ModuleSearch
        return ModuleSearch
    return TargetSearch


def proposer_factory(agent: str, seed: int, client: Any = None,
                     training: bool = False) -> Callable[[TargetState, str], Proposer]:
    """The proposer for each visit of a target: the LLM (with several models, --llm cheap,strong:
    the first on a first visit, the last once the target has plateaued), or a tuner per target,
    seeded anew for each revisit, that remembers what the run already tried. `client`: one
    LLMClient, or a dict of them by model name (in order). `training`: a training run, whose tuner
    searches the backward's configuration too."""
    clients = client if isinstance(client, dict) else {getattr(client, "model", ""): client}

    def make(target: TargetState, starter_source: str) -> Proposer:
        if agent == "llm":
            from autokernel.search.llm_agent import LLMProposer
            return LLMProposer(clients[schedule.model_for(list(clients), target.parks)])
        if target.kernel_type == "module":  # nothing to tune: ModuleSearch skips it and says why
            from autokernel.search.module_search import NoTuning
            return NoTuning()
        from autokernel.search.kernel_source import read_literals
        from autokernel.search.tuner import Tuner
        # a revisit's strategy ("reseed"): another seed of the sampler, what was tried replayed
        tuner = Tuner(starter_source, seed=seed + target.rank + 7919 * target.parks, dims=target.dims,
                      training=training)
        replay_into_tuner(tuner, target, read_literals(starter_source).get("CONFIG"))
        return tuner
    make.models = list(clients) if agent == "llm" else [""]
    return make


def starter_sources(run: RunDir) -> Callable[[TargetState], str]:
    """A target's starter: the run's own copy once experiment 0 wrote it (a resume uses the same
    starter even if the installed one changed), else the installed starter."""
    def source(target: TargetState) -> str:
        own = run.experiment_file(target, 0)
        if own.exists():
            return own.read_text(encoding="utf-8")
        from starter_kernels import starter_path
        return starter_path(target.kernel_type).read_text(encoding="utf-8")
    return source


def _training(run: RunDir) -> bool:
    """Whether the run's plan was profiled for a training step (its targets then need a backward)."""
    import json
    try:
        return "train" in json.loads(run.plan_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(f"stopped by {signal.Signals(signum).name}")


def execute(run: RunDir, state: RunState, config: dict, *, display: Any = None,
            judge: JudgeFn = default_judge, client: Any = None,
            clock: Callable[[], float] | None = None) -> RunState:
    """Search a started or resumed run until its budget is spent, every target is done, the LLM
    gives nothing usable, or the user stops it. Ctrl-C and SIGTERM kill the judge's processes and
    leave a resumable state. `client`: an LLMClient or a dict of them by model (tests); `clock`:
    what the budget is charged by (tests: simulated time)."""
    from autokernel.search.start import llm_clients, options_of
    from autokernel.search.slots import make_slots
    from harness.workers.judge_session import judge_session
    options = options_of(config)
    settings = SearchSettings(max_experiments=options.max_experiments, plateau=options.plateau,
                              device=config["model"]["device"], timeout_s=options.timeout_s,
                              concurrency=options.concurrency, time_around=True,
                              unusable_limit=options.max_unusable,
                              # a run profiled for training judges each candidate's backward too
                              backward=_training(run))
    if clock is not None:
        settings.clock = clock
    if state.agent == "llm" and client is None:
        client = llm_clients(options)
        for each in client.values():
            each.check()
    clients = client if isinstance(client, dict) else {getattr(client, "model", options.llm): client}
    if state.agent == "llm":
        settings.llm_label = f"{', '.join(clients)} at {options.base_url or 'the OpenAI API'}"
    slots = make_slots(judge, settings.device, workers=options.workers, devices=options.devices,
                       ray_address=options.ray)
    if state.stop_kind == "nothing_usable":  # resumed after a change (another model, --max-tokens)
        state.unusable_in_a_row = 0
    state.status, state.stop_reason, state.stop_kind, state.sessions = "running", "", "", state.sessions + 1
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupted) if in_main else None
    try:
        with judge_session():  # one pre-imported worker per slot and one compile baseline per target
            search_all(run, state, settings, proposer_factory(state.agent, options.seed, client, training=settings.backward),
                       starter_source=starter_sources(run), judge=judge, display=display,
                       peaks=config.get("peaks"), slots=slots,
                       paused_s=lambda: sum(getattr(c, "waited_s", 0.0) for c in clients.values()))
        state.status, state.stop_kind = "done", "done"
        state.stop_reason = "every target done: at its ceiling, or nothing more to try"
    except BudgetExhausted as stop:
        state.status, state.stop_kind, state.stop_reason = "done", "budget", str(stop)
    except NothingUsable as stop:  # never "done": the command exits non-zero and says what to try
        state.status, state.stop_kind, state.stop_reason = "stopped", "nothing_usable", str(stop)
    except (KeyboardInterrupt, Interrupted) as stop:
        kill_all()
        state.status, state.stop_kind = "interrupted", "user"
        state.stop_reason = str(stop) or "stopped by Ctrl-C"
    except BaseException as error:
        kill_all()
        state.status, state.stop_kind, state.stop_reason = "failed", "failed", str(error)
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        slots.close()
        run.compact_state(state)  # at rest: state.json whole, its journal empty
    if state.status == "done":
        check_at_end(run, state, getattr(display, "line", None))
    return state
