"""The processes these tests start and look for: `autokernel optimize` as a user runs it, the
judge's workers found through /proc, and waiting for killed processes to be gone."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from paths import ROOT

WAIT_S = 300


def user_env(**extra: str) -> dict[str, str]:
    """The environment `autokernel` gets from a user's shell: this one without TRITON_INTERPRET,
    which tests/conftest.py sets for the tests' own processes and a fresh shell does not have (the
    CLI must choose the interpreter itself, before Triton is imported), with the project importable."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **extra}


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for a reaper."""
    fields = _stat(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def parent_of(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def children(pid: int) -> list[int]:
    """The living children of `pid`."""
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and parent_of(int(p.name)) == pid and alive(int(p.name))]


def still_alive(pids, timeout_s: float) -> list[int]:
    """Wait up to `timeout_s` for `pids` to go (SIGKILL is delivered at once, but a process may take
    a moment to go); those still running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def judge_workers(naming: str | Path, parent: int | None = None) -> dict[int, str]:
    """{pid: command line} of the judge's workers whose command line names `naming` (a run folder,
    a kernel file: a worker imports a copy of the file, by the same name, under its own scratch
    folder), only the children of `parent` when given."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
        except OSError:
            continue
        if "harness.workers.worker" in cmdline and str(naming) in cmdline \
                and (parent is None or parent_of(int(entry.name)) == parent):
            found[int(entry.name)] = cmdline
    return found


def end_orphans(run_dir: Path) -> None:
    """kill -9 leaves the judge's worker (its own session) running: end it by pid."""
    for pid in judge_workers(run_dir):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# ------------------------------------------------------------------ `autokernel optimize`
def start(args, runs_dir: Path) -> subprocess.Popen:
    """`autokernel optimize` as a terminal's foreground job starts it: with Ctrl-C's default action.
    A suite started in the background by a non-interactive shell (`pytest &`) inherits SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler in the run: Ctrl-C would not
    reach it, as the shell intends for background jobs. Its temporary folders go beside RUNS_DIR
    (killed_scratch)."""
    env = user_env(TMPDIR=killed_scratch(runs_dir.parent))
    return subprocess.Popen([sys.executable, "-m", "autokernel", "optimize", *args, "--runs-dir", str(runs_dir),
                             "--plain"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_foreground_signals)


def killed_scratch(folder: Path) -> str:
    """TMPDIR for a judging process a test may kill -9: a process killed so cannot remove its
    scratch folders (ak-judge-*, ak-zygote-*, ...), so they go under the test's own folder, which
    pytest removes, instead of piling up in /tmp."""
    scratch = Path(folder) / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    return str(scratch)


def _foreground_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def only_run(runs_dir: Path) -> Path | None:
    folders = [p for p in runs_dir.iterdir() if p.is_dir()] if runs_dir.exists() else []
    return folders[0] if len(folders) == 1 else None


def wait_for(proc: subprocess.Popen, runs_dir: Path, ready, what: str) -> Path:
    """Wait until `ready(run_folder)` holds; the run's folder."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        run = only_run(runs_dir)
        if run is not None and ready(run):
            return run
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"optimize exited {proc.returncode} before {what}:\n{out}\n{err}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"no {what} within {WAIT_S} s")


def interrupt(proc: subprocess.Popen) -> None:
    """Ctrl-C (SIGINT) to a process still running. One that already ended (the machine did not
    schedule the test between seeing the judge and pressing Ctrl-C) fails here, saying so, rather
    than as a Ctrl-C the run ignored."""
    if proc.poll() is not None:
        out, err = proc.communicate()
        pytest.fail(f"optimize had already exited {proc.returncode} when Ctrl-C was to be sent:\n{out}\n{err}")
    os.kill(proc.pid, signal.SIGINT)


def judging(number: int):
    """Ready when the judge's worker is running on experiment `number`."""
    def ready(run: Path) -> bool:
        return any(f"exp_{number:04d}.py" in cmd for cmd in judge_workers(run).values())
    return ready
