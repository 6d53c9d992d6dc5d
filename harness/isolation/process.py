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


def child_env(device: str, visible_devices: str | None = None) -> dict[str, str]:
    """The environment of a judge's child: no secrets, the harness importable, and on the CPU the
    Triton interpreter switched on before anything can be jitted. `visible_devices` (a CUDA index)
    pins the child to one GPU of several: the search's slot for that device passes it."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding harness/
    extra = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
             "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    # Triton 3.9 warns on every compile unless the (unchanged) FMA-contraction default is explicit
    extra["TRITON_DEFAULT_FP_FUSION"] = os.environ.get("TRITON_DEFAULT_FP_FUSION", "1")
    if device == "cpu":
        extra["TRITON_INTERPRET"] = "1"  # before anything is jitted: the worker imports triton after this
        # the interpreter's tl.dot runs on numpy's BLAS, whose spinning threads fight a small CPU
        extra.setdefault("OPENBLAS_NUM_THREADS", os.environ.get("OPENBLAS_NUM_THREADS", "1"))
        # and PyTorch's OpenMP threads likewise: the interpreted kernel runs on one thread, so the
        # eager baseline it is ranked against runs on one too
        extra.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    if visible_devices is not None:  # the child sees that GPU as cuda:0
        extra["CUDA_VISIBLE_DEVICES"] = str(visible_devices)
    return scrubbed_env(extra)


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
