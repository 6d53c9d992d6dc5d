"""An OS sandbox for the processes that run candidate code: Linux Landlock, through ctypes, plus a
seccomp filter on socket(2) (harness/isolation/socket_filter.py) and, where it can be made, a fresh network
namespace (harness/isolation/namespace.py, entered by the process itself before it starts any thread).

`confine(writable, readable)` restricts the calling process (and everything it starts later) for
good:
- reads and execution only beneath `read_roots()`: the Python installation and every package the
  process has imported (the project's own packages among them, never the project folder as a
  whole), the system folders (/usr, /lib*, /bin, /sbin, /etc), the CUDA toolkit, /proc/self and a
  few /proc files a runtime reads, /sys, /dev, plus the folders and files the caller adds; writes
  only beneath the folders in `writable` (scratch and the compiler caches) and to device files. So
  the user's home (beyond the handed caches), the run folder, other runs and other processes'
  /proc entries (the judge's environment, with its API key) can be neither read nor written;
- where the kernel's Landlock ABI allows it (4 and later), no TCP connect or bind; from ABI 6,
  signals and abstract unix sockets stop at the sandbox's edge, so a candidate cannot kill or talk
  to its judge;
- socket(2) fails for every address family (UDP and pathname unix sockets included), whether or
  not Landlock is available.

What it returns is what was enforced, for the verdict: {"kind": "landlock", "abi": N, "writes":
[...], "reads": [...], "network": "denied", "layers": {...}} or {"kind": "none", "reason": ...,
"network": ..., "layers": {...}}. Landlock restricts the calling thread and its future threads and
children; threads started earlier (torch's CPU pool) run only torch's own native code. The socket
filter covers every thread.
"""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import sys
from pathlib import Path

SYSTEM_READS = ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc")
# what a runtime reads of /proc beyond its own entry: CPU and memory facts, kernel tunables, the
# GPU driver's parameters; never another process's entry (the judge's environment holds its keys)
PROC_READS = ("/proc/self", "/proc/thread-self", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat",
              "/proc/sys", "/proc/driver", "/sys")

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
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV  # the rest need a folder


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
    if not os.path.isdir(path):
        access &= FILE_RIGHTS
    try:
        rule = _PathBeneath(access, fd)
        if libc.syscall(ctypes.c_long(SYS_ADD_RULE), ctypes.c_int(ruleset_fd), ctypes.c_int(RULE_PATH_BENEATH),
                        ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(_errno_text(f"landlock_add_rule({path})"))
    finally:
        os.close(fd)


def read_roots(extra=()) -> list[str]:
    """What a confined process may read: the Python installation, the folders of the packages it
    has imported, the system folders, the CUDA toolkit, its own /proc entry, /sys, /dev, `extra`."""
    import site
    import sysconfig
    roots = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             *(v for k, v in sysconfig.get_paths().items() if k != "data"), *site.getsitepackages()]
    roots += _package_roots()
    roots += [*SYSTEM_READS, *PROC_READS, "/dev", *_cuda_roots(), *_driver_roots(), *_compiler_roots(), *extra]
    real = {os.path.realpath(p) if not p.startswith("/proc/") else p for p in roots if p and os.path.exists(p)}
    # one rule per folder: what lies beneath another root is readable already
    return sorted(p for p in real if not any(p.startswith(other.rstrip("/") + "/") for other in real if other != p))


def _package_roots() -> list[str]:
    """The folder of every top-level package imported so far (a single-file module: the file), so
    that the project's own packages are readable without the project folder and its runs/."""
    out = set()
    for name, module in list(sys.modules.items()):
        if "." in name or name == "__main__":
            continue
        path = getattr(module, "__file__", None)
        if path and os.path.basename(path).startswith("__init__."):
            out.add(os.path.dirname(path))
        elif path:
            out.add(path)
        else:  # a namespace package: each of its folders
            out.update(p for p in getattr(module, "__path__", None) or [] if isinstance(p, str))
    return sorted(out)


def _compiler_roots() -> list[str]:
    """The installation of each C/C++ compiler on PATH (or named by CC/CXX) that lies outside the
    system folders: Inductor and Triton build their host code with it (an H200 image keeps gcc in
    /opt/gcc, and torch.compile inside verify's sandbox failed there with "Permission denied")."""
    out = []
    for name in (os.environ.get("CC"), os.environ.get("CXX"), "cc", "gcc", "c++", "g++", "clang"):
        found = shutil.which(name) if name else None
        if not found:
            continue
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(found)))  # <prefix>/bin/gcc
        if prefix not in ("/", "") and prefix not in out:
            out.append(prefix)
    return out


def _driver_roots() -> list[str]:
    """The folders of the CUDA driver library where it lies outside the system folders, found the
    way Triton finds it (TRITON_LIBCUDA_PATH, else the folders of LD_LIBRARY_PATH that hold
    libcuda.so.1): Triton links its launcher support against it and loads it lazily, at the first
    launch, under the rules (a container's driver often lies in /usr/local/nvidia/lib64 or /opt)."""
    named = os.environ.get("TRITON_LIBCUDA_PATH")
    if named:
        return [named]
    folders = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    return [p for p in folders if os.path.exists(os.path.join(p, "libcuda.so.1"))]


def _cuda_roots() -> list[str]:
    nvcc = shutil.which("nvcc")
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
             os.path.dirname(os.path.dirname(os.path.realpath(nvcc))) if nvcc else None]
    return [h for h in homes if h and h != "/"]


def confine(writable: list[str], readable=(), namespace: dict | None = None) -> dict:
    """Restrict this process for the rest of its life; return what is now enforced. `namespace` is
    what harness/isolation/namespace.py achieved earlier in this process, to be stated with the rest."""
    from harness.isolation import socket_filter
    layers = {**(namespace or {"namespace": "not requested"})}
    state = _landlock(writable, readable)
    layers.update(socket_filter.install())  # after Landlock: it sets no_new_privs, which seccomp needs
    if state["kind"] == "landlock":
        layers["landlock_tcp"] = state.pop("tcp")
    state["layers"] = layers
    state["network"] = network_verdict(layers)
    return state


def network_verdict(layers: dict) -> str:
    if layers.get("socket_filter", "").startswith("socket(2)"):
        return "denied"
    held = [k for k, v in layers.items() if not str(v).startswith("not ")]
    return ("OPEN: no socket filter; only " + ", ".join(held) + " hold") if held else "OPEN: no layer holds"


def _landlock(writable: list[str], readable) -> dict:
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
    reads = [p for p in read_roots(readable) if p != "/dev"]
    try:
        for path in reads:
            _add_path(libc, ruleset_fd, path, READ_ONLY)
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
    return {"kind": "landlock", "abi": abi, "writes": writes + ["/dev (device files)"], "reads": reads + ["/dev"],
            "tcp": "connect and bind denied" if abi >= 4 else "not restricted: Landlock ABI < 4",
            "signals": "scoped" if abi >= 6 else "open"}


def not_requested() -> dict:
    return {"kind": "none", "reason": "switched off on request (--no-sandbox)", "network": "OPEN: not requested"}


def warn_if_open(state: dict, who: str) -> None:
    """A missing layer is said loudly, on stderr, every time."""
    if state.get("kind") != "landlock":
        print(f"WARNING: {who} runs candidate code WITHOUT an OS sandbox: {state.get('reason')}",
              file=sys.stderr)
    elif state.get("network", "denied") != "denied":
        print(f"WARNING: {who} runs candidate code with the network {state['network']}", file=sys.stderr)


def host_support() -> dict:
    """What a sandboxed child on this machine will get, for a run's config.json (said before any
    candidate runs, so a run without a sandbox says so from its first line)."""
    abi = abi_version()
    network = "denied (seccomp on socket(2) for every family; a fresh network namespace on the CPU)"
    if abi < 1:
        return {"kind": "none", "reason": "Landlock is not available in this kernel or container", "network": network}
    return {"kind": "landlock", "abi": abi, "reads": "confined", "network": network}


def import_triton() -> None:
    """For a process that will run winners under the rules (verify's child, the package's
    selftest): Triton's first import reads every installed package's entry points (its backends),
    so it is imported here, before the rules, as the judge's worker does, not from inside a
    winner's import under them. Call it once Triton's mode is set (TRITON_INTERPRET on a CPU): the
    import makes the @triton.jit functions of Triton's own library in that mode, for good."""
    try:
        import triton  # noqa: F401
    except ImportError:  # CUDA C++ winners alone; a Triton winner then fails on its own import
        pass


# the compiler caches of a process that runs candidate code, each the judgement's own
CACHE_VARIABLES = {"TRITON_CACHE_DIR": "triton", "AUTOKERNEL_BUILD_CACHE": "cuda", "TORCH_EXTENSIONS_DIR": "extensions"}


def private_caches(root: Path) -> dict[str, str]:
    """Compiler caches of one judgement (or one verify, one selftest) beneath `root`, its scratch
    folder, as the environment variables that point Triton, the CUDA loaders and torch's extension
    builder at them. A candidate may rewrite what it compiled (a Triton kernel's metadata, a built
    library), so nothing it wrote is read by another judgement: every judgement compiles from its
    own source. A compile costs what it did before the first judgement of a machine; see
    docs/judge-vs-kernelbench.md for the figures."""
    env = {}
    for variable, name in CACHE_VARIABLES.items():
        folder = Path(root, "caches", name)
        folder.mkdir(parents=True, exist_ok=True)
        env[variable] = str(folder)
    return env


def caches_for_worker(extensions: bool = False) -> list[Path]:
    """The caches a worker may write besides its scratch folder: Triton's and the CUDA build cache
    (and torch's extension cache, where a KernelBench solution's load_inline builds), as this
    process's environment names them (its private_caches in a judge's child). Created here, since a
    sandbox rule needs an existing folder."""
    from harness.cuda_build import cache_root
    triton_cache = os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache"
    folders = [Path(triton_cache), cache_root()]
    if extensions:
        folders.append(Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"))
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # an unwritable cache stays unwritable inside too
    return folders
