"""A PEP 578 audit hook in every process that imports candidate code (the judge's worker, the
KernelBench child, the processes of `verify` and `export --selftest`), installed before the first
candidate import. Python code cannot remove an audit hook once added.

How it tells the candidate's code from the judge's: by the call stack at the moment of the event.
- A frame is the candidate's when its code comes from a folder the candidate controls (its own
  file's folder, the scratch and cache folders it may write) or runs with a candidate module's
  globals (code that dataclasses or Triton's interpreter generated for it).
- Code generated at run time (a synthetic file name such as `<string>`) belongs to whoever
  generated it: code that Triton or torch exec'd (Triton's argument binder, made on a kernel's first
  launch) is theirs, marked as it is exec'd; other generated code is its module's where its globals
  are a loaded module's, and otherwise the candidate's.
- With no candidate frame on the stack, the event is the judge's own, or torch's and Triton's
  internals working for the judge: it passes untouched.
- With one on the stack, the event happens on the candidate's behalf and the rules below apply.
  The *actor* is the innermost frame outside the standard library: torch's and Triton's code acting
  inside a candidate's call (a lazy import, Triton building its launcher and running ptxas on a
  GPU) keeps working, while the candidate calling the standard library directly (`inspect`,
  `pickle`, `socket`, reached through another module's attribute) stays the candidate.
- A library's own mechanism is the library's: a frame that a library reads for itself (filelock's
  bookkeeping of who holds a lock) beneath a call the candidate made to a compiler or loader the
  judge relies on is not the candidate reading frames. What the candidate calls directly is held
  to the rules.

Refused while candidate code runs (each refusal raises JudgeRefusal and is reported to the judging
process, which fails the verdict naming it even when the candidate swallows the exception):
- frame introspection: sys._getframe, tb_frame, gi_frame, cr_frame, ag_frame, sys._current_frames,
  gc's referrer and object walks, settrace/setprofile and new audit hooks; except for the few
  standard-library functions that read a caller's module name and hand out no frame, and frame
  reads (sys._getframe, tb_frame...) a library makes for itself beneath the candidate's call of a
  compiler or loader the judge relies on (which hands no frame out);
- pickle.find_class and marshal.loads (except importlib loading a module's bytecode);
- imports the candidate itself asks for outside the static check's allowed list;
- sockets of any kind; processes, os.system, os.exec*, environment changes and ctypes, unless the
  actor is a compiler the judge relies on (Triton's backends, torch's extension builder, the
  project's CUDA loaders);
- exec/compile of new code, unless the actor generates code as its job (dataclasses, namedtuple,
  typing, enum, importlib, Triton and torch);
- open() outside the candidate's scratch folders (write) or the read-only paths a kernel needs.
- rewriting a function's __code__, __defaults__ or __kwdefaults__ that is not the candidate's.
The hook is a second wall, not the first: native code never raises an audit event, which is why
the OS sandbox (harness/isolation/sandbox.py) and the outside witness of every timing (harness/timing/witness.py)
stand beside it.

The installed hook reads nothing through this module's globals: it runs private copies of the
functions below over a private copy of their globals and builtins, with its policy and the library
functions it calls bound into one immutable tuple (`_Bound`), all held only by the registered hook.
Rebinding a name here, or in builtins, changes nothing it does; rewriting a function's code in
place is itself an audited event it refuses.
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Callable, NamedTuple

CANDIDATE, TOOLCHAIN, STDLIB = "candidate", "toolchain", "stdlib"

FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
FUNCTION_ATTRIBUTES = frozenset({"__code__", "__defaults__", "__kwdefaults__"})
# frame reads a library may make for itself beneath an allowed call (never tracing, walks of every
# object or thread, nor new audit hooks)
LIBRARY_FRAME_EVENTS = frozenset({"sys._getframe", "object.__getattr__"})
FRAME_EVENTS = frozenset({"sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile",
                          "sys.addaudithook", "gc.get_referrers", "gc.get_referents", "gc.get_objects"})
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
                            "os.fork", "os.forkpty", "pty.spawn", "os.kill", "os.killpg", "signal.pthread_kill",
                            "os.putenv", "os.unsetenv"})
CODE_EVENTS = frozenset({"exec", "compile", "code.__new__", "function.__new__"})
PATH_EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
WATCHED = (FRAME_EVENTS | PROCESS_EVENTS | CODE_EVENTS | PATH_EVENTS
           | {"object.__getattr__", "object.__setattr__", "object.__delattr__", "pickle.find_class",
              "marshal.loads", "marshal.load", "import"})
WATCHED_FAMILIES = ("socket.", "ctypes.")
# (file name ending, function) of standard-library code that reads its caller's module name from a
# frame and returns no frame: refusing them would break dataclasses, NamedTuple, Enum and logging.
SAFE_FRAME_READERS = frozenset({("typing.py", "_caller"), ("collections/__init__.py", "namedtuple"),
                                ("enum.py", "_create_"), ("traceback.py", "extract_stack"),
                                ("traceback.py", "format_stack"), ("traceback.py", "print_stack"),
                                ("typing_extensions.py", "_caller"),
                                ("typing_extensions.py", "_has_generic_or_protocol_as_origin")})
# The judge's own frame readers that may run under a candidate's call (the op recorder asking
# whether an op inside a Triton launch was Triton's or a candidate's callback's): matched by their
# exact file, which lies where no candidate writes, and hand no frame out: the judge's, and the copy
# an exported package carries beside this file in its guard/ (it watches served calls the same way).
_HERE = os.path.dirname(os.path.abspath(__file__))
JUDGE_FRAME_READERS = frozenset({(os.path.join(os.path.dirname(_HERE), "correctness", "launches.py"), "triton_own_op"),
                                 (os.path.join(_HERE, "launches.py"), "triton_own_op")})
# Standard-library code whose job is generating code: the exec/compile it does is not the caller's.
CODE_GENERATORS = ("dataclasses.py", "collections/__init__.py", "typing.py", "enum.py", "ast.py",
                   "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
MAX_REPORTS = 50


class JudgeRefusal(RuntimeError):
    """What the audit hook raises inside the candidate's code."""


class Policy(NamedTuple):
    untrusted: tuple[str, ...]            # folders whose code is the candidate's
    reads: tuple[str, ...]                # folders and files the candidate's code may read
    writes: tuple[str, ...]               # folders the candidate's code may write
    allowed_imports: tuple[str, ...]      # modules the candidate may import (harness/isolation/static_check.py)
    allowed_prefixes: tuple[str, ...] = ()  # ... and their submodules, for these packages
    builders: tuple[str, ...] = ()        # files/folders of compilers allowed to run tools and ctypes
    code_makers: tuple[str, ...] = ()     # toolchain folders allowed to exec code (Triton, torch)
    stdlib: tuple[str, ...] = ()
    toolchain: tuple[str, ...] = ()
    report: Callable[[str], None] | None = None
    # the one thread candidate code may run on (the judge's worker calls it there); None: any
    judge_thread: int | None = None


class _Bound(NamedTuple):
    """Everything the installed hook uses, bound once: rebinding this module's names changes nothing."""
    policy: Policy
    candidate_globals: list
    generated: dict  # id(code) -> code: code objects a toolchain library exec'd (its own)
    refusals: list
    local: threading.local
    modules: dict
    getframe: Callable
    getcwd: Callable
    join: Callable
    normpath: Callable
    basename: Callable
    fspath: Callable
    refusal: type
    get_ident: Callable


_registered: list = []  # the candidate-globals list of the hook installed in this process, if any


def install(policy: Policy) -> Callable[[object], None]:
    """Install the hook with `policy` (once per process: a second call adds nothing and returns the
    first hook's registration function); returns `register(module)` for candidate modules."""
    if _registered:
        return _registered[0]
    bound = _Bound(policy, [], {}, [], threading.local(), sys.modules, sys._getframe, os.getcwd, os.path.join,
                   os.path.normpath, os.path.basename, os.fspath, JudgeRefusal, threading.get_ident)
    hook = _private_copy()["_hook"]

    def audit(event: str, args: tuple) -> None:
        hook(event, args, bound)

    def register(module) -> None:
        """A candidate module, before its code runs: frames with its globals are the candidate's."""
        bound.candidate_globals.append(module.__dict__)

    sys.addaudithook(audit)
    _registered.append(register)
    return register


def _private_copy() -> dict:
    """This module's functions re-created over a private copy of its globals and builtins, so that
    no global name the hook looks up can be rebound from outside once it is installed."""
    import builtins
    import types
    g = dict(globals())
    g["__builtins__"] = dict(vars(builtins))
    for name, value in list(g.items()):
        if isinstance(value, types.FunctionType) and value.__module__ == __name__:
            g[name] = types.FunctionType(value.__code__, g, value.__name__, value.__defaults__, value.__closure__)
    return g


def register(module) -> None:
    """Register a candidate module with the installed hook (nothing when none is installed)."""
    if _registered:
        _registered[0](module)


def installed() -> bool:
    return bool(_registered)


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return path.startswith(roots) or path + "/" in roots


def _kind(frame, b: _Bound) -> str:
    g = frame.f_globals
    for c in b.candidate_globals:
        if g is c:
            return CANDIDATE
    code = frame.f_code
    name = code.co_filename
    if name.startswith("<frozen "):
        return STDLIB
    if name.startswith("<"):
        return TOOLCHAIN if b.generated.get(id(code)) is code else _synthetic_kind(g, b)
    return _file_kind(name, b.policy)


def _file_kind(name: str, policy: Policy) -> str:
    if _under(name, policy.untrusted):
        return CANDIDATE
    if _under(name, policy.stdlib) and not _under(name, policy.toolchain):
        return STDLIB
    return TOOLCHAIN


def _synthetic_kind(g: dict, b: _Bound) -> str:
    name = g.get("__name__")
    module = b.modules.get(name) if isinstance(name, str) else None
    if module is None or getattr(module, "__dict__", None) is not g:
        return CANDIDATE  # generated code with globals of its own: whoever generated it is not known
    return _file_kind(getattr(module, "__file__", None) or "", b.policy)


def _actor(frame, b: _Bound):
    """The innermost frame outside the standard library, and its kind."""
    while frame is not None:
        kind = _kind(frame, b)
        if kind != STDLIB:
            return frame, kind
        frame = frame.f_back
    return None, STDLIB


def _candidate_frame(frame, b: _Bound):
    while frame is not None:
        if _kind(frame, b) == CANDIDATE:
            return frame
        frame = frame.f_back
    return None


def _hook(event: str, args: tuple, b: _Bound) -> None:
    if (event not in WATCHED and not event.startswith(WATCHED_FAMILIES)) or getattr(b.local, "walking", False):
        return
    if event.startswith("object.__") and (len(args) < 2 or args[1] not in (
            FRAME_ATTRIBUTES if event == "object.__getattr__" else FUNCTION_ATTRIBUTES)):
        return
    b.local.walking = True
    try:
        frame = b.getframe(2)  # the innermost frame of whoever raised the event
    finally:
        b.local.walking = False
    try:
        why = _foreign_thread(event, b) or _judge(event, args, frame, b)
        if why is None and event == "exec":
            _note_generated(args, frame, b)
    except Exception as e:  # a fault of this hook: fail closed only on the candidate's behalf
        why = None if _candidate_frame(frame, b) is None else \
            f"{event} (the hook could not judge it: {type(e).__name__})"
    if why is not None:
        _refuse(why, b)


def _foreign_thread(event: str, b: _Bound) -> str | None:
    """Where candidate code runs on one thread only, any watched event on another is the
    candidate's: no judge code runs there, and a thread's stack shows nothing of who started it
    (code exec'd there under a library's globals would pass for that library's own)."""
    judge_thread = b.policy.judge_thread
    if judge_thread is None or b.get_ident() == judge_thread:
        return None
    return f"{event} on a thread the candidate started: a kernel runs on the judge's thread only"


def _judge(event: str, args: tuple, frame, b: _Bound) -> str | None:
    """Why this event is refused, or None; `frame` is the innermost frame of the caller."""
    policy = b.policy
    if event in PATH_EVENTS and _path_allowed(event, args, b):
        return None
    candidate = _candidate_frame(frame, b)
    if candidate is None:
        return None  # the judge's own code, or torch/Triton working for it
    if event not in PATH_EVENTS and not event.startswith("socket.") and _importing(frame, candidate):
        return None  # a library's own top-level code, run by an import, does what it always does
    where = f"{b.basename(candidate.f_code.co_filename)}:{candidate.f_lineno}"
    actor, actor_kind = _actor(frame, b)
    if event in FRAME_EVENTS or event == "object.__getattr__":
        if _safe_frame_reader(frame) or _launch_monitor_reader(frame, b):
            return None
        if event in LIBRARY_FRAME_EVENTS and _libraries_own(frame, candidate, b):
            return None
        what = args[1] if event == "object.__getattr__" else event
        return f"frame introspection ({what}) at {where}: the judge's frames are not the candidate's to read"
    if event in ("object.__setattr__", "object.__delattr__"):
        if (_kind_of_function(args[0], b) == CANDIDATE or actor_kind == TOOLCHAIN
                or frame.f_code.co_filename.endswith(CODE_GENERATORS)):
            return None  # its own function, or a library finishing a function it generated
        return f"rewriting {getattr(args[0], '__qualname__', '?')}.{args[1]} at {where}: not the candidate's function"
    if event in ("pickle.find_class", "marshal.load"):
        return f"{event}{_brief(args)} at {where}: unpickling can import and call anything"
    if event == "marshal.loads":
        return None if frame.f_code.co_filename.startswith("<frozen importlib") else \
            f"marshal.loads at {where}: loading code objects is not a kernel's business"
    if event == "import":
        name = str(args[0])
        if actor_kind != CANDIDATE or name in policy.allowed_imports or name.startswith(policy.allowed_prefixes):
            return None
        return f"import {args[0]} at {where}: not in the allowed list (see playbook/rules.md)"
    if event.startswith("socket."):
        return f"{event}{_brief(args)} at {where}: a candidate has no network"
    if event in PROCESS_EVENTS or event.startswith("ctypes."):
        if actor_kind == TOOLCHAIN and _under(actor.f_code.co_filename, policy.builders):
            return None
        return f"{event}{_brief(args)} at {where}: a kernel starts no processes and calls no C directly"
    if event in CODE_EVENTS:
        if frame.f_code.co_filename.startswith("<frozen importlib") and actor_kind == CANDIDATE:
            # importlib loading a module the candidate asked for by name (importlib.import_module
            # raises no import event of its own): the same allowed list as an import statement
            name = _module_being_loaded(frame)
            if name is not None and (name in policy.allowed_imports or name.startswith(policy.allowed_prefixes)):
                return None
            return f"import {name or 'of a module'} through importlib at {where}: not in the allowed list"
        if frame.f_code.co_filename.endswith(CODE_GENERATORS):
            return None
        if actor_kind == TOOLCHAIN and _under(actor.f_code.co_filename, policy.code_makers):
            return None
        return f"{event} at {where}: a kernel compiles no Python code of its own"
    if event in PATH_EVENTS:
        if actor_kind == TOOLCHAIN and isinstance(args[0], int):
            return None  # a library reopening a descriptor it holds (subprocess's pipes)
        return f"{event}({args[0]!r}) at {where}: outside the candidate's scratch folder and the paths a kernel reads"
    return None


def _note_generated(args: tuple, frame, b: _Bound) -> None:
    """Code that Triton or torch exec (Triton's argument binder, torch's generated graphs) is
    theirs: its frames, whose file name is `<string>`, count as the library's, not the candidate's.
    Marked only when the exec was allowed and its actor is such a library: a candidate cannot exec
    code (refused), and Triton's binder is built from a kernel's parameter names and canonical type
    names alone, never from text a kernel wrote."""
    code = args[0] if args else None
    if not hasattr(code, "co_consts"):
        return
    actor, kind = _actor(frame, b)
    if kind != TOOLCHAIN or not _under(actor.f_code.co_filename, b.policy.code_makers):
        return
    pending = [code]
    while pending:  # the functions it defines are generated code too
        c = pending.pop()
        b.generated[id(c)] = c
        pending.extend(k for k in c.co_consts if hasattr(k, "co_consts"))


def _libraries_own(frame, candidate, b: _Bound) -> bool:
    """Whether a frame read is a library's own mechanism: the candidate called a compiler or loader
    the judge relies on (Triton, torch's extension builder, the project's CUDA loaders: the policy's
    builders), which hands out no frame, and the read happened beneath that call, in a library's
    code (filelock noting who holds the lock of the CUDA build cache). A library the candidate calls
    directly, or one that reads frames for whoever calls it, is held to the rules."""
    actor, kind = _actor(frame, b)
    if kind != TOOLCHAIN:
        return False
    callee, f = None, frame
    while f is not None and f is not candidate:
        if _kind(f, b) != STDLIB:
            callee = f  # the outermost frame outside the standard library inside the candidate's call
        f = f.f_back
    return (callee is not None and actor is not callee and _kind(callee, b) == TOOLCHAIN
            and _under(callee.f_code.co_filename, b.policy.builders))


def _importing(frame, candidate) -> bool:
    """Whether the event comes from another module's top-level code while that module is being
    imported (a library an allowed import or Triton pulls in), not from the candidate's own request
    (importlib.import_module called by the candidate runs no module's top-level code in between)."""
    while frame is not None and frame is not candidate:
        if frame.f_code.co_name == "<module>":
            return True
        frame = frame.f_back
    return False


def _module_being_loaded(frame) -> str | None:
    """The name of the module importlib is loading, read from its own frames' arguments."""
    for _ in range(8):
        if frame is None or not frame.f_code.co_filename.startswith("<frozen importlib"):
            return None
        local = frame.f_locals
        for key, attr in (("fullname", None), ("spec", "name"), ("module", "__name__")):
            value = local.get(key)
            value = getattr(value, attr, None) if attr and value is not None else value
            if isinstance(value, str):
                return value
        frame = frame.f_back
    return None


def _kind_of_function(fn, b: _Bound) -> str:
    code, g = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
    if any(g is c for c in b.candidate_globals):
        return CANDIDATE
    return _file_kind(code.co_filename, b.policy) if code is not None else TOOLCHAIN


def _launch_monitor_reader(frame, b: _Bound) -> bool:
    """The launch monitor's frame reader wherever its file was copied to (an exported package's
    guard/launches.py, watched by the project's hook in export --selftest): its own name and file
    name, in a folder that is not the candidate's."""
    code = frame.f_code
    return (code.co_name == "triton_own_op" and b.basename(code.co_filename) == "launches.py"
            and _file_kind(code.co_filename, b.policy) != CANDIDATE)


def _safe_frame_reader(frame) -> bool:
    name = frame.f_code.co_filename.replace("\\", "/")
    fn = frame.f_code.co_name
    if any(name.endswith(suffix) and fn == func for suffix, func in SAFE_FRAME_READERS):
        return True
    if (frame.f_code.co_filename, fn) in JUDGE_FRAME_READERS:
        return True
    caller = frame.f_back
    if caller is None or caller.f_code.co_filename != frame.f_code.co_filename:
        return False
    # logging.currentframe is a lambda returning the frame: safe only as Logger.findCaller uses it;
    # traceback's frame walkers are generators: safe only as traceback's own summaries consume them
    return ((name.endswith("logging/__init__.py") and fn == "<lambda>" and caller.f_code.co_name == "findCaller")
            or (name.endswith("traceback.py") and fn in ("walk_tb", "_walk_tb_with_full_positions")))


def _path_allowed(event: str, args: tuple, b: _Bound) -> bool:
    target = args[0] if args else None
    if isinstance(target, int) or target is None:
        return False
    try:
        target = b.fspath(target)
        if isinstance(target, bytes):
            target = target.decode("utf-8", "surrogateescape")
        path = b.normpath(b.join(b.getcwd(), target))
    except (TypeError, ValueError, OSError):
        return False
    if _under(path, b.policy.writes):
        return True
    return not _writes(event, args) and _under(path, b.policy.reads)


def _writes(event: str, args: tuple) -> bool:
    if event != "open":
        return False
    mode, flags = (args[1] if len(args) > 1 else None), (args[2] if len(args) > 2 else 0)
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return True
    return isinstance(flags, int) and bool(flags & WRITE_FLAGS)


def _brief(args: tuple) -> str:
    return "(" + ", ".join(repr(a)[:60] for a in args[:3]) + ")"


def _refuse(why: str, b: _Bound) -> None:
    text = f"refused by the judge's audit hook: {why}"
    if len(b.refusals) < MAX_REPORTS:
        b.refusals.append(text)
        if b.policy.report is not None:
            try:
                b.policy.report(text)
            except Exception:  # noqa: BLE001 - a broken report socket is the witness's to notice
                pass
    raise b.refusal(text)
