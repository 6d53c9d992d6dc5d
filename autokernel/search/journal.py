"""state.json as a snapshot plus an append-only journal, so that saving the search's state after
every experiment costs the same at the 25,000th experiment as at the first.

- `state.json` holds the whole state (the shape it always had, plus `"journal"`: the generation of
  the journal that continues it). It is written atomically (a temp file, fsync, os.replace) only
  when the state is compacted: when a session saves a state it did not load, when the journal has
  grown as large as the snapshot, and when a run ends. At rest after a clean end it is complete.
- `state.journal` holds one JSON line per save since, each with only what changed: the run's own
  fields when they changed, the fields (the history aside) of each target that changed, and the
  history entries appended since the save before. A line is appended and flushed; a line cut short
  by a crash is no save at all, so kill -9 leaves the previous state or the new one.

A durable save (the default: an experiment recorded) is also fsync'd, which makes every line
before it durable too: it is the run's one fsync per experiment, its commit point. The files an
experiment writes around it (candidate, prompt, reply, verdict, leaderboard row) are flushed, not
fsync'd: after kill -9 they are whole (the page cache outlives the process); after the machine
itself crashed, the last experiments' files may be lost, and the hashes checked on --resume name
them. A save that only hands out a number (a candidate in flight) need not be durable: until an
experiment after it is recorded, a crash of the machine loses nothing recorded under that number.

Compaction waits until the journal is as large as the snapshot, so its cost spread over the saves
that filled the journal is constant. Lines of another generation (a compaction that crashed before
it emptied the journal) are skipped. This module knows the state only as the JSON of
autokernel.search.run.RunState: a dict of fields whose "targets" are dicts with a "history" list.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

GENERATION = "journal"  # the snapshot's key naming the journal generation that continues it
MIN_COMPACT_BYTES = 1 << 20  # below this a journal is cheap to replay whatever the snapshot's size


class JournalError(ValueError):
    """A journal line before the last that is not a save: the file was changed outside the search."""


def _text(fields: dict) -> str:
    return json.dumps(fields, default=str, separators=(",", ":"), sort_keys=True)


def _scalars(target: dict) -> dict:
    return {k: v for k, v in target.items() if k != "history"}


def write_atomic(path: Path, text: str, durable: bool = True) -> None:
    """`text` replaces `path` whole or not at all (a temp file, os.replace); `durable`: fsync'd
    first, so it also survives a crash of the machine."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def replay(snapshot: dict, journal: bytes) -> tuple[dict, int]:
    """The state a snapshot and its journal hold, and how many bytes of the journal are whole
    lines (a line torn by a crash is left out). Lines of another generation are skipped."""
    state = dict(snapshot)
    generation = state.pop(GENERATION, None)
    targets = [dict(t, history=list(t.get("history", []))) for t in state.get("targets", [])]
    state["targets"] = targets
    end = journal.rfind(b"\n") + 1  # past the last whole line
    if generation is None:
        return state, end
    for number, line in enumerate(journal[:end].splitlines(), 1):
        try:
            save = json.loads(line)
            if save.get("generation") != generation:
                continue
            state.update(save.get("run", {}))
            for index, fields in save.get("targets", {}).items():
                targets[int(index)].update(fields)
            for index, entries in save.get("history", {}).items():
                targets[int(index)]["history"].extend(entries)
        except (ValueError, TypeError, AttributeError, IndexError, KeyError) as e:
            raise JournalError(f"line {number} is not a save the search wrote ({type(e).__name__}: {e})") from None
    return state, end


class StateJournal:
    """Saves of one run's state: a line of what changed, or a compaction into a new snapshot."""

    def __init__(self, snapshot: Path, journal: Path):
        self.snapshot, self.journal = Path(snapshot), Path(journal)
        self._owner: Any = None  # the state object the files hold, as last saved
        self._generation: str | None = None
        self._run_text = ""
        self._target_texts: list[str] = []
        self._lengths: list[int] = []
        self._lasts: list[Any] = []  # each history's last entry as saved: a history rewritten loses it
        self._snapshot_bytes = 0
        self._journal_bytes = 0
        self._loaded: tuple = (None, 0, 0, 0)  # generation, whole-line bytes, bytes, snapshot bytes
        self._cut_to: int | None = None  # a torn last line to cut before the next append

    # ------------------------------------------------------------------ reading
    def load(self) -> dict:
        """The state as saved: the snapshot with its journal replayed (JSON, not yet objects)."""
        text = self.snapshot.read_text(encoding="utf-8")
        snapshot = json.loads(text)
        journal = self.journal.read_bytes() if self.journal.is_file() else b""
        state, end = replay(snapshot, journal)
        self._loaded = (snapshot.get(GENERATION), end, len(journal), len(text))
        return state

    def adopt(self, owner: Any, data: dict) -> None:
        """Go on saving `owner`, just built from what `load` read, by appending to the journal (a
        torn last line is cut first) rather than by compacting: a resume does not rewrite the
        snapshot. A state.json from before the journal is compacted by its first save."""
        generation, end, size, snapshot_bytes = self._loaded
        if generation is None:
            self._owner = None
            return
        self._remember(owner, data, generation)
        self._snapshot_bytes, self._journal_bytes = snapshot_bytes, end
        self._cut_to = end if end != size else None  # by the first save: a reader never writes

    # ------------------------------------------------------------------ writing
    def save(self, owner: Any, data: dict, durable: bool = True) -> None:
        """Append what changed since the last save of `owner` (fsync'd when `durable`); compact when
        the journal has grown as large as the snapshot, or when `owner` is not the state these
        files hold."""
        targets = data["targets"]
        if owner is not self._owner or len(targets) != len(self._lengths) or not self._appended_only(targets):
            self.compact(owner, data)  # not a continuation of what the files hold: write it whole
            return
        change: dict[str, Any] = {}
        run_fields = {k: v for k, v in data.items() if k != "targets"}
        run_text = _text(run_fields)
        if run_text != self._run_text:
            change["run"], self._run_text = run_fields, run_text
        for i, target in enumerate(targets):
            fields = _scalars(target)
            text = _text(fields)
            if text != self._target_texts[i]:
                change.setdefault("targets", {})[str(i)], self._target_texts[i] = fields, text
            history, known = target["history"], self._lengths[i]
            if len(history) > known:
                change.setdefault("history", {})[str(i)], self._lengths[i] = history[known:], len(history)
                self._lasts[i] = history[-1]
        if not change:
            return
        line = (json.dumps({"generation": self._generation, **change}, default=str, separators=(",", ":"))
                + "\n").encode("utf-8")
        if self._cut_to is not None:
            with open(self.journal, "r+b") as f:
                f.truncate(self._cut_to)
            self._cut_to = None
        with open(self.journal, "ab") as f:
            f.write(line)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        self._journal_bytes += len(line)
        if self._journal_bytes >= max(MIN_COMPACT_BYTES, self._snapshot_bytes):
            self.compact(owner, data)

    def compact(self, owner: Any, data: dict) -> None:
        """The whole state into a new snapshot of a new generation, and an empty journal."""
        generation = secrets.token_hex(8)
        text = json.dumps({**data, GENERATION: generation}, default=str, separators=(",", ":"))
        write_atomic(self.snapshot, text)
        # a new empty file, not a truncation: a reader holding the old one keeps whole lines
        write_atomic(self.journal, "")
        self._remember(owner, data, generation)
        self._snapshot_bytes, self._journal_bytes, self._cut_to = len(text), 0, None

    def _appended_only(self, targets: list[dict]) -> bool:
        """Each history is the one saved, at least as long, with the entry saved last still in its
        place: only appended to since (a history cleared or rewritten is saved whole)."""
        return all(len(t["history"]) >= n and (n == 0 or t["history"][n - 1] is last)
                   for t, n, last in zip(targets, self._lengths, self._lasts))

    def _remember(self, owner: Any, data: dict, generation: str) -> None:
        self._owner, self._generation = owner, generation
        self._run_text = _text({k: v for k, v in data.items() if k != "targets"})
        self._target_texts = [_text(_scalars(t)) for t in data["targets"]]
        self._lengths = [len(t["history"]) for t in data["targets"]]
        self._lasts = [t["history"][-1] if t["history"] else None for t in data["targets"]]
