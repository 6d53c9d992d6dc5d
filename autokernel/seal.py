"""Sealed records: every leaderboard row carries the sha256 of the candidate's source as the search
held it before judging, and the run's files are checked against those hashes.

A candidate is untrusted code that runs while the run folder exists. Two things keep it from
rewriting the run's records:
- `RecordGuard`: the search snapshots the run folder before each judge call and, when the call
  returns, restores anything that changed (a forged row, an overwritten best/ file, a rewritten
  experiment) and fails the candidate, naming the files. The OS sandbox keeps a candidate out of the
  run folder in the first place; this guard catches what gets past it (no sandbox on the machine).
- `check_run`: what `autokernel leaderboard --check`, verify, export and `--resume` run first. Each
  row must be backed by kernels/<target>/exp_NNNN.py with the row's hash, best/<target>.py must be
  the text of the target's best kept row, and state.json must agree with the leaderboard.

The hash is of the text, not a signature: it ties each file to the row the search wrote, which is
what a candidate's tampering breaks; keeping a candidate from writing consistent forgeries of every
record at once is the sandbox's part.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from autokernel.errors import UserError
from autokernel.leaderboard import FILENAME as LEADERBOARD
from autokernel.leaderboard import HASH_COLUMN, read

FIX_ROW = "re-run the experiment, or remove the row from leaderboard.tsv"
# Python imports a file's cached bytecode instead of its text when the cache's recorded mtime and
# size match: a planted cache beside a checked file would run unchecked code.
BYTECODE_DIR = "__pycache__"
FRESH_NS = 200_000_000  # well above the coarse tick of file times
MAX_RECORD_BYTES = 64 << 20  # no record is this big: a bigger file is the candidate's, to be removed


def source_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_sha256(path: Path) -> str:
    """The hash of a plain file; a link, pipe or folder in a record's place never matches (and a
    pipe is never opened: reading it would block)."""
    if not stat.S_ISREG(os.lstat(path).st_mode):
        return "not a plain file"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_source(path: Path, text: str) -> None:
    """A record written byte for byte from the held text (no newline translation), so its hash is
    the held text's hash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))


# ====================================================================== guarding a judge call
def _content(path: str, st: os.stat_result) -> bytes:
    """A file's bytes; for anything else (a link, a pipe that would block a read, a file too big to
    hold) a stand-in that changes whenever it does."""
    if stat.S_ISLNK(st.st_mode):
        return b"link:" + os.fsencode(os.readlink(path))
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES:
        return f"special:{st.st_mode}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}".encode()
    try:
        return Path(path).read_bytes()
    except OSError as e:
        return f"unreadable:{e}".encode()


class RecordGuard:
    """The run folder as it was before a judge call; `restore()` undoes whatever the call changed.

    One guard serves a whole search: a file whose stat is unchanged since it was last read is not
    read again, so a snapshot of a long run costs a walk of its folder, not a read of every file.
    The change time is part of that stat, and no process can set it back: any write shows."""

    def __init__(self, run: Path):
        self.run = Path(run)
        self._cache: dict[str, tuple[tuple, bytes]] = {}
        self.before: dict[str, bytes] = {}
        self.folders: set[str] = set()
        self._fresh_ns = 0

    def snapshot(self) -> "RecordGuard":
        # file times tick coarsely (a few ms): a file changed since shortly before the snapshot is
        # read again whatever its stat says, so a write within one tick cannot hide
        self._fresh_ns = time.time_ns() - FRESH_NS
        self.before, self.folders = self._walk()
        return self

    def _walk(self) -> tuple[dict[str, bytes], set[str]]:
        """Every file of the run folder by path relative to it, and every folder (the judge writes
        no bytecode there, so a cache that appears while a candidate runs is the candidate's)."""
        files: dict[str, bytes] = {}
        folders: set[str] = set()
        pending = [(str(self.run), "")]
        while pending:
            folder, prefix = pending.pop()
            with os.scandir(folder) as entries:
                for entry in entries:
                    rel = prefix + entry.name
                    if entry.is_dir(follow_symlinks=False):
                        folders.add(rel)
                        pending.append((entry.path, rel + "/"))
                    else:
                        files[rel] = self._read(rel, entry)
        for rel in set(self._cache) - set(files):
            del self._cache[rel]
        return files, folders

    def _read(self, rel: str, entry: os.DirEntry) -> bytes:
        st = entry.stat(follow_symlinks=False)
        key = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_mode)
        cached = self._cache.get(rel)
        if cached is None or cached[0] != key or st.st_ctime_ns >= self._fresh_ns:
            cached = (key, _content(entry.path, st))
            self._cache[rel] = cached
        return cached[1]

    def restore(self) -> list[str]:
        """Put back every changed or removed file, remove every added one (and the folders added to
        hold them); the paths touched."""
        after, folders = self._walk()
        touched = sorted(p for p in set(self.before) | set(after) if self.before.get(p) != after.get(p))
        for rel in touched:
            path = self.run / rel
            if path.is_symlink() or path.exists():
                path.unlink()
            if rel in self.before:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(self.before[rel])
        for rel in sorted(folders - self.folders, key=lambda p: p.count("/"), reverse=True):
            folder = self.run / rel
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        return touched


def tampered_verdict(verdict: dict | None, detail: str) -> dict:
    """The judge's verdict turned into a FAIL at `integrity`: the candidate is rejected, the reason
    named, its timing dropped (a candidate that rewrote the records cannot be believed)."""
    verdict = dict(verdict or {})
    stages = [s for s in verdict.get("stages") or [] if s.get("name") != "integrity"]
    stages.append({"name": "integrity", "status": "fail", "detail": detail, "seconds": 0.0})
    verdict.update(verdict="FAIL", failed_stage="integrity", stages=stages, timing=None, roofline=None)
    return verdict


def seal_verdict(verdict: dict | None, held_sha256: str, touched: list[str]) -> dict | None:
    """The verdict as the search may use it: a FAIL when the candidate changed the run's records
    while it was judged, or when the judge reports judging other text than the search held."""
    if touched:
        return tampered_verdict(verdict, "the candidate changed the run's records while it was judged: "
                                         f"{', '.join(touched)} (put back as they were)")
    judged = (verdict or {}).get(HASH_COLUMN)
    if judged and judged != held_sha256:
        return tampered_verdict(verdict, f"the judge judged text with sha256 {judged[:12]}, not the candidate "
                                         f"the search held ({held_sha256[:12]}): the file changed before judging")
    return verdict


# ====================================================================== checking a run
@dataclass
class SealReport:
    """What `check_run` found: `errors` break the seal; `unsealed` rows carry no hash (written
    before rows were sealed) so their files cannot be checked."""

    run: Path
    errors: list[str] = field(default_factory=list)
    unsealed: list[str] = field(default_factory=list)
    rows: int = 0
    best_files: int = 0
    best_rows: dict[str, dict] = field(default_factory=dict)  # target -> its best kept row

    @property
    def ok(self) -> bool:
        return not self.errors and not self.unsealed

    def summary(self) -> str:
        return (f"{self.run.name}: {self.rows} row(s) and {self.best_files} best file(s) checked; "
                f"{len(self.errors)} error(s), {len(self.unsealed)} unsealed row(s)")

    def lines(self) -> list[str]:
        return self.errors + [f"{u} (unsealed: no {HASH_COLUMN})" for u in self.unsealed]


def expected_candidate(target: str, experiment: int) -> str:
    from autokernel.run import target_slug
    return f"kernels/{target_slug(target)}/exp_{experiment:04d}.py"


def _row_hash(row: pd.Series) -> str:
    return str(row.get(HASH_COLUMN) or "")


def _check_rows(run: Path, frame: pd.DataFrame, report: SealReport) -> None:
    """Each row against its experiment file; duplicates and KEEPs that did not pass."""
    seen: set[tuple[str, int]] = set()
    for _, row in frame.iterrows():
        target, number = str(row["target"]), row["experiment"]
        if pd.isna(number):
            report.errors.append(f"leaderboard.tsv: a row of {target!r} has no experiment number: {FIX_ROW}")
            continue
        number = int(number)
        name = f"row {target} #{number}"
        if (target, number) in seen:
            report.errors.append(f"leaderboard.tsv: {name} appears more than once: remove the extra row")
        seen.add((target, number))
        if row["decision"] == "KEEP" and row["verdict"] != "PASS":
            report.errors.append(f"leaderboard.tsv: {name} is a KEEP whose verdict is {row['verdict'] or 'empty'}, "
                                 f"not PASS: {FIX_ROW}")
        candidate = str(row["candidate"] or "")
        if not candidate:
            if not (row["verdict"] == "FAIL" and row["failed_stage"] == "parse"):  # an LLM reply with no code
                report.errors.append(f"leaderboard.tsv: {name} ({row['decision']} {row['verdict']}) names no "
                                     f"experiment file: {FIX_ROW}")
            continue
        expected = expected_candidate(target, number)
        if candidate != expected:
            report.errors.append(f"leaderboard.tsv: {name} points at {candidate}, not {expected}: {FIX_ROW}")
            continue
        _check_file(run / candidate, candidate, _row_hash(row), name, report)


def _check_file(path: Path, rel: str, sha: str, name: str, report: SealReport) -> None:
    if not path.is_file():
        report.errors.append(f"{rel}: missing, yet {name} of leaderboard.tsv names it: {FIX_ROW}")
    elif not sha:
        report.unsealed.append(f"{rel} ({name})")
    elif (actual := file_sha256(path)) != sha:
        report.errors.append(f"{rel}: its sha256 {actual[:12]} is not the {sha[:12]} of {name}: "
                             f"the file was changed after it was judged; {FIX_ROW}")


def best_kept_rows(frame: pd.DataFrame) -> dict[str, dict]:
    """Per target, the row best/ must hold: the last KEEP, or a passing BASELINE before any KEEP
    (a KEEP is only ever faster than the best before it)."""
    best: dict[str, dict] = {}
    frame = frame[frame["experiment"].notna()].sort_values("experiment", kind="stable")
    for _, row in frame.iterrows():
        kept = row["decision"] == "KEEP" or (row["decision"] == "BASELINE" and row["verdict"] == "PASS"
                                             and pd.notna(row["median_us"]))
        if kept:
            best[str(row["target"])] = row.to_dict()
    return best


def _check_best(run: Path, frame: pd.DataFrame, report: SealReport) -> None:
    from autokernel.run import target_slug
    report.best_rows = best_kept_rows(frame)
    slugs = {target_slug(t): t for t in frame["target"]}
    for path in sorted((run / "best").glob("*.py")) if (run / "best").is_dir() else []:
        rel = f"best/{path.name}"
        report.best_files += 1
        target = slugs.get(path.stem)
        row = report.best_rows.get(target) if target is not None else None
        if row is None:
            report.errors.append(f"{rel}: no kept, passing row of leaderboard.tsv backs it: "
                                 "re-run the search, or remove the file")
            continue
        sha = str(row.get(HASH_COLUMN) or "")
        experiment_file = run / str(row["candidate"])
        if not sha and experiment_file.is_file():  # unsealed row: best/ must at least be its file
            sha = file_sha256(experiment_file)
        if not sha or file_sha256(path) != sha:
            report.errors.append(f"{rel}: not the text of its best row ({target} #{int(row['experiment'])}, "
                                 f"{row['candidate']}): it was written outside the search; re-run the search")
    for target, row in report.best_rows.items():
        if not (run / "best" / f"{target_slug(target)}.py").is_file():
            report.errors.append(f"best/{target_slug(target)}.py: missing, yet {target} #{int(row['experiment'])} "
                                 f"is its best row: copy {row['candidate']} there or re-run the search")


def _check_state(run: Path, frame: pd.DataFrame, report: SealReport) -> None:
    """state.json (the search's own record) against the leaderboard: a row only the leaderboard has,
    or a best the two disagree on, was not written by the search."""
    path = run / "state.json"
    if not path.is_file():
        return
    try:
        targets = json.loads(path.read_text(encoding="utf-8")).get("targets", [])
    except ValueError:
        report.errors.append("state.json: not valid JSON")
        return
    recorded = {(t.get("name"), h.get("number")): (h.get("row") or {}) for t in targets for h in t.get("history", [])}
    for _, row in frame[frame["experiment"].notna()].iterrows():
        key = (str(row["target"]), int(row["experiment"]))
        if key not in recorded:
            report.errors.append(f"leaderboard.tsv: row {key[0]} #{key[1]} is not in state.json's history: "
                                 f"the search never recorded it; {FIX_ROW}")
        elif recorded[key].get(HASH_COLUMN, "") != _row_hash(row) and recorded[key].get(HASH_COLUMN):
            report.errors.append(f"leaderboard.tsv: row {key[0]} #{key[1]} has another {HASH_COLUMN} than "
                                 f"state.json records: {FIX_ROW}")
    for t in targets:
        best, row = t.get("best_experiment"), report.best_rows.get(t.get("name"))
        if best is not None and (row is None or int(row["experiment"]) != best):
            found = f"#{int(row['experiment'])}" if row is not None else "none"
            report.errors.append(f"state.json: names experiment #{best} as the best of {t.get('name')}, "
                                 f"leaderboard.tsv's best is {found}: the records were changed outside the search")


def _check_bytecode(run: Path, report: SealReport) -> None:
    for folder in ("kernels", "best"):
        for cache in sorted((run / folder).rglob(BYTECODE_DIR)) if (run / folder).is_dir() else []:
            report.errors.append(f"{cache.relative_to(run).as_posix()}/: compiled bytecode beside the records, "
                                 "which Python may import instead of the checked text: remove the folder")


def check_run(run: str | Path) -> SealReport:
    """Every record of a run against the hashes its leaderboard rows carry."""
    run = Path(run)
    report = SealReport(run=run)
    frame = read(run / LEADERBOARD)
    report.rows = len(frame)
    _check_rows(run, frame, report)
    _check_best(run, frame, report)
    _check_state(run, frame, report)
    _check_bytecode(run, report)
    return report


class SealError(UserError):
    """A run's records do not match the hashes its leaderboard carries."""


def require_sealed(run: str | Path, action: str, *, allow_unsealed: bool = False) -> SealReport:
    """check_run, raising a UserError that names each bad file (`action` opens its message: "verify
    refused"). `allow_unsealed` lets rows without a hash through (a run written before rows were
    sealed can still be resumed)."""
    report = check_run(run)
    if report.errors or (report.unsealed and not allow_unsealed):
        shown = report.lines() if not allow_unsealed else report.errors
        listed = "\n  ".join(shown[:20]) + (f"\n  ... and {len(shown) - 20} more" if len(shown) > 20 else "")
        more = f"; `autokernel leaderboard --check {run}` lists them all" if len(shown) > 20 else ""
        hint = ("these rows come from a run older than sealed records: re-run it with `autokernel optimize`"
                if not report.errors else "re-run the experiments named, or remove their rows") + more
        raise SealError(f"{action}: the records of {Path(run)} do not match what was judged:\n  {listed}", hint)
    return report
