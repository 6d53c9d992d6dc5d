"""The leaderboard: runs/<id>/leaderboard.tsv, one row per experiment, in DESIGN.md's columns.

Rows are appended and flushed one at a time, so kill -9 loses at most the experiment that was
running; a line torn by a crash mid-write is dropped before the next append. The search records
each experiment in its state first (fsync'd: autokernel.search.journal) and repairs the leaderboard from
it on --resume, so a row needs no fsync of its own.
Cells are escaped (backslash, tab, newline) so a description or an error message can never break
the table for the tools that read it. The CLI only renders what this module reads back.
"""
from __future__ import annotations

import csv
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from autokernel.errors import UserError

COLUMNS = ("experiment", "timestamp", "target", "kernel_type", "agent", "decision", "verdict",
           "failed_stage", "median_us", "baseline_us", "speedup_vs_eager", "speedup_vs_best",
           "candidate", "device", "prompt_tokens", "completion_tokens", "description", "judged_dtype",
           "source_sha256", "parent", "strategy")
HEADER = "\t".join(COLUMNS) + "\n"
HASH_COLUMN = "source_sha256"  # of the candidate's text as the search held it before judging
# Leaderboards written before rows carried a judged dtype and a hash, and before they carried each
# experiment's parent and strategy: still read; a resume upgrades the header, and their rows keep
# the newer cells empty. New columns are only ever appended, so an older row is a prefix of a new one.
LEGACY_COLUMNS = COLUMNS[:-4]
LEGACY_HEADER = "\t".join(LEGACY_COLUMNS) + "\n"
SEALED_COLUMNS = COLUMNS[:-2]
OLDER_HEADERS = (LEGACY_HEADER, "\t".join(SEALED_COLUMNS) + "\n")
FILENAME = "leaderboard.tsv"
INT_COLUMNS = ("experiment", "prompt_tokens", "completion_tokens", "parent")
FLOAT_COLUMNS = ("median_us", "baseline_us", "speedup_vs_eager", "speedup_vs_best")
DECISIONS = ("BASELINE", "KEEP", "REVERT")

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


def escape(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):  # None and NaN: empty cell
        return ""
    if isinstance(value, float):
        return repr(value)  # raw and unrounded: round only when printing
    return "".join(_ESCAPES.get(ch, ch) for ch in str(value))


def unescape(cell: str) -> str:
    if "\\" not in cell:
        return cell
    out, chars = [], iter(cell)
    for ch in chars:
        out.append(_UNESCAPES.get(next(chars, "\\"), "\\") if ch == "\\" else ch)
    return "".join(out)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def device_label(device: dict | None) -> str:
    device = device or {}
    kind, name = device.get("type", ""), device.get("name", "")
    return f"{kind} {name}".strip() if name and name != kind else kind


def make_row(*, experiment: int, target: str, kernel_type: str, agent: str, decision: str,
             verdict: dict | None, candidate: str = "", description: str = "",
             best_median_us: float | None = None, prompt_tokens: int | None = None,
             completion_tokens: int | None = None, timestamp: str | None = None,
             source_sha256: str = "", parent: int | None = None, strategy: str = "",
             unjudged_stage: str = "parse") -> dict[str, Any]:
    """One row. `verdict` None means the LLM reply held no kernel: FAIL at stage `parse` (or
    `unjudged_stage`: `truncated` for a reply cut off at the token limit).
    `best_median_us` is the best time before this experiment (for speedup_vs_best);
    `source_sha256` is the hash of the candidate's text as the search held it ('' with no text);
    `parent` the experiment it was made from, `strategy` the strategy of its visit."""
    timing = (verdict or {}).get("timing") or {}
    median_us = timing.get("median_us")
    return {
        "experiment": experiment, "timestamp": timestamp or now_iso(), "target": target,
        "kernel_type": kernel_type, "agent": agent, "decision": decision,
        "verdict": verdict.get("verdict", "FAIL") if verdict else "FAIL",
        "failed_stage": verdict.get("failed_stage") if verdict else unjudged_stage,
        "median_us": median_us, "baseline_us": timing.get("baseline_median_us"),
        "speedup_vs_eager": timing.get("speedup_vs_eager"),
        "speedup_vs_best": best_median_us / median_us if (median_us and best_median_us) else None,
        "candidate": candidate, "device": device_label((verdict or {}).get("device")),
        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "description": description,
        # the dtype the judge ran the target in: differs from the target's own only where another
        # dtype stood in for it (bf16 dot products under the Triton interpreter)
        "judged_dtype": (verdict or {}).get("judged_dtype"),
        "source_sha256": source_sha256,
        "parent": parent, "strategy": strategy,
    }


class Leaderboard:
    """Append-only writer for one run's leaderboard.tsv."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        # the file's header and last line are checked before this writer's first append only:
        # after it, the file ends with a row this writer wrote whole
        self._checked = False

    def _prepare(self) -> bool:
        """Check an existing file's header and drop a torn last line; True when a header is needed."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return True
        with open(self.path, "rb+") as f:
            first = f.readline().decode("utf-8", "replace")
            if first in OLDER_HEADERS:
                f.seek(0)
                _upgrade(self.path, f.read(), first)
                return False
            if first != HEADER:
                raise UserError(f"{self.path} does not start with the leaderboard header",
                                "it was written by another tool or version: start a new run")
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":  # a row cut short by a crash mid-write
                f.seek(0)
                f.truncate(f.read().rfind(b"\n") + 1)
        return False

    def append(self, row: dict[str, Any]) -> None:
        line = _line(row)
        if not self._checked:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = (HEADER if self._prepare() else "") + line
        with open(self.path, "a", encoding="utf-8", newline="") as f:
            f.write(line)
            f.flush()
        self._checked = True

    def rewrite(self, rows: list[dict[str, Any]]) -> None:
        """The whole file from `rows`, atomically: how the search puts its leaderboard back from
        the rows its state holds."""
        from autokernel.search.journal import write_atomic
        write_atomic(self.path, HEADER + "".join(_line(row) for row in rows))

    def read(self) -> pd.DataFrame:
        return read(self.path)


def _line(row: dict[str, Any]) -> str:
    unknown = set(row) - set(COLUMNS)
    if unknown:
        raise ValueError(f"not leaderboard columns: {', '.join(sorted(unknown))}")
    return "\t".join(escape(row.get(c)) for c in COLUMNS) + "\n"


def _upgrade(path: Path, content: bytes, header: str) -> None:
    """A leaderboard of an older layout (`header`) gains the newer columns in its header; its old
    rows keep those cells empty (one from before rows were sealed: `leaderboard --check` reports
    them unsealed). Replaced atomically."""
    body = content[len(header.encode("utf-8")):]
    if body and not body.endswith(b"\n"):  # a row cut short by a crash mid-write
        body = body[:body.rfind(b"\n") + 1]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(HEADER.encode("utf-8") + body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def has_hash_column(path: str | Path) -> bool:
    """False for a leaderboard written before rows carried the candidate's hash."""
    path = Path(path)
    if not path.is_file():
        return True
    with open(path, encoding="utf-8", errors="replace") as f:
        return HASH_COLUMN in f.readline().rstrip("\n").split("\t")


def read(path: str | Path) -> pd.DataFrame:
    """A leaderboard.tsv as a DataFrame: numbers as numbers, empty cells as NaN/<NA>/""."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=list(COLUMNS))
    frame = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, na_filter=False,
                        quoting=csv.QUOTE_NONE, on_bad_lines="skip", lineterminator="\n")
    frame = frame.reindex(columns=list(COLUMNS), fill_value="").fillna("")
    for column in frame.columns:  # a long run has a million cells: a column without an escape is left as read
        if "\\" in "".join(frame[column].tolist()):
            frame[column] = frame[column].map(unescape)
    for column in FLOAT_COLUMNS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    for column in INT_COLUMNS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("Int64")
    return frame


def run_dirs(runs_dir: str | Path) -> list[Path]:
    runs_dir = Path(runs_dir)
    if not runs_dir.is_dir():
        return []
    return sorted(p.parent for p in runs_dir.glob(f"*/{FILENAME}"))


def best_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """Per target (and device), the fastest kept kernel: a PASS that was the baseline or a KEEP."""
    kept = frame[(frame["verdict"] == "PASS") & frame["decision"].isin(["BASELINE", "KEEP"])
                 & frame["median_us"].notna()]
    if kept.empty:
        return kept
    best = kept.loc[kept.groupby(["target", "device"], sort=False)["median_us"].idxmin()].copy()
    starters = frame[frame["decision"] == "BASELINE"].groupby(["target", "device"])["median_us"].min()
    best["speedup_vs_starter"] = [starters.get((t, d), float("nan")) / m
                                  for t, d, m in zip(best["target"], best["device"], best["median_us"])]
    return best


def best_per_target(runs_dir: str | Path) -> pd.DataFrame:
    """The best result per target across every run under `runs_dir`, with the run it came from
    and `candidate` relative to `runs_dir`."""
    frames = []
    for run in run_dirs(runs_dir):
        frame = read(run / FILENAME)
        if frame.empty:
            continue
        best = best_rows(frame)
        best.insert(0, "run", run.name)
        best["candidate"] = [f"{run.name}/{c}" if c else "" for c in best["candidate"]]
        frames.append(best)
    if not frames:
        return pd.DataFrame(columns=["run", *COLUMNS, "speedup_vs_starter"])
    every = pd.concat(frames, ignore_index=True)
    return every.loc[every.groupby(["target", "device"], sort=False)["median_us"].idxmin()] \
        .sort_values("target").reset_index(drop=True)


# ------------------------------------------------------------------ rendering (for the CLI)
RUN_VIEW = ("experiment", "target", "agent", "decision", "verdict", "failed_stage", "median_us",
            "speedup_vs_eager", "speedup_vs_best", "description")
BEST_VIEW = ("target", "device", "run", "experiment", "agent", "median_us", "baseline_us",
             "speedup_vs_eager", "speedup_vs_starter", "candidate")
_STYLES = {"KEEP": "green", "BASELINE": "cyan", "REVERT": "dim", "PASS": "green", "FAIL": "red",
           "CRASH": "red", "TIMEOUT": "yellow", "COMPILE_ONLY": "yellow"}


def _cell(column: str, value: Any) -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return ""
    if column.startswith("speedup"):
        return f"{value:.3g}x"
    if column.endswith("_us"):
        return f"{value:,.1f}" if value >= 100 else f"{value:.3g}"
    text = str(value)
    if column == "description" and len(text) > 60:
        return text[:57] + "..."
    style = _STYLES.get(text)
    return f"[{style}]{text}[/]" if style and column in ("decision", "verdict") else text


def rich_table(frame: pd.DataFrame, columns: tuple[str, ...], title: str):
    """A rich Table of `columns` of `frame`, numbers rounded for reading (the TSV keeps them raw)."""
    from rich.table import Table
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        numeric = column in FLOAT_COLUMNS or column in INT_COLUMNS or column.startswith("speedup")
        table.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for _, row in frame.iterrows():
        table.add_row(*(_cell(c, row.get(c)) for c in columns))
    return table


LINEAGE_VIEW = ("experiment", "parent", "strategy", "decision", "verdict", "median_us", "speedup_vs_eager",
                "description")


def lineage(frame: pd.DataFrame, target: str) -> pd.DataFrame:
    """A target's lineage: its best kernel, that kernel's parent, the parent's parent... back to
    the starter (oldest first). `target` is a target's name or the start of one; it must name one."""
    names = sorted(set(frame["target"]))
    matches = [n for n in names if n == target] or [n for n in names if n.startswith(target)]
    if len(matches) != 1:
        raise UserError(f"{'no target' if not matches else 'several targets'} named {target!r} in this run",
                        f"give one of: {', '.join(names) or 'none'}")
    rows = frame[frame["target"] == matches[0]]
    by_number = {int(r["experiment"]): r for _, r in rows.iterrows() if pd.notna(r["experiment"])}
    best = best_rows(rows)
    if best.empty:
        return rows.iloc[0:0]
    chain, number = [], int(best.iloc[0]["experiment"])
    while number in by_number and number not in chain:  # a loop would be a damaged file: stop there
        chain.append(number)
        parent = by_number[number]["parent"]
        if parent is pd.NA or pd.isna(parent):
            break
        number = int(parent)
    return rows.set_index(rows["experiment"].astype(int)).loc[list(reversed(chain))].reset_index(drop=True)
