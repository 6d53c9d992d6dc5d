"""The search loop over one target: baseline, then propose -> judge -> keep or revert -> log.

`TargetSearch` drives one visit of one target with any Proposer (the LLM or the tuner; it does not
know which) and the judge's subprocess boundary. Every experiment leaves its candidate, verdict (and
for the LLM its prompt and response) under kernels/<target>/, one leaderboard row with its parent
and strategy, and state.json saved in a `finally:`. A visit stops through a small exception
vocabulary: Plateau (no progress this visit, or the proposer has nothing new: the target is parked),
Switch (another target comes first: the baseline round), TargetDone (at its ceiling, or its experiment
or time share is spent), BudgetExhausted (the run's time is spent), NothingUsable (the LLM's replies
held nothing to judge for too long) and Interrupted (Ctrl-C, SIGTERM). The run over every target,
which catches them, is autokernel/search/run_search.py.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from autokernel.errors import BudgetExhausted, NothingUsable, Plateau, Switch, TargetDone, UserError
from autokernel.search import population, schedule
from autokernel.search.decision import decide, fills_target, has_backward, ranked
from autokernel.search.guard import RecordGuard
from autokernel.search.leaderboard import Leaderboard, make_row
from autokernel.search.proposer import (HISTORY_WINDOW, NO_CODE_MESSAGE, TRUNCATED_MESSAGE, Candidate, Experiment,
                                        Proposer, SearchContext)
from autokernel.search.run import REBUILT, RunDir, RunState, TargetState
from autokernel.search.seal import seal_verdict, source_sha256

STARTER_DESCRIPTION = "starter kernel (baseline)"

JudgeFn = Callable[..., dict]


@dataclass
class SearchSettings:
    max_experiments: int | None = None  # proposals per target, the baseline not counted
    plateau: int = 8  # consecutive non-keeps that end a target
    device: str = "cpu"
    timeout_s: float | None = None
    arch: str = "sm_90"
    concurrency: int = 1  # proposals in flight at once (LLM requests); the tuner proposes instantly
    backward: bool = False  # a training run: the judge judges a candidate's backward_fn too
    # a candidate that may be kept is also checked and timed at the shapes around the target
    # (harness/verdict/around.py), so that its record says which other shapes it may serve
    time_around: bool = False
    # LLM replies in a row, across targets, that held nothing to judge or did not compile, before
    # the run stops as "nothing usable" (None: never; `autokernel optimize` sets --max-unusable)
    unusable_limit: int | None = None
    llm_label: str = ""  # "MODEL at ENDPOINT": what the "nothing usable" stop names
    clock: Callable[[], float] = time.monotonic  # what the budget is charged by (tests: simulated)


def default_judge(kernel_file: Path, *, target, device: str, arch: str, timeout_s: float | None,
                  visible_devices: str | None = None, **around: Any) -> dict:
    """The judge; `around` (time_around, around_below_us) asks for the shapes around the target."""
    from harness.judge import JudgeUsageError, judge
    try:
        return judge(kernel_file, target=target, device=device, arch=arch, timeout_s=timeout_s,
                     visible_devices=visible_devices, **around)
    except JudgeUsageError as e:  # the run's own settings, not the candidate: nothing can be judged
        raise UserError(f"the judge cannot run: {e}", "check --device and --timeout, then --resume") from None


class TargetSearch:
    """One target's experiments, from the baseline to a stop."""

    def __init__(self, run: RunDir, state: RunState, target: TargetState, proposer: Proposer,
                 settings: SearchSettings, *, starter_source: str, judge: JudgeFn = default_judge,
                 display: Any = None, peaks: dict | None = None,
                 should_switch: Callable[[], str] = lambda: "",
                 time_cap_s: float = math.inf, paused_s: Callable[[], float] = lambda: 0.0,
                 slots: Any = None, at_ceiling: Callable[[TargetState], bool] | None = None):
        self.run, self.state, self.target = run, state, target
        self.slots = slots  # autokernel.search.slots: judge slots for experiments in flight at once
        self.proposer, self.settings, self.judge = proposer, settings, judge
        self.starter_source = starter_source
        # a training run ranks a target by forward plus backward where its starter gives a backward
        # (decision.ranked); a target with none (a module, a CUDA starter) by its forward
        self.ranks_training = settings.backward and has_backward(starter_source)
        self.display, self.peaks = display, peaks or {}
        # the scheduler's verdict after each experiment: why another target should take over ("": stay)
        self.should_switch, self.time_cap_s = should_switch, time_cap_s
        # when its best is close enough to its ceiling to stop: the scheduler's rule unless the
        # policy brings its own (round robin trusts the plan's roofline)
        from autokernel.search.schedule import at_ceiling as learned_rule
        self.at_ceiling = at_ceiling or learned_rule
        self._paused_s = paused_s  # LLM outage time so far: not charged to the budget
        self.leaderboard = Leaderboard(run.leaderboard_path)
        self.guard = RecordGuard(run.path, run.written, rebuilt=REBUILT)
        self._clock: tuple[float, float] | None = None  # (start, LLM pause so far) of the experiment
        self.best_source, self.best_verdict = self._load_best()

    # ------------------------------------------------------------------ driving
    def search(self) -> None:
        """Run until this target stops; TargetDone/Plateau end the target, other StopSearch the run."""
        t = self.target
        t.status, t.stop_reason = "searching", ""
        if t.next_experiment == 0:
            self.experiment(self._starter_candidate())
            if t.best_median_us is None:
                raise TargetDone(f"the starter did not pass at this target: {t.history[-1].get('message', '')}")
        if self.concurrent:
            from autokernel.search.parallel import ConcurrentSearch
            ConcurrentSearch(self).run()  # ends, like this loop, by raising a stop
        t.pending = []  # left by a concurrent session: their numbers stay unused
        while True:
            self.check_stops()
            self.experiment(None)

    @property
    def concurrent(self) -> bool:
        """Several experiments in flight at once (or some left in flight by a killed session)."""
        return self.slots is not None and (self.slots.width > 1 or self.settings.concurrency > 1
                                           or bool(self.target.pending))

    def check_stops(self) -> None:
        t, s = self.target, self.settings
        if self.state.budget_left_s <= 0:
            raise BudgetExhausted(f"the time budget of {self.state.budget_s / 3600:.2f} h is spent")
        if s.unusable_limit is not None and self.state.unusable_in_a_row >= s.unusable_limit:
            raise NothingUsable(nothing_usable_reason(self.state, s))
        if s.max_experiments is not None and t.proposals >= s.max_experiments:
            raise TargetDone(f"experiment budget spent ({s.max_experiments} per target)")
        if t.seconds >= self.time_cap_s:
            raise TargetDone(f"its share of the time budget ({self.time_cap_s / 60:.1f} min) is spent")
        if self.at_ceiling(t):
            raise TargetDone(f"done: its best ({t.speedup_vs_eager:.3g}x) is within noise of its roofline "
                             f"ceiling ({t.ceiling_speedup:.3g}x)")
        streak = t.reverts_this_visit
        if streak >= s.plateau:
            raise Plateau(f"{streak} experiments in a row without a faster kernel")
        switch = self.should_switch()
        if switch:
            raise Switch(switch)

    def experiment(self, candidate: Candidate | None) -> Experiment:
        """One experiment: propose (unless given), judge, decide, record. State is saved whatever
        happens, so an interrupt or a crash loses this experiment at most."""
        t = self.target
        number = t.next_experiment
        self._clock = (self.settings.clock(), self._paused_s())
        try:
            baseline = candidate is not None
            if candidate is None:
                self._show("status", f"experiment {number}: asking the {self.proposer.name} agent "
                                     f"({self.target.strategy or 'refine'})")
                candidate = self.propose(self.context(number))
            verdict = self.ranked(self._judge(number, candidate))
            decision = "BASELINE" if baseline else decide(verdict, t)
            self.proposer.observe(candidate, verdict)  # the tuner learns the starter's config too
            return self._record(number, candidate, verdict, decision)
        finally:
            if self._clock is not None:  # stopped before _record saved: charge and save here
                self._charge()
                self.run.save_state(self.state)

    def ranked(self, verdict: dict | None) -> dict | None:
        """The verdict as this target is ranked by (decision.ranked in a training run)."""
        return ranked(verdict) if self.ranks_training else verdict

    def _charge(self) -> None:
        """Charge the experiment's time to the target and the run, less any LLM outage."""
        start, paused_before = self._clock
        charged = max(self.settings.clock() - start - (self._paused_s() - paused_before), 0.0)
        self.target.seconds += charged
        self.state.elapsed_s += charged
        self._clock = None

    # ------------------------------------------------------------------ one experiment's parts
    def context(self, number: int) -> SearchContext:
        t = self.target
        ctx = SearchContext(kernel_type=t.kernel_type, dims=dict(t.dims), dtype=t.dtype, target=t.name,
                            best_source=self.best_source, best_verdict=self.best_verdict,
                            history=t.recent(HISTORY_WINDOW), device=(self.best_verdict or {}).get("device", {}),
                            peaks=self.peaks, experiment=number, proposal_count=t.proposals,
                            strategy=t.strategy or "refine", parks=t.parks, ideas=list(t.ideas),
                            visit_proposals=t.visit_proposals, training=self.ranks_training)
        self._choose_parent(ctx, number)
        return ctx

    def _choose_parent(self, ctx: SearchContext, number: int) -> None:
        """The parent (usually the best, sometimes another elite; the starter for "a different
        algorithm") and one or two other elites as inspirations, read from the run's files."""
        t = self.target
        if getattr(self.proposer, "messages_for", None) is not None or t.kernel_type == "module":
            ctx.parent_number = t.best_experiment  # a prompt of another task's own shows the best only
            return
        if ctx.strategy == "different_algorithm" and t.history:
            ctx.parent_number, ctx.parent_source = 0, self.starter_source
            return
        explore = schedule.explores_parents(self.state.targets, t, self.state.budget_left_s)
        parent = population.choose_parent(t.elites, t.best_experiment, f"{t.name}:{number}", explore=explore)
        if parent is None:
            ctx.parent_number = t.best_experiment
            return
        ctx.parent_number, ctx.parent_median_us = parent["number"], parent["median_us"]
        if parent["number"] != t.best_experiment:
            ctx.parent_source = self._source_of(parent["number"])
        ctx.inspirations = [{**e, "source": self._source_of(e["number"])}
                            for e in population.inspirations(t.elites, parent)]
        ctx.inspirations = [e for e in ctx.inspirations if e["source"] is not None]

    def _source_of(self, number: int) -> str | None:
        path = self.run.experiment_file(self.target, number)
        return path.read_text(encoding="utf-8") if path.exists() else None

    def propose(self, ctx: SearchContext) -> Candidate:
        """The proposer's next candidate, with its parent and strategy noted for its row."""
        candidate = self.proposer.propose(ctx)
        if candidate.parent is None:
            candidate.parent = ctx.parent_number
        candidate.strategy = candidate.strategy or ctx.strategy
        return candidate

    def _starter_candidate(self) -> Candidate:
        return Candidate(source=self.starter_source, description=STARTER_DESCRIPTION)

    def _judge(self, number: int, candidate: Candidate) -> dict | None:
        path = self.write_candidate(number, candidate)
        if path is None:
            return self.write_verdict(number, candidate, None, [])
        self._show("status", f"experiment {number}: judging {candidate.description[:60]}")
        # the candidate runs while the run folder exists: whatever it changes there is put
        # back, and it fails, before anything of it is recorded
        self.guard.snapshot(self.held_files(number, candidate))
        try:
            if getattr(self.slots, "remote", False):  # a Ray cluster judges even the baseline
                from autokernel.search.slots import JudgeJob
                job = JudgeJob(path, candidate.source, self.case(), self.settings.arch, self.settings.timeout_s,
                               **self.around())
                verdict = self.slots.submit(job).result()
            else:
                verdict = self.judge(path, target=self.case(), device=self.settings.device,
                                     arch=self.settings.arch, timeout_s=self.settings.timeout_s, **self.around())
        finally:
            touched = self.restore_records()
        return self.write_verdict(number, candidate, verdict, touched)

    def held_files(self, number: int, candidate: Candidate) -> dict[str, str]:
        """An experiment's files before it is judged, run-relative, with the text the search holds."""
        texts = {".py": candidate.source, ".prompt.md": candidate.prompt, ".response.md": candidate.response}
        return {self.run.relative(self.run.experiment_file(self.target, number, suffix)): text
                for suffix, text in texts.items() if text is not None}

    def restore_records(self) -> list[str]:
        """What changed in the run since the guard's snapshot, put back; the records the writer
        holds in memory (state, leaderboard) are rewritten from it."""
        touched = self.guard.restore()
        if any(rel in REBUILT for rel in touched):
            self.run.rewrite_records(self.state)
        return touched

    def write_candidate(self, number: int, candidate: Candidate) -> Path | None:
        """The experiment's files before judging; the candidate's path (None: nothing to judge)."""
        for suffix, text in ((".prompt.md", candidate.prompt), (".response.md", candidate.response)):
            if text is not None:
                self.run.write_text(self.run.experiment_file(self.target, number, suffix), text)
        if candidate.source is None:
            self.run.kernels(self.target).mkdir(parents=True, exist_ok=True)
            return None
        path = self.run.experiment_file(self.target, number)
        self.run.write_text(path, candidate.source)
        return path

    def write_verdict(self, number: int, candidate: Candidate, verdict: dict | None,
                      touched: list[str]) -> dict | None:
        """The verdict sealed against the text the search held (a FAIL if the run's records were
        touched while it was judged), written beside the candidate."""
        if candidate.source is None:
            verdict = None
            record = ({"verdict": "FAIL", "failed_stage": "truncated", "detail": TRUNCATED_MESSAGE}
                      if candidate.truncated else {"verdict": "FAIL", "failed_stage": "parse", "detail": NO_CODE_MESSAGE})
        else:
            verdict = record = seal_verdict(verdict, source_sha256(candidate.source), touched)
        # made durable by the state's next save, which records it (autokernel.search.journal)
        self.run.write_json(self.run.experiment_file(self.target, number, ".json"), record, durable=False)
        return verdict

    def around(self) -> dict:
        """The judge's options for the shapes around the target: asked of every candidate, done by
        the judge only for one faster at the target than the best so far (the one that may be kept)."""
        opts = {"backward": True} if self.settings.backward else {}
        if not self.settings.time_around or self.target.kernel_type == "module":
            return opts
        return {**opts, "time_around": True, "around_below_us": self.target.best_median_us}

    def case(self):
        from harness.kernel_types.registry import Case
        t = self.target
        return Case.make(t.kernel_type, dict(t.dims), t.dtype, **t.kwargs)

    def _record(self, number: int, candidate: Candidate, verdict: dict | None, decision: str) -> Experiment:
        t = self.target
        best_before = t.best_median_us
        experiment = Experiment.from_verdict(number, candidate, verdict, decision, best_before)
        candidate_path = "" if candidate.source is None else self.run.relative(self.run.experiment_file(t, number))
        row = make_row(experiment=number, target=t.name, kernel_type=t.kernel_type, agent=self.proposer.name,
                       decision=decision, verdict=verdict, candidate=candidate_path,
                       description=candidate.description, best_median_us=best_before,
                       prompt_tokens=candidate.prompt_tokens, completion_tokens=candidate.completion_tokens,
                       source_sha256="" if candidate.source is None else source_sha256(candidate.source),
                       parent=candidate.parent, strategy=candidate.strategy,
                       unjudged_stage="truncated" if candidate.truncated else "parse")
        timing = (verdict or {}).get("timing") or {}
        if decision == "BASELINE":
            t.baseline_median_us = timing.get("median_us")
            t.eager_median_us = timing.get("baseline_median_us")
        if decision == "KEEP" or (decision == "BASELINE" and verdict and verdict.get("verdict") == "PASS"
                                  and timing.get("median_us")):
            self._new_best(number, candidate, verdict)
        if verdict and verdict.get("verdict") == "PASS" and timing.get("median_us") and timing.get("spread_ok", True) \
                and fills_target(timing):  # an elite by a time the interpreter alone rewards is no parent
            t.elites = population.admit(t.elites, population.entry_of(number, timing, source_sha256(candidate.source),
                                                                      candidate.description))
        self._note_reply(number, candidate, verdict, experiment)
        # the hashes of the verdict, prompt and reply as written: checked at the end and on resume
        files = {rel: self.run.written[rel] for rel in (self.run.relative(self.run.experiment_file(t, number, suffix))
                                                         for suffix in (".json", ".prompt.md", ".response.md"))
                 if rel in self.run.written}
        t.history.append({**experiment.to_json(), "row": row, "files": files})
        t.next_experiment = max(t.next_experiment, number + 1)  # numbers in flight stay handed out
        t.pending = [p for p in t.pending if p.get("number") != number]
        self._charge()
        self.run.save_state(self.state)  # the state first: a resume re-appends a row it lacks
        self.leaderboard.append(row)
        self._show("experiment", t, experiment)
        return experiment

    def _note_reply(self, number: int, candidate: Candidate, verdict: dict | None, e: Experiment) -> None:
        """For an LLM's reply: its tokens per model, its ideas (the "ideas first" strategy), and the
        run's count of replies in a row with nothing usable (nothing to judge, or no compile)."""
        if candidate.response is None or candidate.model is None:
            return
        s, t = self.state, self.target
        used = s.tokens.setdefault(candidate.model, {"prompt_tokens": 0, "completion_tokens": 0, "replies": 0})
        used["prompt_tokens"] += candidate.prompt_tokens or 0
        used["completion_tokens"] += candidate.completion_tokens or 0
        used["replies"] += 1
        if candidate.strategy == "ideas_first" and not t.ideas:
            from autokernel.search.prompt import parse_ideas
            t.ideas = parse_ideas(candidate.response)
        unusable = candidate.source is None or e.failed_stage == "compile" or bool((verdict or {}).get("usage_error"))
        if unusable:
            s.unusable_in_a_row += 1
            s.last_unusable = (f"experiment {number} on {t.name}: {e.failed_stage or e.verdict}: "
                               f"{(e.message or '').splitlines()[0][:200] if e.message else ''}")
        else:
            s.unusable_in_a_row = 0

    def _new_best(self, number: int, candidate: Candidate, verdict: dict) -> None:
        t, timing = self.target, verdict["timing"]
        t.best_experiment, t.best_median_us = number, timing["median_us"]
        t.best_iqr_us, t.best_reps = timing.get("iqr_us"), timing.get("reps")
        self.best_source, self.best_verdict = candidate.source, verdict
        # from the text the search held and judged, never copied from disk afterwards
        self.run.write_text(self.run.best_file(t), candidate.source)

    def _load_best(self) -> tuple[str, dict | None]:
        """The best kernel so far, from disk (a resumed run) or the starter."""
        t = self.target
        if t.best_experiment is None:
            return self.starter_source, None
        source = self.run.experiment_file(t, t.best_experiment).read_text(encoding="utf-8")
        verdict = json.loads(self.run.experiment_file(t, t.best_experiment, ".json").read_text(encoding="utf-8"))
        return source, verdict

    def _show(self, what: str, *args: Any) -> None:
        if self.display is not None:
            getattr(self.display, what)(*args)


def nothing_usable_reason(state: RunState, settings: SearchSettings) -> str:
    """The "nothing usable" stop in words: the model and endpoint, the last failure, what to try."""
    last = state.last_unusable
    if "truncated" in last:
        hint = "raise --max-tokens (the replies were cut off), or use a model with a longer output"
    elif "parse" in last:
        hint = ("the replies held no ```python block: try a stronger model (--llm), check the server's chat "
                "template and --reasoning-effort, or search without an LLM (--agent tune)")
    else:
        hint = "its kernels did not compile: try a stronger model (--llm a,b), or --agent tune"
    return (f"nothing usable: {state.unusable_in_a_row} replies in a row from {settings.llm_label or 'the LLM'} "
            f"held no kernel that compiles (last: {last}); {hint}")
