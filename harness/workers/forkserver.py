"""The judge's side of the pre-imported worker (harness/workers/zygote.py): start it, ask it for a child,
wait with a deadline, kill the child's process group, exactly as run_isolated does for a spawn.

A zygote serves one candidate at a time, so judges running in parallel (the search's slots) each
take their own from a pool keyed by the worker's environment (device, pinned GPU): a variable read
at import, such as TRITON_INTERPRET, can never differ between a zygote and the child it forks.
Anything wrong with a zygote (it will not start, it died, it answered nonsense) makes `run` return
None, and the caller spawns `python -m harness.workers.worker` as before.

    with judge_session():     # autokernel optimize / bench --suite: every judge call inside reuses
        judge(...)            # the zygotes; AUTOKERNEL_JUDGE_FORK=0 turns them off

A session that ends hands its zygotes (alive, idle, at most KEPT of them) to the next session of the
same process, which takes one whose environment is the one it needs: starting a zygote costs seconds
of imports, and a judge() called outside a session (a session of its own) would otherwise pay them
every call. A zygote never runs a candidate itself (each child is a fresh fork of it), so nothing a
candidate did can reach a later session's workers. They are closed when the process exits.
"""
from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness.isolation.process import ChildResult, _kill_group, _live_groups, _read
from harness.workers.zygote import HOME_PREFIX, TITLE_ROOM, TRITON_KEY_ENV, remove_home

START_TIMEOUT_S = 300.0  # importing torch and triton on a loaded machine
# set in the child after the fork, never read at import: the scratch folder and the judgement's
# own compiler caches (harness/isolation/sandbox.py's private_caches); inductor's cache folder,
# which torch writes into the environment of any process that ran torch.compile (a judging process
# that compiled a baseline in its own process would start new zygotes from then on); the static
# check's switch and our cache folder, read when a judgement runs; and pytest's name for the test
# running now, which changes with every test of a run
PER_CALL_ENV = ("TMPDIR", "TRITON_CACHE_DIR", "AUTOKERNEL_BUILD_CACHE", "TORCH_EXTENSIONS_DIR",
                "TORCHINDUCTOR_CACHE_DIR", "AUTOKERNEL_STATIC_CHECK", "AUTOKERNEL_CACHE_DIR",
                "PYTEST_CURRENT_TEST")
KEPT = 4  # idle zygotes a process keeps between sessions: each holds torch and triton imported
ZYGOTE_ARGV = ["-m", "harness.workers.zygote", " " * TITLE_ROOM]  # blank room for each child's own command line


# Triton's version key from this process's first zygote, handed to the later ones (zygote.preload)
_triton_key: str | None = None


class ZygoteError(Exception):
    """The zygote cannot serve this request; the caller falls back to a spawned worker."""


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get("AUTOKERNEL_JUDGE_FORK", "1") != "0"


def env_key(env: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in env.items() if k not in PER_CALL_ENV))


_kept: list[tuple[tuple, "Zygote"]] = []  # idle zygotes of ended sessions, oldest first, by kept_key
_kept_lock = threading.Lock()


def _kept_key(key: tuple) -> tuple:
    """A zygote serves a later session only where it was started the way that session would start one."""
    return key, sys.executable, tuple(ZYGOTE_ARGV)


def _reuse(key: tuple) -> "Zygote | None":
    with _kept_lock:
        for i in range(len(_kept) - 1, -1, -1):
            if _kept[i][0] == _kept_key(key):
                zygote = _kept.pop(i)[1]
                if zygote.alive():
                    return zygote
                zygote.close()
    return None


def _keep(zygote: "Zygote") -> None:
    """Keep an idle zygote for a later session; the oldest beyond KEPT are closed."""
    with _kept_lock:
        _kept.append((_kept_key(env_key(zygote.env)), zygote))
        surplus = _kept[:-KEPT] if len(_kept) > KEPT else []
        del _kept[:len(surplus)]
    for _, old in surplus:
        old.close()


@atexit.register
def close_kept() -> None:
    with _kept_lock:
        kept = [z for _, z in _kept]
        _kept.clear()
    for zygote in kept:
        zygote.close()


class Zygote:
    """One `python -m harness.workers.zygote` process and its pipes."""

    def __init__(self, env: dict[str, str]):
        self.env = {k: v for k, v in env.items() if k not in PER_CALL_ENV}
        self._home = tempfile.mkdtemp(prefix=HOME_PREFIX)
        self._log = open(Path(self._home, "stderr"), "wb")
        known = {TRITON_KEY_ENV: _triton_key} if _triton_key else {}
        self.proc = subprocess.Popen([sys.executable, *ZYGOTE_ARGV], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env={**self.env, **known},
                                     cwd=self._home, start_new_session=True)
        self.ready = False
        self._pending = b""

    def _line(self, timeout_s: float | None) -> dict:
        """The next reply, or ZygoteError when none comes in time or the zygote is gone. Read from
        the raw pipe with our own buffer: two replies can arrive in one read (a child that exits at
        once), and a buffered reader would hide the second from select()."""
        deadline = None if timeout_s is None else time.monotonic() + max(timeout_s, 0.0)
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            wait = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            readable, _, _ = select.select([fd], [], [], wait)
            if not readable:
                raise TimeoutError
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ZygoteError(f"the zygote exited: {_read(Path(self._home, 'stderr'))[-2000:]}")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        reply = json.loads(line)
        if "error" in reply:
            raise ZygoteError(reply["error"])
        return reply

    def start(self) -> None:
        global _triton_key
        if not self.ready:
            try:
                key = self._line(START_TIMEOUT_S).get("triton_key")
            except TimeoutError:
                raise ZygoteError("the zygote did not start in time") from None
            if isinstance(key, str) and key:  # told before any child exists: the judge's own figure
                _triton_key = key
            self.ready = True

    def run(self, argv: list[str], timeout_s: float, env: dict[str, str], cwd: str | Path,
            module: str = "harness.workers.worker") -> ChildResult:
        """One worker, forked: argv are the arguments of `python -m MODULE`."""
        self.start()
        with tempfile.TemporaryDirectory(prefix="ak-child-") as tmp:
            out_path, err_path = Path(tmp, "stdout"), Path(tmp, "stderr")
            request = {"module": module, "argv": argv, "env": env, "cwd": str(cwd), "stdout": str(out_path),
                       "stderr": str(err_path)}
            start = time.monotonic()
            try:
                self.proc.stdin.write((json.dumps(request) + "\n").encode())
                self.proc.stdin.flush()
            except OSError as e:
                raise ZygoteError(f"the zygote is gone: {e}") from None
            pid = self._line(60.0)["pid"]
            _live_groups.add(pid)
            timed_out, returncode = False, None
            try:
                try:
                    returncode = self._line(max(timeout_s - (time.monotonic() - start), 0.0))["returncode"]
                except TimeoutError:
                    timed_out = True
                    _kill_group(pid)
                    returncode = self._line(60.0)["returncode"]
            except BaseException:  # Ctrl-C, or the zygote lost: the child goes first
                _kill_group(pid)
                self.close()
                raise
            finally:
                _kill_group(pid)  # whatever the child left in its group dies with it
                _live_groups.discard(pid)
            return ChildResult(returncode, timed_out, time.monotonic() - start, _read(out_path), _read(err_path))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # EOF: the zygote kills its children's groups and exits
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc.pid)
            self.proc.wait()
        self._log.close()
        remove_home(self._home)


class ZygotePool:
    """Idle zygotes by environment; a judge takes one for a candidate and gives it back."""

    def __init__(self):
        self._idle: dict[tuple, list[Zygote]] = {}
        self._all: list[Zygote] = []
        self._lock = threading.Lock()
        self.forked = self.fallbacks = 0  # for the benchmark and the tests

    def run(self, argv: list[str], timeout_s: float, env: dict[str, str], cwd: str | Path,
            module: str = "harness.workers.worker") -> ChildResult | None:
        """The forked worker's result, or None when no zygote could serve (spawn instead)."""
        key = env_key(env)
        zygote = self._take(key, env)
        if zygote is None:
            return None
        try:
            result = zygote.run(argv, timeout_s, env, cwd, module)
        except ZygoteError as e:
            print(f"autokernel: the pre-imported judge worker failed ({str(e)[:300]}); spawning one instead",
                  file=sys.stderr)
            zygote.close()
            with self._lock:
                self.fallbacks += 1
            return None
        with self._lock:
            self.forked += 1
            self._idle.setdefault(key, []).append(zygote)
        return result

    def _take(self, key: tuple, env: dict[str, str]) -> Zygote | None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            while idle:
                zygote = idle.pop()
                if zygote.alive():
                    return zygote
            zygote = _reuse(key)  # an earlier session's, idle
            if zygote is None:
                try:
                    zygote = Zygote(env)
                except OSError:
                    return None
            self._all.append(zygote)
            return zygote

    def close(self) -> None:
        """The session ends: its idle zygotes are kept for the next session (see the module's note),
        any still serving (a judge interrupted) are closed."""
        with self._lock:
            idle = {id(z) for zygotes in self._idle.values() for z in zygotes}
            for zygote in self._all:
                if id(zygote) in idle and zygote.alive() and zygote.ready:
                    _keep(zygote)
                else:
                    zygote.close()
            self._all.clear()
            self._idle.clear()
