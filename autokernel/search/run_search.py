"""The run's search: every target of the plan in turn, each driven by autokernel.search.loop.TargetSearch
(or a module target's ModuleSearch), with its proposer, its starter and its share of the time.

`execute` is what `autokernel optimize` runs on a started or resumed run: it sets up the judge slots
and the judge session, turns SIGTERM into Interrupted, kills the judge's processes on a stop, saves
the state whatever happens, and checks the run's records against their hashes when it is done.
BudgetExhausted ends the run as done; Plateau and TargetDone end one target and the next one starts.
"""
from __future__ import annotations

import signal
import threading
from typing import Any, Callable

from autokernel.errors import BudgetExhausted, Interrupted, Plateau, TargetDone
from autokernel.search.decision import offer
from autokernel.search.loop import JudgeFn, SearchSettings, TargetSearch, default_judge
from autokernel.search.proposer import Proposer
from autokernel.search.run import RunDir, RunState, TargetState
from autokernel.search.seal import check_at_end
from harness.isolation import kill_all


def replay_into_tuner(tuner: Any, target: TargetState, starter_config: dict | None) -> None:
    """A resumed tuner learns what this target already tried, so it never proposes it again."""
    for h in target.history:
        config = h.get("config") or (starter_config if h.get("decision") == "BASELINE" else None)
        if config is not None:
            tuner.record(config, h.get("median_us") if h.get("verdict") == "PASS" else None)


def time_cap_s(state: RunState, index: int) -> float:
    """This target's share of the time left: in proportion to its share of the model's time among
    the targets still to search, so a big bottleneck gets more time and unused time flows on."""
    target = state.targets[index]
    rest = [t for t in state.targets[index:] if t.status != "done"]
    total = sum(t.share for t in rest)
    fraction = target.share / total if total > 0 else 1.0 / max(len(rest), 1)
    return target.seconds + state.budget_left_s * fraction


def search_all(run: RunDir, state: RunState, settings: SearchSettings, make_proposer: Callable,
               *, starter_source: Callable[[TargetState], str], judge: JudgeFn = default_judge,
               display: Any = None, peaks: dict | None = None,
               paused_s: Callable[[], float] = lambda: 0.0, slots: Any = None) -> None:
    """Search each target not yet done, in plan order. Returns when every target is done; raises
    BudgetExhausted or Interrupted (and KeyboardInterrupt) to end the run early. `slots`: judge
    slots (autokernel.search.slots) to keep several experiments in flight; None judges one at a time."""
    for index, target in enumerate(state.targets):
        if target.status == "done":
            continue
        later = [t for t in state.targets[index + 1:] if t.status != "done"]
        source = "" if target.kernel_type == "module" else starter_source(target)
        search = _search_class(target)(run, state, target, make_proposer(target, source), settings,
                              starter_source=source, judge=judge, display=display, peaks=peaks,
                              next_offer=offer(later[0]) if later else 0.0,
                              time_cap_s=time_cap_s(state, index), paused_s=paused_s, slots=slots)
        if display is not None:
            display.start_target(target, index, len(state.targets))
        try:
            search.search()
        except (Plateau, TargetDone) as stop:
            target.status, target.stop_reason = "done", str(stop)
        except (BudgetExhausted, Interrupted, KeyboardInterrupt) as stop:
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


def proposer_factory(agent: str, seed: int, client: Any = None) -> Callable[[TargetState, str], Proposer]:
    """The proposer for each target: one LLM client shared by all, or a tuner per target that
    remembers what a resumed run already tried."""
    def make(target: TargetState, starter_source: str) -> Proposer:
        if agent == "llm":
            from autokernel.search.llm_agent import LLMProposer
            return LLMProposer(client)
        if target.kernel_type == "module":  # nothing to tune: ModuleSearch skips it and says why
            from autokernel.search.module_search import NoTuning
            return NoTuning()
        from autokernel.search.kernel_source import read_literals
        from autokernel.search.tuner import Tuner
        tuner = Tuner(starter_source, seed=seed + target.rank, dims=target.dims)
        replay_into_tuner(tuner, target, read_literals(starter_source).get("CONFIG"))
        return tuner
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


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(f"stopped by {signal.Signals(signum).name}")


def execute(run: RunDir, state: RunState, config: dict, *, display: Any = None,
            judge: JudgeFn = default_judge, client: Any = None) -> RunState:
    """Search every target of a started or resumed run until done, out of budget or interrupted.
    Ctrl-C and SIGTERM kill the judge's processes and leave a resumable state."""
    from autokernel.search.start import llm_client, options_of
    from autokernel.search.slots import make_slots
    from harness.judge_session import judge_session
    options = options_of(config)
    settings = SearchSettings(max_experiments=options.max_experiments, plateau=options.plateau,
                              device=config["model"]["device"], timeout_s=options.timeout_s,
                              concurrency=options.concurrency, time_around=True)
    if state.agent == "llm" and client is None:
        client = llm_client(options)
        client.check()
    slots = make_slots(judge, settings.device, workers=options.workers, devices=options.devices,
                       ray_address=options.ray)
    state.status, state.stop_reason, state.sessions = "running", "", state.sessions + 1
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_interrupted) if in_main else None
    try:
        with judge_session():  # one pre-imported worker per slot and one compile baseline per target
            search_all(run, state, settings, proposer_factory(state.agent, options.seed, client),
                       starter_source=starter_sources(run), judge=judge, display=display,
                       peaks=config.get("peaks"), paused_s=lambda: getattr(client, "waited_s", 0.0),
                       slots=slots)
        state.status, state.stop_reason = "done", "every target searched"
    except BudgetExhausted as stop:
        state.status, state.stop_reason = "done", str(stop)
    except (KeyboardInterrupt, Interrupted) as stop:
        kill_all()
        state.status, state.stop_reason = "interrupted", str(stop) or "stopped by Ctrl-C"
    except BaseException as error:
        kill_all()
        state.status, state.stop_reason = "failed", str(error)
        raise
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        slots.close()
        run.compact_state(state)  # at rest: state.json whole, its journal empty
    if state.status == "done":
        check_at_end(run, state, getattr(display, "line", None))
    return state
