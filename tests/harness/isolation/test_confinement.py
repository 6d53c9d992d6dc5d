"""The OS layers on their own, without the audit hook in front of them: a child process confined as
the judge's worker is (a fresh network namespace first, then Landlock and the socket filter) tries,
in native code where Python's own calls would be audited, to send by UDP, connect a unix socket,
connect by TCP, and read the home folder, another run and the judge's environment. Every attempt
fails; what a kernel needs (the Python installation, a lazy import, its scratch folder) still works."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.isolation.sandbox import abi_version
from paths import ROOT

pytestmark = pytest.mark.skipif(abi_version() < 4, reason="needs Landlock ABI 4 or later (file and TCP rules)")

CHILD = r'''
import json, os, socket, sys
from harness.isolation import namespace, sandbox
network = namespace.isolate() if sys.argv[1] == "namespace" else None
state = sandbox.confine([sys.argv[2]], namespace=network)
targets = json.loads(sys.argv[3])
tried = {}

def attempt(name, fn):
    try:
        fn()
        tried[name] = "done"
    except OSError as e:
        tried[name] = f"{type(e).__name__}: {e.strerror or e}"

attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", targets["udp"])))
attempt("unix", lambda: socket.socket(socket.AF_UNIX).connect(targets["unix"]))
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", targets["tcp"]), timeout=3))
for name in ("secret", "run_record", "parent_environ"):
    attempt(name, lambda: open(targets[name], "rb").read())
attempt("python_env", lambda: open(os.__file__, "rb").read())
attempt("lazy_import", lambda: __import__("wave"))
attempt("scratch_write", lambda: open(os.path.join(sys.argv[2], "x"), "w").write("ok"))
print(json.dumps({"tried": tried, "state": state}))
'''


def _confined_child(tmp_path: Path, isolate: str) -> dict:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    tcp = socket.create_server(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "listen.sock"))
    unix.listen(1)
    for s in (udp, tcp, unix):
        s.setblocking(False)
    secret = tmp_path / "home" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("secret")
    record = tmp_path / "runs" / "other" / "leaderboard.tsv"
    record.parent.mkdir(parents=True)
    record.write_text("experiment\n")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    targets = {"udp": udp.getsockname()[1], "tcp": tcp.getsockname()[1], "unix": str(tmp_path / "listen.sock"),
               "secret": str(secret), "run_record": str(record), "parent_environ": f"/proc/{os.getpid()}/environ"}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, isolate, str(scratch), json.dumps(targets)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=scratch)
    assert out.returncode == 0, out.stderr
    arrived = []
    for receive in (lambda: udp.recvfrom(100), tcp.accept, unix.accept):
        try:
            arrived.append(receive())
        except (BlockingIOError, OSError):
            pass
    for s in (udp, tcp, unix):
        s.close()
    return {**json.loads(out.stdout), "arrived": arrived}


@pytest.mark.parametrize("isolate", ["namespace", "no-namespace"])
def test_native_attempts_fail_under_the_os_layers_alone(tmp_path, isolate):
    result = _confined_child(tmp_path, isolate)
    tried, state = result["tried"], result["state"]
    assert result["arrived"] == []
    for name in ("udp", "unix", "tcp", "secret", "run_record", "parent_environ"):
        assert tried[name].startswith("PermissionError") or "unreachable" in tried[name], (name, tried[name])
    for name in ("python_env", "lazy_import", "scratch_write"):
        assert tried[name] == "done", (name, tried[name])
    assert state["network"] == "denied" and state["kind"] == "landlock"
    if isolate == "namespace":
        assert state["layers"]["namespace"].startswith("fresh user and network namespace")


def test_the_socket_filter_holds_without_landlock(tmp_path):
    """Each layer stands alone: socket(2) is refused by seccomp in a process Landlock never touched."""
    code = ("import socket, json\nfrom harness.isolation import socket_filter\nstate = socket_filter.install()\n"
            "try:\n    socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n    print(json.dumps([state, 'open']))\n"
            "except OSError as e:\n    print(json.dumps([state, e.strerror]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    state, outcome = json.loads(out.stdout)
    assert state["socket_filter"].startswith("socket(2)") and outcome == "Permission denied"
