"""The audit hook (harness/isolation/audit_hook.py), both directions, in a child process (a hook cannot be
removed): what a candidate's code tries is refused and reported, what an honest kernel's code and
the judge's own code do keeps working, and rebinding the hook module's names does not disarm it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from paths import ROOT


# Each probe is a function of the candidate module; the child calls each and records what happened.
CANDIDATE = '''
import dataclasses, enum, functools, math, typing
import torch

def _tb_frame():
    try:
        raise ValueError
    except ValueError as e:
        return e.__traceback__.tb_frame

def _gen():
    yield 1

def _format_traceback():
    try:
        raise ValueError("x")
    except ValueError as e:
        return len(torch._utils.pickle.sys.modules["traceback"].format_exception(e))

def _thread_exec():
    # a thread running exec'd code under a library's globals: no candidate frame on its stack
    mods = torch._utils.pickle.sys.modules
    thread = mods["threading"].Thread(target=exec, args=("import os", vars(mods["json"])))
    thread.start()
    thread.join()


class Point(typing.NamedTuple):
    x: int

PROBES = {
    # refused: the judge's state, imports, processes, the network, files, new code
    "getframe": lambda: torch._utils.logging.currentframe(),
    "tb_frame": _tb_frame,
    "gi_frame": lambda: _gen().gi_frame,
    "pickle_socket": lambda: torch._utils.pickle.loads(b"csocket\\nsocket\\n."),
    "importlib_wave": lambda: torch._utils.pickle.sys.modules["importlib"].import_module("wave"),
    "subprocess": lambda: torch._utils.os.system("true"),
    "socket": lambda: torch.multiprocessing.reducer.socket.socket(2, 2),
    "read_outside": lambda: torch._utils.pickle.sys.modules["io"].open(SECRET, "rb").read(),
    "write_outside": lambda: torch._utils.pickle.sys.modules["io"].open(READABLE + "/x", "w"),
    "rewrite_judge_code": lambda: setattr_(JUDGE_FN, "__code__", (lambda: None).__code__),
    "putenv": lambda: torch._utils.os.putenv("X", "1"),
    "thread_exec": _thread_exec,
    # allowed: what an honest kernel file does
    "dataclass": lambda: dataclasses.make_dataclass("C", ["a"])(1),
    "namedtuple": lambda: Point(1).x,
    "enum": lambda: enum.Enum("Color", "RED GREEN").RED.value,
    "math": lambda: math.sqrt(4.0),
    "read_inside": lambda: len(torch._utils.pickle.sys.modules["io"].open(READABLE + "/data.txt", "rb").read()),
    "write_scratch": lambda: torch._utils.pickle.sys.modules["io"].open(SCRATCH + "/out.txt", "w").write("ok"),
    "format_traceback": _format_traceback,
    "torch_compute": lambda: float(torch.ones(3).sum()),
    # Triton's launcher build on a GPU: platform.architecture() runs `file`, whose subprocess opens
    # os.devnull, with the candidate's launch on the stack
    "toolchain_tool_devnull": lambda: (PLATFORM_KEY.cache_clear(), PLATFORM_KEY())[1],
    # a library's own mechanism beneath a loader the judge relies on: filelock reads frames while the
    # CUDA build cache's lock is taken (TOOLS stands in for harness/cuda_launcher.py, a builder)
    "lock_beneath_a_builder": lambda: TOOLS.build_locked(SCRATCH + "/build.lock"),
    # code a code maker generated (Triton's argument binder) is the maker's: its imports are its own
    "generated_by_a_maker": lambda: TOOLS.make_importer("colorsys")(),
    # refused: the same library called directly, and generated code running with the candidate's globals
    "lock_called_directly": lambda: TOOLS.FileLock(SCRATCH + "/direct.lock").acquire(),
    "generated_with_candidate_globals": lambda: TOOLS.make_importer("netrc", globals())(),
}
'''

# A builder and code maker of the test's own (a policy may name more of either): filelock taken as
# the CUDA build cache's lock is, and code generated the way Triton makes its argument binder.
TOOLS = '''
from filelock import FileLock

def build_locked(path):
    with FileLock(path):
        return "built"

def make_importer(module, namespace=None):
    namespace = {} if namespace is None else namespace
    exec(f"def importer():\\n    import {module}\\n    return 'imported'\\n", namespace)
    return namespace["importer"]
'''

CHILD = r'''
import json, sys, threading, types
folder, scratch, readable, secret, tools = sys.argv[1:6]
from harness.isolation import audit_hook, audit_policy
from triton.runtime.build import platform_key
sys.path.insert(0, tools)
import tools as tools_module
reports = []
policy = audit_policy.standard_policy(
    untrusted=[folder], reads=[folder, readable, *sys.path[1:]], writes=[scratch],
    allowed_imports=("torch", "math", "functools", "typing", "dataclasses", "enum"), report=reports.append,
    builders=[tools], judge_thread=threading.get_ident())
policy = policy._replace(code_makers=policy.code_makers + audit_policy._roots([tools]))
register = audit_hook.install(policy)
import importlib.util
spec = importlib.util.spec_from_file_location("cand", folder + "/cand.py")
module = importlib.util.module_from_spec(spec)
module.SECRET, module.READABLE, module.SCRATCH = secret, readable, scratch
module.setattr_ = object.__setattr__
module.PLATFORM_KEY = platform_key
module.TOOLS = tools_module
def judge_fn():
    return "judge"
module.JUDGE_FN = judge_fn
register(module)
spec.loader.exec_module(module)
if sys.argv[6] == "rebind":  # names of the hook's module rebound: the installed hook must not care
    audit_hook._judge = lambda *a: None
    audit_hook.WATCHED = frozenset()
    audit_hook._hook = lambda *a: None
results = {}
for name, probe in module.PROBES.items():
    try:
        probe()
        results[name] = "ok"
    except Exception as e:
        results[name] = f"{type(e).__name__}: {e}"
# the judge's own code, no candidate frame on the stack: untouched
results["judge_getframe"] = "ok" if sys._getframe() is not None else "?"
import pickle
results["judge_pickle"] = "ok" if pickle.loads(pickle.dumps(judge_fn)) is judge_fn else "?"
results["judge_fn_intact"] = judge_fn()
print(json.dumps({"results": results, "reports": reports}))
'''

REFUSED = {"getframe": "frame introspection (sys._getframe)", "tb_frame": "frame introspection (tb_frame)",
           "gi_frame": "frame introspection (gi_frame)", "pickle_socket": "pickle.find_class",
           "importlib_wave": "import wave", "subprocess": "os.system", "socket": "socket.__new__",
           "read_outside": "open(", "write_outside": "open(", "rewrite_judge_code": "rewriting judge_fn.__code__",
           "putenv": "os.putenv", "lock_called_directly": "frame introspection (sys._getframe)",
           "generated_with_candidate_globals": "import netrc"}
ALLOWED = ("dataclass", "namedtuple", "enum", "math", "read_inside", "write_scratch", "format_traceback",
           "torch_compute", "toolchain_tool_devnull", "lock_beneath_a_builder", "generated_by_a_maker",
           "judge_getframe", "judge_pickle")


def _run(tmp_path: Path, mode: str) -> dict:
    folder, scratch, readable = tmp_path / "candidate", tmp_path / "scratch", tmp_path / "readable"
    for f in (folder, scratch, readable):
        f.mkdir()
    (folder / "cand.py").write_text(textwrap.dedent(CANDIDATE))
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "tools.py").write_text(TOOLS)
    (readable / "data.txt").write_text("data")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    out = subprocess.run([sys.executable, "-c", CHILD, str(folder), str(scratch), str(readable), str(secret),
                          str(tools), mode],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["plain", "rebind"])
def test_the_candidate_is_refused_and_honest_code_is_not(tmp_path, mode):
    got = _run(tmp_path, mode)
    results, reports = got["results"], got["reports"]
    for name, phrase in REFUSED.items():
        assert results[name].startswith("JudgeRefusal") and phrase in results[name], (name, results[name])
    for name in ALLOWED:
        assert results[name] == "ok", (name, results[name])
    assert results["judge_fn_intact"] == "judge"
    # every refusal was reported, even though the candidate caught each one
    assert len(reports) >= len(REFUSED) and all(r.startswith("refused by the judge's audit hook") for r in reports)
    # the thread the candidate started: its exec refused (and reported) though no candidate frame ran it
    assert any(r.endswith("compile on a thread the candidate started: a kernel runs on the judge's thread only") for r in reports), reports
