"""A pre-imported judge worker that forks one child per candidate (the server side).

Starting `python -m harness.workers.worker` (or `python -m harness.kernelbench.kb_worker`, a KernelBench child) costs
seconds per child before its first stage runs (the interpreter, torch, triton, the harness). This
process pays that once: it is started with exactly
the environment a worker would get (TRITON_INTERPRET and the like are read when triton is imported,
so they must already be right here), imports everything the worker imports, and then, for each
request, forks a child that does what `python -m MODULE ARGV` does (MODULE one of WORKERS): its own session and
process group, stdout and stderr to the files named, the scratch folder as its cwd and TMPDIR, the
death signal tied to this process, and the Landlock sandbox applied by the worker itself in the
child, after the fork and before the candidate is imported. This process never imports candidate
code and never initialises CUDA (a CUDA context does not survive fork: the child initialises it).

Protocol, one JSON object a line: the parent writes {"module", "argv", "env", "cwd", "stdout",
"stderr"} on our stdin; we answer {"pid": N} when the child is started and {"pid": N, "returncode": R} when it has
been reaped (R as subprocess reports it: negative for a signal). EOF on stdin (the judge exited or
was killed) kills every child's process group and ends this process.

    python -m harness.workers.zygote ROOM   (the parent, harness/workers/forkserver.py, does this; ROOM is blank
                                     argument space that a child rewrites into its own title)
"""
from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import sys
import tempfile
import traceback

# the judge's own child programs, the only ones a zygote runs
WORKERS = ("harness.workers.worker", "harness.kernelbench.kb_worker", "harness.workers.baseline")


# Triton's version key, as an earlier zygote of the same judging process computed it (forkserver.py)
TRITON_KEY_ENV = "AUTOKERNEL_TRITON_KEY"
HOME_PREFIX = "ak-zygote-"  # the folder the judge makes for each zygote (its working folder, its stderr)


def preload(known_triton_key: str | None = None) -> str | None:
    """Everything a worker imports before the candidate, so a child starts with it in memory.
    Returns Triton's version key, for the judge to hand to its next zygote."""
    import torch  # noqa: F401
    # torch imports dynamo lazily, at the first call of any op it wraps (torch.rms_norm's reference
    # among them): about a second in every child that would otherwise import it for itself
    import torch._dynamo  # noqa: F401
    import triton  # noqa: F401  (reads TRITON_INTERPRET now: the environment is the child's)
    # what a child would import at its first kernel launch: Triton's argument specialization imports
    # its Gluon package (a third of a second), the launch monitor torch's C++ extension loader
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:  # a Triton without it does not import it at launch either
        pass
    import torch.utils.cpp_extension  # noqa: F401

    import harness.kernelbench.kb_worker  # noqa: F401
    import harness.workers.baseline  # noqa: F401
    import harness.isolation.sandbox  # noqa: F401
    import harness.timing.timer  # noqa: F401
    import harness.workers.worker  # noqa: F401
    harness.workers.worker._target_compile()
    from harness.compiling.triton_specialization import convert_tritons_own
    convert_tritons_own()  # the lowering's JITFunctions of Triton's standard library (interpreter only)
    from harness.kernel_types import registry
    registry.names()  # the kernel types' modules, loaded at a worker's first lookup
    return _triton_key(known_triton_key)


def _triton_key(known: str | None) -> str | None:
    """Triton's own version key hashes its library (~0.3 s): once here, not in every child, and
    where an earlier zygote of this judge computed it, not here either (Triton's own warm-up pool
    hands its workers the key the same way). It depends only on Triton's installed files."""
    try:
        from triton.runtime import autotuner, cache
        if known:
            computed = cache.triton_key
            for module in (cache, autotuner):  # the names its callers look up when they run
                if getattr(module, "triton_key", None) is computed:
                    module.triton_key = lambda: known
        return cache.triton_key()
    except Exception:  # noqa: BLE001 - Triton's internals moved: each child computes it, as before
        return None


def cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def run_child(request: dict, channel: tuple[int, int]) -> None:
    """In the forked child: become `python -m MODULE ARGV` and never return."""
    code = 1
    try:
        os.setsid()  # its own session and process group: the parent kills the group at its deadline
        for fd in channel:
            os.close(fd)
        _redirect(request)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        tempfile.tempdir = None  # re-read TMPDIR: the child's scratch folder, not the zygote's
        sys.path[0] = request["cwd"]  # what `python -m` puts first: the cwd the worker starts in
        name = request.get("module", WORKERS[0])
        if name not in WORKERS:
            raise ValueError(f"the zygote runs only the judge's workers, not {name!r}")
        worker = importlib.import_module(name)
        sys.modules["__main__"] = worker  # the identity guard watches the worker's own functions
        sys.argv = [f"-m {name}"] + request["argv"]
        set_cmdline([sys.executable, "-m", name] + request["argv"])
        code = _exit_code(worker.main, request["argv"])
    except BaseException:  # noqa: BLE001 - a child must never return into the zygote's loop
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)


TITLE_ROOM = 4096  # bytes of command line the zygote is started with, for its children's titles


def set_cmdline(argv: list[str]) -> None:
    """Rewrite what /proc/PID/cmdline (ps, pgrep) shows for this process, in the argument area the
    zygote was started with: a forked worker reads as `python -m harness.workers.worker FILE ...`, as a
    spawned one does. Cut to the room there is; nothing else depends on it."""
    import ctypes
    try:
        fields = open("/proc/self/stat", encoding="ascii").read().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49
    except (OSError, IndexError, ValueError):
        return
    room = end - start
    if room <= 1:
        return
    title = "\0".join(argv).encode(errors="replace")[:room - 1]
    ctypes.memmove(start, title + b"\0" * (room - len(title)), room)


def _redirect(request: dict) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for src, dst in ((null, 0), (out, 1), (err, 2)):
        os.dup2(src, dst)
        os.close(src)


def _exit_code(main, argv: list[str]) -> int:
    """What the interpreter would exit with after main(argv), SystemExit included."""
    try:
        result = main(argv)
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


def serve(requests_fd: int, replies_fd: int, triton_key: str | None = None) -> None:
    live: set[int] = set()
    reader = os.fdopen(requests_fd, "r", encoding="utf-8", buffering=1)
    replies = os.fdopen(replies_fd, "w", encoding="utf-8", buffering=1)

    def reply(**fields) -> None:
        replies.write(json.dumps(fields) + "\n")
        replies.flush()

    reply(ready=True, pid=os.getpid(), triton_key=triton_key)
    try:
        while True:
            ready, _, _ = select.select([reader], [], [], 0.02 if live else 1.0)
            _reap(live, reply)
            if not ready:
                continue
            line = reader.readline()  # one request at a time: the judge waits for its reply
            if not line:
                return  # the judge is gone
            request = json.loads(line)
            if cuda_initialised():
                reply(error="CUDA was initialised in the zygote: refusing to fork")
                return
            sys.stdout.flush()  # nothing buffered here may end up in a child's output file
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                run_child(request, (requests_fd, replies_fd))
            live.add(pid)
            reply(pid=pid)
    finally:
        for pid in live:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _reap(live: set[int], reply) -> None:
    for pid in list(live):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            live.discard(pid)
            continue
        if done:
            live.discard(pid)
            reply(pid=pid, returncode=os.waitstatus_to_exitcode(status))


def main() -> int:
    # the protocol keeps its own descriptors; fds 0 and 1 go where a stray print cannot corrupt it
    requests_fd, replies_fd = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    known = os.environ.pop(TRITON_KEY_ENV, None)  # the judge's, not the children's
    home = os.getcwd()
    serve(requests_fd, replies_fd, preload(known))
    remove_home(home)
    return 0


def remove_home(home: str) -> None:
    """The folder the judge made for a zygote (its stderr), removed: by the judge when it closes the
    zygote, and by the zygote once the judge has hung up (a judge killed with SIGKILL cannot)."""
    if not os.path.basename(home).startswith(HOME_PREFIX):
        return  # started by hand somewhere else: not ours to remove
    with contextlib.suppress(OSError):
        for name in os.listdir(home):
            os.unlink(os.path.join(home, name))
        os.rmdir(home)


if __name__ == "__main__":
    raise SystemExit(main())
