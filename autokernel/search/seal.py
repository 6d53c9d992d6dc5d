"""Sealed records: every leaderboard row carries the sha256 of the candidate's source as the search
held it before judging, and the run's files are checked against those hashes.

A candidate is untrusted code that runs while the run folder exists. Three things keep it from
rewriting the run's records:
- the OS sandbox (harness/isolation/sandbox.py), which denies it any write outside its scratch folder;
- the record guard (autokernel.search.guard), for what gets past the sandbox: the parts of the run folder
  a candidate could change are taken before each judge call and compared after it; whatever
  changed is put back where it can be and the candidate fails at `integrity`, naming the files;
- `check_run`: what `autokernel leaderboard --check`, verify, export and `--resume` run first, and
  the search at the end of a run. Each row must be backed by kernels/<target>/exp_NNNN.py with the
  row's hash, best/<target>.py must be the text of the target's best kept row, state.json (with
  its journal) must agree with the leaderboard, and every verdict, prompt and reply must still
  have the hash the search recorded when it wrote it.

The hash is of the text, not a signature: it ties each file to the row the search wrote, which is
what a candidate's tampering breaks; keeping a candidate from writing consistent forgeries of every
record at once is the sandbox's part.
"""
from __future__ import annotations

import hashlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from autokernel.errors import UserError
from autokernel.search.guard import BYTECODE_DIR
from autokernel.search.leaderboard import FILENAME as LEADERBOARD
from autokernel.search.leaderboard import HASH_COLUMN, read

FIX_ROW = "re-run the experiment, or remove the row from leaderboard.tsv"
FIX_FILE = "put back the file the search wrote, or re-run the search"
NAMED = 20  # files named in a verdict's detail; the rest are counted
MISSING, NOT_PLAIN = "missing", "not a plain file"
HASH_THREADS = 8


def source_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_sha256(path: str | Path) -> str:
    """The hash of a plain file, or MISSING; a link, pipe or folder in a record's place is
    NOT_PLAIN, which never matches (and a pipe is never read: that would block)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return MISSING
    except OSError:  # a link (O_NOFOLLOW), or nothing a record could be
        return NOT_PLAIN
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return NOT_PLAIN
        digest = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(fd)


def hash_files(paths: list[str]) -> list[str]:
    """file_sha256 of each path, read by a few threads at once (reading and hashing release the
    GIL): checking a long run is mostly reading its files."""
    workers = min(HASH_THREADS, os.cpu_count() or 1)
    if workers < 2 or len(paths) < 64:
        return [file_sha256(p) for p in paths]
    with ThreadPoolExecutor(workers, thread_name_prefix="seal-check") as pool:
        parts = list(pool.map(lambda part: [file_sha256(p) for p in part], [paths[i::workers] for i in range(workers)]))
    hashes = [""] * len(paths)
    for i, part in enumerate(parts):
        hashes[i::workers] = part
    return hashes


def write_source(path: Path, text: str) -> None:
    """A record written byte for byte from the held text (no newline translation), so its hash is
    the held text's hash."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))


# ====================================================================== a judge call's verdict
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
        named = ", ".join(touched[:NAMED]) + (f" and {len(touched) - NAMED} more" if len(touched) > NAMED else "")
        return tampered_verdict(verdict, "the candidate changed the run's records while it was judged: "
                                         f"{named} (put back where the search holds them)")
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


def _row_hash(row: dict) -> str:
    return str(row.get(HASH_COLUMN) or "")


def _rows(frame: pd.DataFrame) -> list[dict]:
    """The leaderboard's rows as dicts (a long run's rows are walked several times), built from
    its columns: much quicker than DataFrame.to_dict."""
    columns = list(frame.columns)
    return [dict(zip(columns, values)) for values in zip(*(frame[c].tolist() for c in columns))]


def _check_rows(rows: list[dict], report: SealReport) -> list[tuple[str, str, str]]:
    """Duplicates, KEEPs that did not pass, rows pointing elsewhere; the (file, hash, row name) of
    each row's experiment file, to be checked against its hash."""
    files: list[tuple[str, str, str]] = []
    slugs: dict[str, str] = {}
    seen: set[tuple[str, int]] = set()
    for row in rows:
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
        if target not in slugs:
            from autokernel.search.run import target_slug
            slugs[target] = target_slug(target)
        expected = f"kernels/{slugs[target]}/exp_{number:04d}.py"
        if candidate != expected:
            report.errors.append(f"leaderboard.tsv: {name} points at {candidate}, not {expected}: {FIX_ROW}")
            continue
        files.append((candidate, _row_hash(row), name))
    return files


def _check_row_files(files: list[tuple[str, str, str]], hashes: list[str], report: SealReport) -> None:
    for (rel, sha, name), actual in zip(files, hashes):
        if actual == MISSING:
            report.errors.append(f"{rel}: missing, yet {name} of leaderboard.tsv names it: {FIX_ROW}")
        elif not sha:
            report.unsealed.append(f"{rel} ({name})")
        elif actual != sha:
            report.errors.append(f"{rel}: its sha256 {actual[:12]} is not the {sha[:12]} of {name}: "
                                 f"the file was changed after it was judged; {FIX_ROW}")


def best_kept_rows(frame: pd.DataFrame | list[dict]) -> dict[str, dict]:
    """Per target, the row best/ must hold: the last KEEP, or a passing BASELINE before any KEEP
    (a KEEP is only ever faster than the best before it)."""
    rows = _rows(frame) if isinstance(frame, pd.DataFrame) else frame
    best: dict[str, dict] = {}
    for row in sorted((r for r in rows if not pd.isna(r["experiment"])), key=lambda r: int(r["experiment"])):
        kept = row["decision"] == "KEEP" or (row["decision"] == "BASELINE" and row["verdict"] == "PASS"
                                             and not pd.isna(row["median_us"]))
        if kept:
            best[str(row["target"])] = row
    return best


def _check_best(run: Path, rows: list[dict], report: SealReport) -> None:
    from autokernel.search.run import target_slug
    report.best_rows = best_kept_rows(rows)
    slugs = {target_slug(t): t for t in {str(r["target"]) for r in rows}}
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


def _load_state(run: Path, report: SealReport) -> Any:
    """The search's own record (state.json and its journal); None when the run has none."""
    from autokernel.search.journal import JournalError
    from autokernel.search.run import RunDir, RunState
    if not (run / "state.json").is_file():
        return None
    try:
        return RunState.from_json(RunDir(run).journal.load())
    except JournalError as e:
        report.errors.append(f"state.journal: {e}: the records were changed outside the search")
    except ValueError:
        report.errors.append("state.json: not valid JSON")
    return None


def _check_state(state: Any, rows: list[dict], report: SealReport) -> None:
    """The state (the search's own record) against the leaderboard: a row only the leaderboard has,
    or a best the two disagree on, was not written by the search."""
    recorded = {(t.name, h.get("number")): (h.get("row") or {}) for t in state.targets for h in t.history}
    for row in rows:
        if pd.isna(row["experiment"]):
            continue
        key = (str(row["target"]), int(row["experiment"]))
        if key not in recorded:
            report.errors.append(f"leaderboard.tsv: row {key[0]} #{key[1]} is not in state.json's history: "
                                 f"the search never recorded it; {FIX_ROW}")
        elif recorded[key].get(HASH_COLUMN, "") != _row_hash(row) and recorded[key].get(HASH_COLUMN):
            report.errors.append(f"leaderboard.tsv: row {key[0]} #{key[1]} has another {HASH_COLUMN} than "
                                 f"state.json records: {FIX_ROW}")
    for t in state.targets:
        best, row = t.best_experiment, report.best_rows.get(t.name)
        if best is not None and (row is None or int(row["experiment"]) != best):
            found = f"#{int(row['experiment'])}" if row is not None else "none"
            report.errors.append(f"state.json: names experiment #{best} as the best of {t.name}, "
                                 f"leaderboard.tsv's best is {found}: the records were changed outside the search")


def _written_files(state: Any) -> list[tuple[str, str, str]]:
    """Each experiment's verdict, prompt and reply with the hash the search recorded when it wrote
    them (entries from before these hashes were recorded have none)."""
    return [(rel, sha, f"{t.name} #{h.get('number')}") for t in state.targets for h in t.history
            for rel, sha in (h.get("files") or {}).items()]


def _check_written(files: list[tuple[str, str, str]], hashes: list[str], report: SealReport) -> None:
    for (rel, sha, name), actual in zip(files, hashes):
        if actual == MISSING:
            report.errors.append(f"{rel}: missing, yet the search wrote it for {name}: {FIX_FILE}")
        elif actual != sha:
            report.errors.append(f"{rel}: its sha256 {actual[:12]} is not the {sha[:12]} the search wrote for "
                                 f"{name}: the file was changed after it was written; {FIX_FILE}")


def _check_bytecode(run: Path, report: SealReport) -> None:
    for folder in ("kernels", "best"):
        for root, dirs, _ in os.walk(run / folder):
            for cache in sorted(d for d in dirs if d == BYTECODE_DIR):
                rel = (Path(root) / cache).relative_to(run).as_posix()
                report.errors.append(f"{rel}/: compiled bytecode beside the records, "
                                     "which Python may import instead of the checked text: remove the folder")


def check_run(run: str | Path, state: Any = None) -> SealReport:
    """Every record of a run against the hashes its leaderboard rows and its state carry. `state`:
    the run's state already loaded (a resume's), else it is read from the run."""
    run = Path(run)
    report = SealReport(run=run)
    rows = _rows(read(run / LEADERBOARD))
    report.rows = len(rows)
    row_files = _check_rows(rows, report)
    state = state if state is not None else _load_state(run, report)
    written = _written_files(state) if state is not None else []
    base = str(run) + os.sep  # plain strings: a Path per file costs more than reading it
    hashes = hash_files([base + rel for rel, _, _ in row_files + written])  # all at once: the bulk
    _check_row_files(row_files, hashes[:len(row_files)], report)
    _check_best(run, rows, report)
    if state is not None:
        _check_state(state, rows, report)
        _check_written(written, hashes[len(row_files):], report)
    _check_bytecode(run, report)
    return report


def check_at_end(run: Any, state: Any, log: Any = None) -> None:
    """The run's records against the hashes the search recorded, once the search is done: what the
    record guard cannot see while a candidate runs (an old file rewritten in place) is named here,
    and verify, export and --resume will refuse the run."""
    errors = check_run(run.path, state).errors
    if errors and log is not None:
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        log(f"WARNING: records of {run.run_id} changed outside the search: {'; '.join(errors[:5])}{more}; "
            f"`autokernel leaderboard --check {run.path}` lists them")


class SealError(UserError):
    """A run's records do not match the hashes its leaderboard carries."""


def require_sealed(run: str | Path, action: str, *, allow_unsealed: bool = False, state: Any = None) -> SealReport:
    """check_run, raising a UserError that names each bad file (`action` opens its message: "verify
    refused"). `allow_unsealed` lets rows without a hash through (a run written before rows were
    sealed can still be resumed)."""
    report = check_run(run, state)
    if report.errors or (report.unsealed and not allow_unsealed):
        shown = report.lines() if not allow_unsealed else report.errors
        listed = "\n  ".join(shown[:20]) + (f"\n  ... and {len(shown) - 20} more" if len(shown) > 20 else "")
        more = f"; `autokernel leaderboard --check {run}` lists them all" if len(shown) > 20 else ""
        hint = ("these rows come from a run older than sealed records: re-run it with `autokernel optimize`"
                if not report.errors else "re-run the experiments named, or remove their rows") + more
        raise SealError(f"{action}: the records of {Path(run)} do not match what was judged:\n  {listed}", hint)
    return report
