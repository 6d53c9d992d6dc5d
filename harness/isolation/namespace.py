"""A fresh user and network namespace for a process that will run candidate code.

Inside a new network namespace there is only a loopback interface, and it is down: no address on
the machine, loopback included, can be reached by any protocol. The user namespace is what lets an
unprivileged process create it; the process keeps its own user and group ids (mapped to
themselves), so files it writes belong to the user as before.

The kernel creates a user namespace only for a single-threaded process, so this runs first thing
in the child, before torch or a GPU driver starts any thread. It is not used with a GPU: the CUDA
driver is not run inside a fresh user namespace by this project (socket(2) is refused there by
harness/isolation/socket_filter.py all the same).
"""
from __future__ import annotations

import ctypes
import os
import platform

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000


def isolate() -> dict:
    """Move this process into a fresh user+network namespace; what holds, for the verdict."""
    if platform.system() != "Linux":
        return {"namespace": f"not created: {platform.system()} has no network namespaces"}
    threads = _threads()
    if threads > 1:
        return {"namespace": f"not created: the process already runs {threads} threads"}
    uid, gid = os.getuid(), os.getgid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            return {"namespace": f"not created: unshare: {os.strerror(err)} (errno {err})"}
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    except OSError as e:
        return {"namespace": f"created, but the ids could not be mapped: {e}"}
    return {"namespace": "fresh user and network namespace: no interface is up, loopback included"}


def isolate_for(device: str | None) -> dict:
    """isolate() for a process about to run on `device` (None: a GPU if the machine has one)."""
    gpu = device == "cuda" or (device is None and os.path.exists("/dev/nvidiactl"))
    return not_used("a GPU process keeps the host's namespace (its sockets are filtered)") if gpu else isolate()


def not_used(why: str) -> dict:
    return {"namespace": f"not created: {why}"}


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)
