"""No sockets at all: a seccomp filter that makes socket(2) fail for every address family.

Landlock (harness/isolation/sandbox.py) denies TCP connect and bind, but not UDP datagrams nor connecting to a
pathname unix socket, and a fresh network namespace (harness/isolation/namespace.py) leaves pathname unix
sockets open too. So the processes that run candidate code also install this filter: socket(2)
returns EACCES whatever the family (IPv4, IPv6, unix, netlink, packet...), io_uring_setup(2) too
(io_uring can open sockets without calling socket(2)), and so does every syscall made through
another architecture's table (32-bit and x32 entry points, where the numbers differ). socketpair(2)
still works: a connected pair reaches nobody. No kernel, driver or library the judge relies on
opens a socket once the worker runs; a CUDA setup that talks to an MPS daemon would need one.

The filter is applied to every thread of the process (TSYNC) and inherited by every child.
"""
from __future__ import annotations

import ctypes
import errno
import platform

# classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000
SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 1, 1
PR_SET_NO_NEW_PRIVS = 38
OFFSET_NR, OFFSET_ARCH = 0, 4  # struct seccomp_data
X32_SYSCALL_BIT = 0x40000000

# machine -> (audit arch, seccomp syscall, socket, io_uring_setup)
ARCHES = {"x86_64": (0xC000003E, 317, 41, 425), "aarch64": (0xC00000B7, 277, 198, 425)}


class _Instruction(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


def program(machine: str) -> list[tuple[int, int, int, int]]:
    """The filter for `machine`, as (code, jt, jf, k) instructions."""
    arch, _, socket_nr, io_uring_nr = ARCHES[machine]
    deny = RET_ERRNO | errno.EACCES
    return [
        (LD_W_ABS, 0, 0, OFFSET_ARCH),
        (JEQ_K, 1, 0, arch),              # another architecture's table: deny everything it is asked
        (RET_K, 0, 0, deny),
        (LD_W_ABS, 0, 0, OFFSET_NR),
        (JGE_K, 3, 0, X32_SYSCALL_BIT),   # x32 numbers: deny
        (JEQ_K, 2, 0, socket_nr),
        (JEQ_K, 1, 0, io_uring_nr),
        (RET_K, 0, 0, RET_ALLOW),
        (RET_K, 0, 0, deny),
    ]


def install() -> dict:
    """Apply the filter to this process and its future children; what holds, for the verdict."""
    machine = platform.machine()
    if platform.system() != "Linux" or machine not in ARCHES:
        return {"socket_filter": f"not installed: no seccomp filter for {platform.system()} {machine}"}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as e:
        return {"socket_filter": f"not installed: {e}"}
    libc.syscall.restype = ctypes.c_long
    code = program(machine)
    array = (_Instruction * len(code))(*[_Instruction(*i) for i in code])
    prog = _Program(len(code), ctypes.cast(array, ctypes.POINTER(_Instruction)))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return {"socket_filter": f"not installed: prctl(PR_SET_NO_NEW_PRIVS): {_errno()}"}
    result = libc.syscall(ctypes.c_long(ARCHES[machine][1]), ctypes.c_uint(SECCOMP_SET_MODE_FILTER),
                          ctypes.c_uint(SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    if result != 0:
        why = _errno() if result < 0 else f"thread {result} could not take the filter"
        return {"socket_filter": f"not installed: seccomp: {why}"}
    return {"socket_filter": "socket(2) and io_uring refused for every address family (seccomp, all threads)"}


def _errno() -> str:
    err = ctypes.get_errno()
    return f"{errno.errorcode.get(err, err)} ({err})"
