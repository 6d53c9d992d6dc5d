"""An OS sandbox for the processes that run candidate code: Linux Landlock, through ctypes.

`confine(writable)` restricts the calling process (and everything it starts later) for good:
reads and execution anywhere, writes only beneath the folders in `writable` and to the device files
(a GPU run opens /dev/nvidia*), and where the kernel's Landlock ABI allows it (4 and later) no TCP
connect or bind at all; from ABI 6 signals and abstract unix sockets stop at the sandbox's edge, so a
candidate cannot kill or talk to its judge. The run folder, the project, the home folder and the
network are therefore out of reach of a candidate, whatever Python it runs.

What it returns is what was enforced, for the verdict: {"kind": "landlock", "abi": N, "writes":
[...], "network": "denied"} or {"kind": "none", "reason": ...}. Landlock restricts the calling thread
and its future threads and children; threads started earlier (torch's CPU pool) run only torch's
own native code. UDP and pathname unix sockets are not covered by Landlock ABI 7.
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys

# syscall numbers: the same in the generic table (aarch64) and on x86_64
SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446
CREATE_RULESET_VERSION = 1 << 0
RULE_PATH_BENEATH = 1
PR_SET_NO_NEW_PRIVS = 38

FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_WRITE_DIR_BITS = sum(1 << b for b in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # the kernel's struct is packed: 12 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def abi_version() -> int:
    """The kernel's Landlock ABI, or 0 where Landlock is missing, disabled or filtered out."""
    if platform.system() != "Linux":
        return 0
    try:
        libc = _libc()
        libc.syscall.restype = ctypes.c_long
        version = libc.syscall(ctypes.c_long(SYS_CREATE_RULESET), None, ctypes.c_size_t(0),
                               ctypes.c_uint32(CREATE_RULESET_VERSION))
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def handled_fs(abi: int) -> int:
    bits = READ_ONLY | FS_WRITE_FILE | FS_WRITE_DIR_BITS
    if abi >= 2:
        bits |= FS_REFER
    if abi >= 3:
        bits |= FS_TRUNCATE
    if abi >= 5:
        bits |= FS_IOCTL_DEV
    return bits


def _errno_text(what: str) -> str:
    err = ctypes.get_errno()
    return f"{what} failed: {os.strerror(err)} (errno {err})"


def _add_path(libc, ruleset_fd: int, path: str, access: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        rule = _PathBeneath(access, fd)
        if libc.syscall(ctypes.c_long(SYS_ADD_RULE), ctypes.c_int(ruleset_fd), ctypes.c_int(RULE_PATH_BENEATH),
                        ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(_errno_text(f"landlock_add_rule({path})"))
    finally:
        os.close(fd)


def confine(writable: list[str]) -> dict:
    """Restrict this process for the rest of its life; return what is now enforced."""
    abi = abi_version()
    if abi < 1:
        return {"kind": "none", "reason": "Landlock is not available in this kernel or container"}
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    fs = handled_fs(abi)
    attr = _RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset_fd = libc.syscall(ctypes.c_long(SYS_CREATE_RULESET), ctypes.byref(attr), ctypes.c_size_t(size),
                              ctypes.c_uint32(0))
    if ruleset_fd < 0:
        return {"kind": "none", "reason": _errno_text("landlock_create_ruleset")}
    writes = sorted({os.path.realpath(p) for p in writable if os.path.isdir(p)})
    try:
        _add_path(libc, ruleset_fd, "/", READ_ONLY)
        device = READ_ONLY | FS_WRITE_FILE | (fs & (FS_TRUNCATE | FS_IOCTL_DEV))
        _add_path(libc, ruleset_fd, "/dev", device)  # GPU device files, /dev/null
        if os.path.isdir("/dev/shm"):
            writes.append("/dev/shm")  # shared memory of torch and the CUDA driver, not a file anyone reads
        for path in writes:
            _add_path(libc, ruleset_fd, path, fs)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return {"kind": "none", "reason": _errno_text("prctl(PR_SET_NO_NEW_PRIVS)")}
        if libc.syscall(ctypes.c_long(SYS_RESTRICT_SELF), ctypes.c_int(ruleset_fd), ctypes.c_uint32(0)) != 0:
            return {"kind": "none", "reason": _errno_text("landlock_restrict_self")}
    except OSError as e:
        return {"kind": "none", "reason": str(e)}
    finally:
        os.close(ruleset_fd)
    return {"kind": "landlock", "abi": abi, "writes": writes + ["/dev (device files)"],
            "network": "denied" if abi >= 4 else "open: Landlock ABI < 4 cannot restrict TCP",
            "signals": "scoped" if abi >= 6 else "open"}


def not_requested() -> dict:
    return {"kind": "none", "reason": "switched off on request (--no-sandbox)"}


def warn_if_open(state: dict, who: str) -> None:
    """No sandbox is said loudly, on stderr, every time."""
    if state.get("kind") != "landlock":
        print(f"WARNING: {who} runs candidate code WITHOUT an OS sandbox: {state.get('reason')}",
              file=sys.stderr)


def host_support() -> dict:
    """What a sandboxed child on this machine will get, for a run's config.json (said before any
    candidate runs, so a run without a sandbox says so from its first line)."""
    abi = abi_version()
    if abi < 1:
        return {"kind": "none", "reason": "Landlock is not available in this kernel or container"}
    return {"kind": "landlock", "abi": abi, "network": "denied" if abi >= 4 else "open: Landlock ABI < 4"}
