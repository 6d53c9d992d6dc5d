"""The search loop's seam: a `Proposer` turns where a search stands into the next candidate kernel.

Two implementations: the LLM agent (autokernel.search.llm_agent: prompt -> chat completion -> the
last python block of the reply) and the offline tuner (autokernel.search.tuner). The loop holds a
Proposer and does not know which.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

NO_CODE_MESSAGE = "the reply held no complete ```python block with the kernel file; nothing was judged"
TRUNCATED_MESSAGE = "the reply was cut off at the token limit before it ended; nothing was judged"
# The experiments a proposer is shown: the last few, never the whole run (prompt.py shows the last
# 8), so building the next prompt costs the same at experiment 25,000 as at experiment 10.
HISTORY_WINDOW = 16


@dataclass
class Candidate:
    """One proposal. `source` is None when an LLM reply held no kernel (a parse error)."""

    source: str | None
    description: str
    prompt: str | None = None
    response: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    config: dict[str, Any] | None = None  # the tuner's configuration, when it made the candidate
    llm_seconds: float | None = None
    parent: int | None = None  # the experiment it was made from (the search fills it in)
    strategy: str = ""  # the strategy of the visit it was made in (autokernel.search.schedule)
    model: str | None = None  # the LLM model that wrote it
    truncated: bool = False  # the reply was cut off at the token limit: nothing to judge

    @property
    def parse_error(self) -> bool:
        return self.source is None


def failure_message(verdict: dict | None) -> str:
    """What went wrong, in the judge's words: the failed stage's detail (or the usage error)."""
    if not verdict or verdict.get("verdict") in ("PASS", "COMPILE_ONLY"):
        return ""
    if verdict.get("usage_error"):
        return str(verdict["usage_error"])
    failed = verdict.get("failed_stage")
    for stage in verdict.get("stages") or []:
        if stage.get("status") == "fail" and (failed is None or stage.get("name") == failed):
            return str(stage.get("detail") or "")
    return f"{verdict.get('verdict')} during {failed}" if failed else str(verdict.get("verdict", ""))


@dataclass
class Experiment:
    """One judged (or unparseable) proposal, as later prompts and decisions need it."""

    number: int
    description: str
    decision: str  # BASELINE, KEEP or REVERT
    verdict: str  # the judge's verdict, or FAIL with failed_stage "parse"
    failed_stage: str | None = None
    message: str = ""  # the failed stage's detail, or why a passing kernel's time was not trusted
    median_us: float | None = None
    iqr_us: float | None = None
    speedup_vs_best: float | None = None  # best median before this experiment / this median
    config: dict[str, Any] | None = None

    @staticmethod
    def from_verdict(number: int, candidate: Candidate, verdict: dict | None, decision: str,
                     best_median_us: float | None = None) -> "Experiment":
        if verdict is None:  # nothing to judge: the reply held no kernel, or was cut off
            if candidate.truncated:
                return Experiment(number, candidate.description, decision, "FAIL", "truncated",
                                  TRUNCATED_MESSAGE, config=candidate.config)
            return Experiment(number, candidate.description, decision, "FAIL", "parse",
                              NO_CODE_MESSAGE, config=candidate.config)
        timing = verdict.get("timing") or {}
        median_us = timing.get("median_us")
        speedup = best_median_us / median_us if (median_us and best_median_us) else None
        message = failure_message(verdict)
        if not message and timing.get("spread_ok") is False:  # right, but its time means nothing: never kept
            message = f"its time was not trusted: {timing.get('spread_note') or 'the reps spread too widely'}"
        if not message and (timing.get("grid") or {}).get("fills_target") is False:  # the interpreter's speed
            message = f"not kept for its CPU time: {timing['grid'].get('detail')} ({timing['grid'].get('rule')})"
        return Experiment(number, candidate.description, decision, verdict.get("verdict", "FAIL"),
                          verdict.get("failed_stage"), message, median_us,
                          timing.get("iqr_us"), speedup, candidate.config)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @staticmethod
    def from_json(d: dict[str, Any]) -> "Experiment":
        return Experiment(**d)


@dataclass
class SearchContext:
    """Everything a proposer may look at for the next experiment on one target."""

    kernel_type: str
    dims: dict[str, int]
    dtype: str
    target: str  # registry.target_name: softmax[64x1024:float16]
    best_source: str
    best_verdict: dict | None = None
    history: list[Experiment] = field(default_factory=list)  # the recent ones, oldest first
    device: dict[str, Any] = field(default_factory=dict)
    peaks: dict[str, Any] = field(default_factory=dict)  # measured: copy_gbps, matmul_tflops
    experiment: int = 1  # the number the next experiment will get
    backend: str = "triton"
    # proposals made on this target so far, when `history` is only the recent window of them
    proposal_count: int | None = None
    # the population (autokernel.search.population): the kernel to start from and others beside it
    parent_number: int | None = None
    parent_source: str | None = None  # None: the best is the parent
    parent_median_us: float | None = None
    inspirations: list[dict] = field(default_factory=list)  # number, median_us, description, source
    strategy: str = "refine"  # autokernel.search.schedule.LLM_STRATEGIES
    parks: int = 0  # plateaus of this target so far
    ideas: list[str] = field(default_factory=list)  # the "ideas first" strategy's ideas
    visit_proposals: int = 0  # proposals made in the current visit
    training: bool = False  # a training run on a target whose starter gives a backward: ranked by both

    @property
    def best_median_us(self) -> float | None:
        return ((self.best_verdict or {}).get("timing") or {}).get("median_us")

    @property
    def last(self) -> Experiment | None:
        return self.history[-1] if self.history else None

    @property
    def proposals(self) -> int:
        """Proposals made on this target so far (the baseline is not one)."""
        if self.proposal_count is not None:
            return self.proposal_count
        return sum(1 for e in self.history if e.decision != "BASELINE")


@runtime_checkable
class Proposer(Protocol):
    name: str  # "llm" or "tune": the leaderboard's agent column

    def propose(self, ctx: SearchContext) -> Candidate:
        """The next candidate; raises autokernel.errors.Plateau when it has nothing new to offer."""
        ...

    def observe(self, candidate: Candidate, verdict: dict | None) -> None:
        """The judge's verdict on a candidate this proposer made (None: it was not judged)."""
        ...
