"""A run on disk: runs/<run_id>/ with config.json, plan.json, state.json, the leaderboard, every
candidate and its verdict, and the best kernel per target.

state.json is what a resume needs and the record the leaderboard is repaired from. It is saved
after every experiment as one line appended to state.journal (what changed), and compacted into
state.json now and then (autokernel.search.journal): kill -9 at any moment leaves either the previous state
or the new one, and a save costs the same late in a long run as early. Every file the search writes
into the run is hashed as it is written (`RunDir.written`); an experiment's history entry carries
the hashes of its verdict, prompt and reply, which `leaderboard --check` and `--resume` check.
"""
from __future__ import annotations

import bisect
import hashlib
import json
import re
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from autokernel.errors import UsageError, UserError
from autokernel.search.journal import JournalError, StateJournal
from autokernel.search.leaderboard import FILENAME as LEADERBOARD
from autokernel.search.proposer import Experiment

STATE_VERSION = 2  # 2: state.json is a snapshot continued by state.journal; 1 (no journal) still reads
JOURNAL = "state.journal"
REBUILT = (LEADERBOARD, "state.json", JOURNAL)  # what RunDir.rewrite_records writes from memory
_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(d|h|m|s)", re.I)
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration_s(text: str) -> float:
    """'8h', '90m', '1h30m', '45s', '2d' or a plain number of seconds."""
    text = str(text).strip().lower()
    try:
        return float(text)
    except ValueError:
        pass
    parts = _DURATION.findall(text)
    if not parts or _DURATION.sub("", text).strip():
        raise UsageError(f"cannot read the duration {text!r}", "write it like 8h, 90m, 1h30m or 45s")
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


@lru_cache(maxsize=1024)  # asked for every file of every experiment
def target_slug(target: str) -> str:
    """A folder-safe name for a target: softmax[64x1024:float16] -> softmax-64x1024-float16."""
    return re.sub(r"[^A-Za-z0-9_.=-]+", "-", target).strip("-")


def new_run_id(runs_dir: Path) -> str:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    run_id, n = stamp, 1
    while (runs_dir / run_id).exists():
        n += 1
        run_id = f"{stamp}-{n}"
    return run_id


def write_json_atomic(path: Path, data: Any, indent: int | None = 1, durable: bool = True) -> str:
    """`data` as JSON replacing `path` whole or not at all (fsync'd when `durable`); the text."""
    from autokernel.search.journal import write_atomic
    text = json.dumps(data, indent=indent, default=str, separators=None if indent else (",", ":"))
    write_atomic(path, text, durable)
    return text


@dataclass(frozen=True)
class Record:
    """A target's record so far (the baseline not counted)."""

    proposals: int
    passes: int
    keeps: int
    seconds: float


@dataclass
class TargetState:
    """One target's search: where it stands and everything it has tried."""

    name: str  # registry.target_name
    kernel_type: str
    dims: dict[str, int]
    dtype: str
    rank: int = 0
    share: float = 0.0  # of the model's time
    ceiling_speedup: float | None = None
    kwargs: dict[str, Any] = field(default_factory=dict)
    status: str = "pending"  # pending, searching, waiting (another target came first), parked, done
    stop_reason: str = ""
    next_experiment: int = 0
    best_experiment: int | None = None
    best_median_us: float | None = None
    best_iqr_us: float | None = None
    best_reps: int | None = None
    baseline_median_us: float | None = None  # the starter's
    eager_median_us: float | None = None  # PyTorch's own op at the same shape
    seconds: float = 0.0  # search time spent on this target
    history: list[dict] = field(default_factory=list)  # Experiment.to_json() + its leaderboard row
    # experiments handed to a judge and not yet recorded (number, sha256, description, config):
    # a resume judges them again under their own numbers
    pending: list[dict] = field(default_factory=list)
    # the scheduler's record (autokernel.search.schedule, population): kept in state.json, so a
    # resume after kill -9 keeps the elites and the parked targets
    elites: list[dict] = field(default_factory=list)  # the best few distinct passing kernels
    parks: int = 0  # plateaus so far: each revisit takes the next strategy
    strategy: str = ""  # the strategy of the current (or last) visit
    chosen_because: str = ""  # why the scheduler gave it the last visit
    stint_start: int = 0  # len(history) when the current visit began: its plateau counts from there
    blocked: str = ""  # why it can never be searched again by this run (even the smallest prompt too long)
    ideas: list[str] = field(default_factory=list)  # the "ideas first" strategy's ideas, in words

    @property
    def slug(self) -> str:
        return target_slug(self.name)

    def recent(self, count: int) -> list[Experiment]:
        """The last `count` experiments, oldest first: a window of fixed size, so what the next
        prompt is built from does not grow with the run."""
        names = _EXPERIMENT_FIELDS
        return [Experiment.from_json({k: v for k, v in h.items() if k in names})
                for h in (self.history[-count:] if count > 0 else [])]

    @property
    def proposals(self) -> int:
        """Proposals so far (the baseline is not one)."""
        return self._tally()[0]

    @property
    def reverts_in_a_row(self) -> int:
        """REVERTs at the end of the history: how long the search has gone without a faster kernel."""
        return self._tally()[1]

    @property
    def reverts_this_visit(self) -> int:
        """REVERTs in a row within the current visit: a revisit starts its plateau count afresh."""
        return min(self.reverts_in_a_row, max(len(self.history) - self.stint_start, 0))

    @property
    def record(self) -> "Record":
        """Proposals, passes and keeps so far: what the scheduler discounts a target's promise by."""
        proposals, _, passes, keeps, _ = self._tally()
        return Record(proposals, passes, keeps, self.seconds)

    @property
    def visit_proposals(self) -> int:
        """Proposals made in the current visit (since `stint_start`; a baseline is not one)."""
        baselines, start = self._tally()[4], max(self.stint_start, 0)
        return max(len(self.history) - start, 0) - (len(baselines) - bisect.bisect_left(baselines, start))

    def _tally(self) -> tuple[int, int, int, int, list[int]]:
        """(proposals, REVERTs in a row, passes, keeps, the baselines' indices), kept beside the
        history: only the entries appended since the last call are read, so asking after
        every experiment does not grow with the run."""
        history = self.history
        seen, last, counted, *counts, baselines = self.__dict__.get("_counts", (None, None, 0, 0, 0, 0, 0, []))
        if seen is not history or counted > len(history) or (counted and history[counted - 1] is not last):
            counted, counts, baselines = 0, [0, 0, 0, 0], []  # another list, or one rewritten: count it all
        proposals, streak, passes, keeps = counts
        for index, h in enumerate(history[counted:], counted):
            decision = h.get("decision")
            if decision != "BASELINE":
                proposals += 1
                passes += h.get("verdict") == "PASS"
                keeps += decision == "KEEP"
            else:
                baselines = [*baselines, index]  # a new list: a copy of the state keeps its own
            streak = streak + 1 if decision == "REVERT" else 0
        self.__dict__["_counts"] = (history, history[-1] if history else None, len(history),
                                    proposals, streak, passes, keeps, baselines)
        return proposals, streak, passes, keeps, baselines

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in _TARGET_FIELDS}

    @property
    def speedup_vs_starter(self) -> float | None:
        if self.best_median_us and self.baseline_median_us:
            return self.baseline_median_us / self.best_median_us
        return None

    @property
    def speedup_vs_eager(self) -> float | None:
        if self.best_median_us and self.eager_median_us:
            return self.eager_median_us / self.best_median_us
        return None


@dataclass
class RunState:
    run_id: str
    agent: str
    status: str = "running"  # running, interrupted, done
    stop_reason: str = ""
    budget_s: float = 8 * 3600.0
    elapsed_s: float = 0.0  # search time over every session of this run, LLM outages excluded
    sessions: int = 0
    targets: list[TargetState] = field(default_factory=list)
    # which of these ended the run: "user" (stopped it), "budget" (spent), "done" (every target at
    # its ceiling or exhausted), "nothing_usable" (the LLM gave nothing to judge); "" while running
    stop_kind: str = ""
    unusable_in_a_row: int = 0  # LLM replies in a row, across targets, with nothing that compiles
    last_unusable: str = ""  # the last of them, in words
    tokens: dict = field(default_factory=dict)  # per LLM model: prompt_tokens, completion_tokens, replies
    version: int = STATE_VERSION

    def to_json(self) -> dict:
        # shallow on purpose: the journal writes only what changed, and a copy of a long history
        # on every save would grow with the run
        return {**{name: getattr(self, name) for name in _RUN_FIELDS},
                "targets": [t.to_json() for t in self.targets]}

    @staticmethod
    def from_json(d: dict) -> "RunState":
        d = dict(d)
        names = {f.name for f in fields(TargetState)}
        d["targets"] = [TargetState(**{k: v for k, v in t.items() if k in names}) for t in d.get("targets", [])]
        known = {f.name for f in fields(RunState)} - {"version"}  # written back in the current layout
        return RunState(**{k: v for k, v in d.items() if k in known})

    @property
    def budget_left_s(self) -> float:
        return max(self.budget_s - self.elapsed_s, 0.0)


_EXPERIMENT_FIELDS = frozenset(f.name for f in fields(Experiment))
_TARGET_FIELDS = tuple(f.name for f in fields(TargetState))
_RUN_FIELDS = tuple(f.name for f in fields(RunState) if f.name != "targets")


class RunDir:
    """Paths of one run, and reading and writing its files: the one writer of a run writes through
    here, so the state is journaled and every file it writes is hashed as it is written."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.journal = StateJournal(self.state_path, self.journal_path)
        # every file written through this object: run-relative path -> sha256 of the bytes written
        self.written: dict[str, str] = {}

    @property
    def run_id(self) -> str:
        return self.path.name

    config_path = property(lambda self: self.path / "config.json")
    plan_path = property(lambda self: self.path / "plan.json")
    state_path = property(lambda self: self.path / "state.json")
    journal_path = property(lambda self: self.path / JOURNAL)
    leaderboard_path = property(lambda self: self.path / LEADERBOARD)

    def kernels(self, target: TargetState) -> Path:
        return self.path / "kernels" / target.slug

    def experiment_file(self, target: TargetState, number: int, suffix: str = ".py") -> Path:
        return self.kernels(target) / f"exp_{number:04d}{suffix}"

    def best_file(self, target: TargetState) -> Path:
        return self.path / "best" / f"{target.slug}.py"

    def relative(self, path: Path) -> str:
        return path.relative_to(self.path).as_posix()

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=False)
        (self.path / "kernels").mkdir()
        (self.path / "best").mkdir()

    # ------------------------------------------------------------------ the writer's files
    def write_text(self, path: Path, text: str) -> str:
        """A record written byte for byte from the held text (no newline translation, so its hash
        is the text's); the sha256, also noted in `written`."""
        data = text.encode("utf-8")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return self._note(path, data)

    def write_json(self, path: Path, data: Any, durable: bool = True) -> str:
        """JSON written atomically (fsync'd when `durable`); its sha256, also noted in `written`."""
        return self._note(path, write_json_atomic(path, data, durable=durable).encode("utf-8"))

    def _note(self, path: Path, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        self.written[self.relative(path)] = sha
        return sha

    # ------------------------------------------------------------------ the state
    def save_state(self, state: RunState, durable: bool = True) -> None:
        """What changed since the last save, appended to the journal (autokernel.search.journal); not
        `durable` (no fsync) for a save that only hands out numbers."""
        self.journal.save(state, state.to_json(), durable)

    def compact_state(self, state: RunState) -> None:
        """The whole state into state.json, the journal emptied: a run's state at rest."""
        self.journal.compact(state, state.to_json())

    def load_state(self) -> RunState:
        """The state as last saved (state.json and its journal); the next `save_state` of the
        returned object appends to the journal."""
        try:
            data = self.journal.load()
        except FileNotFoundError:
            self._read(self.state_path)  # says what is missing and what to do
            raise
        except JournalError as e:
            raise UserError(f"{self.journal_path} is damaged: {e}",
                            "the run's state cannot be read back; start a new run") from None
        except ValueError as e:
            raise UserError(f"{self.state_path} is not valid JSON: {e}",
                            "the run cannot be resumed; start a new one") from None
        state = RunState.from_json(data)
        self.journal.adopt(state, state.to_json())
        return state

    def rewrite_records(self, state: RunState) -> None:
        """state.json, its journal and the leaderboard rewritten from the state in memory: how the
        writer puts them back after something else changed them."""
        from autokernel.search.leaderboard import Leaderboard
        self.compact_state(state)
        Leaderboard(self.leaderboard_path).rewrite([h["row"] for t in state.targets for h in t.history
                                                    if h.get("row")])

    def load_config(self) -> dict:
        return self._read(self.config_path)

    def _read(self, path: Path) -> dict:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"{path} is missing: {self.path} is not a resumable run",
                            "pass the id of a folder under --runs-dir that `autokernel optimize` wrote") from None
        except ValueError as e:
            raise UserError(f"{path} is not valid JSON: {e}", "the run cannot be resumed; start a new one") from None


def open_for_resume(runs_dir: Path, run_id: str) -> RunDir:
    folder = Path(run_id) if Path(run_id).is_dir() and (Path(run_id) / "state.json").exists() else runs_dir / run_id
    if not folder.is_dir():
        known = sorted(p.parent.name for p in runs_dir.glob("*/state.json"))[-5:]
        raise UserError(f"no run {run_id!r} under {runs_dir}",
                        f"runs that can be resumed: {', '.join(known) or 'none'}")
    return RunDir(folder)


def repair_leaderboard(run: RunDir, state: RunState) -> None:
    """Append the rows state.json has and the leaderboard lacks (a crash between the two writes)."""
    import pandas as pd

    from autokernel.search.leaderboard import Leaderboard, read
    board = read(run.leaderboard_path)
    present = {(name, int(number)) for name, number in zip(board["target"], board["experiment"])
               if pd.notna(number)}
    writer = Leaderboard(run.leaderboard_path)
    for target in state.targets:
        for h in target.history:
            if (target.name, h["number"]) not in present and h.get("row"):
                writer.append(h["row"])
