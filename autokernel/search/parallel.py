"""Several experiments of one target in flight at once, with one writer.

The thread that runs `ConcurrentSearch` is the only one that writes the run folder, the leaderboard
and state.json. Proposals (LLM requests, `--concurrency` of them) and judge calls (one per slot,
autokernel.search.slots) run elsewhere and come back as futures; the tuner proposes in the writer itself
(it is instant, and its pending configurations then cannot be proposed twice).

Numbers: an experiment's number is handed out when it is proposed, so numbers follow submission
order. When its candidate is written, state.json is saved with the number and the candidate's hash
in `pending` before any judge sees it; a number is therefore never handed out twice, even across a
kill -9. Rows are written in number order: a verdict that comes back early waits until every lower
number is recorded, and is then decided (KEEP or REVERT) against the best recorded at that moment,
so the leaderboard reads as a sequential search of the same proposals would have written it.

kill -9: recorded rows are in state.json (the leaderboard is repaired from it on resume); the
candidates that were in flight are listed in `pending` with their hash, and a resume judges them
again under their own numbers (one whose file no longer has that hash is dropped: its number stays
unused). A proposal still being asked of the LLM had written nothing: it is simply asked again.

The record guard (autokernel.search.guard): a candidate in flight may not change the run folder. The
writer takes what a candidate could change after its own writes and before it hands out the next
candidate, and before its next writes it puts back whatever changed meanwhile; since only the
candidates in flight ran in between, each of them is failed at `integrity` (which one did it cannot
be told apart, and a sandboxed candidate cannot do it at all, so the innocent pay only when an
attack happened).
"""
from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from autokernel.errors import StopSearch, TargetDone
from autokernel.search.decision import decide
from autokernel.search.proposer import Candidate
from autokernel.search.seal import source_sha256
from autokernel.search.slots import JudgeJob


@dataclass
class Flight:
    """One experiment between its number and its row."""

    number: int
    candidate: Candidate | None = None
    verdict: dict | None = None  # as the judge returned it, before sealing
    judged: bool = False  # the verdict is in (or there was nothing to judge)
    touched: set[str] = field(default_factory=set)  # the run's files changed while it was in flight
    held: dict[str, str] = field(default_factory=dict)  # its files in the run, with the text the search holds


class ConcurrentSearch:
    """Drives a TargetSearch (autokernel.search.loop) with several experiments in flight; raises a stop
    like TargetSearch.search, once every experiment in flight is recorded."""

    def __init__(self, search: Any):
        self.search, self.target, self.slots = search, search.target, search.slots
        self.threaded = search.proposer.name != "tune"  # LLM requests: in threads
        self.max_proposing = max(search.settings.concurrency, 1) if self.threaded else 0
        self.max_flights = self.slots.width + self.max_proposing
        self.askers = ThreadPoolExecutor(self.max_proposing, "propose") if self.threaded else None
        self.flights: dict[int, Flight] = {}  # by number, until recorded
        self.proposing: dict[Future, int] = {}
        self.judging: dict[Future, int] = {}
        self.ready: list[int] = []  # proposed and written, waiting for a free slot
        self.stop: StopSearch | None = None
        self.guarded = False  # a snapshot is held and candidates have run since

    def run(self) -> None:
        s = self.search
        s._clock = (s.settings.clock(), s._paused_s())  # the run is charged wall time, not a sum
        try:
            self.resubmit_pending()
            while True:
                self.check_guard()
                self.harvest()
                self.record_ready()
                if self.stop is None:
                    self.fill()
                if not self.flights:
                    raise self.stop
                self.dispatch()
                self.wait_one()
        finally:
            if self.askers is not None:
                self.askers.shutdown(wait=False, cancel_futures=True)
            if s._clock is not None:
                s._charge()
            s.run.save_state(s.state)

    # ------------------------------------------------------------------ submitting
    def resubmit_pending(self) -> None:
        """Candidates a killed session had in flight: judged again under their own numbers."""
        s, t = self.search, self.target
        kept = []
        for entry in sorted(t.pending, key=lambda p: p["number"]):
            path = s.run.experiment_file(t, entry["number"])
            source = path.read_text(encoding="utf-8") if path.exists() else None
            if source is None or source_sha256(source) != entry.get("sha256"):
                continue  # not the text that was submitted: dropped, its number left unused
            candidate = Candidate(source=source, description=entry.get("description", ""),
                                  config=entry.get("config"), prompt_tokens=entry.get("prompt_tokens"),
                                  completion_tokens=entry.get("completion_tokens"), parent=entry.get("parent"),
                                  strategy=entry.get("strategy", ""))
            hold = getattr(s.proposer, "hold", None)
            if hold is not None and candidate.config is not None:
                hold(candidate.config)  # the tuner must not propose it again meanwhile
            number = entry["number"]
            self.flights[number] = Flight(number, candidate, held=s.held_files(number, candidate))
            self.ready.append(number)
            kept.append(entry)
        t.pending = kept
        s.run.save_state(s.state, durable=False)  # numbers handed out: see autokernel.search.journal

    def fill(self) -> None:
        """Propose until the flights are full or a stop says no more."""
        s, t = self.search, self.target
        # a verdict waiting for a slower, lower number holds no slot: only unjudged flights count
        while (sum(not f.judged for f in self.flights.values()) < self.max_flights
               and len(self.proposing) < max(self.max_proposing, 1)):
            try:
                self.check_stops()
            except StopSearch as stop:
                self.stop = stop
                return
            number = t.next_experiment
            context = s.context(number)
            if self.threaded:
                t.next_experiment += 1
                self.flights[number] = Flight(number)
                self.proposing[self.askers.submit(s.propose, context)] = number
                continue
            try:
                candidate = s.propose(context)
            except StopSearch as stop:
                self.stop = stop
                return
            t.next_experiment += 1
            self.flights[number] = Flight(number)
            self.proposed(number, candidate)

    def check_stops(self) -> None:
        s, t = self.search, self.target
        limit = s.settings.max_experiments
        if limit is not None and t.proposals + len(self.flights) >= limit:
            raise TargetDone(f"experiment budget spent ({limit} per target)")
        s.check_stops()

    def proposed(self, number: int, candidate: Candidate) -> None:
        """Write the candidate and save its number and hash before any judge can see it."""
        s, t = self.search, self.target
        flight = self.flights[number]
        flight.candidate, flight.held = candidate, s.held_files(number, candidate)
        if s.write_candidate(number, candidate) is None:
            flight.judged = True  # a reply without a kernel: recorded as a parse failure
        else:
            t.pending.append({"number": number, "sha256": source_sha256(candidate.source),
                              "description": candidate.description, "config": candidate.config,
                              "prompt_tokens": candidate.prompt_tokens,
                              "completion_tokens": candidate.completion_tokens, "parent": candidate.parent,
                              "strategy": candidate.strategy})
            self.ready.append(number)
        s.run.save_state(s.state, durable=False)  # written before any judge sees it; see autokernel.search.journal

    def dispatch(self) -> None:
        """Snapshot the run after the writer's own writes, then hand ready candidates to free slots."""
        if not (self.ready or self.judging):
            return
        s = self.search
        held: dict[str, str] = {}  # every candidate in flight: its files are put back from its text
        for flight in self.flights.values():
            held.update(flight.held)
        s.guard.snapshot(held)
        self.guarded = True
        while self.ready and len(self.judging) < self.slots.width:
            number = self.ready.pop(0)
            candidate = self.flights[number].candidate
            s._show("status", f"experiment {number}: judging {candidate.description[:60]}")
            job = JudgeJob(s.run.experiment_file(self.target, number), candidate.source, s.case(),
                           s.settings.arch, s.settings.timeout_s, **s.around())
            self.judging[self.slots.submit(job)] = number

    # ------------------------------------------------------------------ receiving
    def wait_one(self) -> None:
        futures = set(self.proposing) | set(self.judging)
        if futures:
            wait(futures, return_when=FIRST_COMPLETED)

    def check_guard(self) -> None:
        """Put back what changed in the run since the snapshot; every candidate that was being
        judged meanwhile (finished or not) is charged with it."""
        if not self.guarded:
            return
        touched = self.search.restore_records()
        self.guarded = False
        for number in self.judging.values():
            self.flights[number].touched.update(touched)

    def harvest(self) -> None:
        for future in [f for f in self.proposing if f.done()]:
            number = self.proposing.pop(future)
            try:
                candidate = future.result()
            except StopSearch as stop:  # the proposer has nothing more: its number stays unused
                self.stop = self.stop or stop
                del self.flights[number]
                continue
            self.proposed(number, candidate)
        for future in [f for f in self.judging if f.done()]:
            flight = self.flights[self.judging.pop(future)]
            flight.verdict, flight.judged = future.result(), True  # a judge that cannot run raises here

    def record_ready(self) -> None:
        """Record, in number order, every experiment whose verdict is in and whose predecessors
        are recorded: the decision is taken against the best recorded so far."""
        s = self.search
        while self.flights:
            number = min(self.flights)
            flight = self.flights[number]
            if not flight.judged:
                return
            del self.flights[number]
            verdict = s.ranked(s.write_verdict(number, flight.candidate, flight.verdict, sorted(flight.touched)))
            s.proposer.observe(flight.candidate, verdict)
            s._record(number, flight.candidate, verdict, decide(verdict, self.target))
            s._clock = (s.settings.clock(), s._paused_s())
