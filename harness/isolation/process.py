"""Run untrusted code in a subprocess that cannot take the caller down.

Each child gets its own process group (so a timeout or Ctrl-C kills everything it spawned), a
wall-clock limit, an environment with no secrets in it, and its output sent to files (a chatty
child cannot fill a pipe and deadlock us). What it printed is kept, tail first, for the log.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Substrings of variable names that hold credentials. A candidate kernel is LLM-written code: it
# must never see the key that pays for the LLM, nor any other token in the user's shell.
SECRET_MARKERS = ("API_KEY", "APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL",
                  "ACCESS_KEY", "PRIVATE_KEY", "AUTH")

_live_groups: set[int] = set()


def is_secret(name: str) -> bool:
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


def scrubbed_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not is_secret(k)}
    env.update(extra or {})
    return env


@dataclass
class ChildResult:
    returncode: int | None
    timed_out: bool
    seconds: float
    stdout: str
    stderr: str

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    def stderr_tail(self, lines: int = 25) -> str:
        return "\n".join(self.stderr.rstrip().splitlines()[-lines:])


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def kill_all() -> None:
    """Kill every child process group still running (Ctrl-C, SIGTERM, shutdown)."""
    for pgid in list(_live_groups):
        _kill_group(pgid)
        _live_groups.discard(pgid)


def _read(path: Path, limit: int = 200_000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def run_isolated(argv: list[str], timeout_s: float, env: dict[str, str] | None = None,
                 cwd: str | Path | None = None) -> ChildResult:
    """Run argv in a new session; kill its whole process group at the deadline."""
    with tempfile.TemporaryDirectory(prefix="ak-child-") as tmp:
        out_path, err_path = Path(tmp, "stdout"), Path(tmp, "stderr")
        start = time.monotonic()
        with open(out_path, "wb") as out, open(err_path, "wb") as errf:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=errf,
                                    env=scrubbed_env() if env is None else env, cwd=cwd,
                                    start_new_session=True)
            _live_groups.add(proc.pid)
            timed_out = False
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                proc.wait()
            except BaseException:  # Ctrl-C or SIGTERM in the caller: the child goes first
                _kill_group(proc.pid)
                proc.wait()
                raise
            finally:
                # whatever the child left behind in its group (grandchildren) dies with it
                _kill_group(proc.pid)
                _live_groups.discard(proc.pid)
        return ChildResult(proc.returncode, timed_out, time.monotonic() - start,
                           _read(out_path), _read(err_path))
