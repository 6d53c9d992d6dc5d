"""What the audit hook (harness/isolation/audit_hook.py) allows, in each kind of process that imports
candidate code: which folders hold the candidate's code, which it may read and write, which imports
it may ask for, and which libraries may run tools and ctypes or generate code on its behalf.

Built from the process itself, once it has imported what it needs and before the candidate: the
standard library and site-packages from sysconfig, Triton's and torch's folders from their specs.
"""
from __future__ import annotations

import os
from typing import Callable

# relative: an exported kernel package carries this file and audit_hook.py as its own guard/
from .audit_hook import Policy, install


def _roots(paths) -> tuple[str, ...]:
    """Each path as given and as resolved, with a trailing slash: a prefix that matches only beneath."""
    out: list[str] = []
    for p in paths:
        if not p:
            continue
        for form in (os.path.abspath(str(p)), os.path.realpath(str(p))):
            form = form.rstrip("/") + "/"
            if form not in out:
                out.append(form)
    return tuple(out)


def _package_dir(name: str) -> str | None:
    """Where an installed package lives, without importing it."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return os.path.dirname(spec.origin) if spec is not None and spec.origin else None


def standard_policy(*, untrusted, reads, writes, allowed_imports: tuple[str, ...],
                    allowed_prefixes: tuple[str, ...] = (), report: Callable[[str], None] | None = None,
                    builders=(), judge_thread: int | None = None) -> Policy:
    """The policy of a process that imports candidate code, from what it has already imported;
    `builders`: more files or folders of loaders that may run tools for it (a vendored launcher)."""
    import site
    import sysconfig
    paths = sysconfig.get_paths()
    stdlib = [paths.get("stdlib"), paths.get("platstdlib")]
    toolchain = [paths.get("purelib"), paths.get("platlib"), *site.getsitepackages()]
    harness_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    torch_dir, triton_dir = _package_dir("torch"), _package_dir("triton")
    builders = [triton_dir, torch_dir and os.path.join(torch_dir, "utils", "cpp_extension.py"),
                torch_dir and os.path.join(torch_dir, "cuda"),
                *(os.path.join(harness_dir, f) for f in ("cuda_build.py", "cuda_launcher.py", os.path.join("compiling", "target_compile.py"))),
                *builders]
    # os.devnull: subprocess opens it for every tool a compiler runs on the candidate's behalf
    # (Triton's platform_key runs `file` on a GPU's first launch); it holds and keeps nothing
    return Policy(untrusted=_roots(untrusted), reads=_roots(reads), writes=_roots([*writes, os.devnull]),
                  allowed_imports=tuple(allowed_imports), allowed_prefixes=tuple(allowed_prefixes),
                  builders=_roots(builders),
                  code_makers=_roots([triton_dir, torch_dir]), stdlib=_roots(stdlib),
                  toolchain=_roots(toolchain), report=report, judge_thread=judge_thread)


def install_for_candidate(*, candidate_dir: str, records_dir: str, sandbox_write: list[str], reads: list[str],
                          allowed: tuple[str, ...], report: Callable[[str], None] | None = None,
                          extensions: bool = False) -> None:
    """The hook in a process that imports one candidate (the judge's worker, the KernelBench child):
    its code is what comes from its own folder or from the folders it may write; it may write only
    its scratch folders (the cwd and TMPDIR) and the compiler caches, never the folder of the
    process's own records, and read what the sandbox lets the process read and its own folder."""
    import tempfile
    import threading

    from harness.isolation.static_check import submodule_prefixes
    scratch = [os.getcwd(), tempfile.gettempdir()]
    records = os.path.realpath(records_dir) + "/"
    from harness.isolation.sandbox import caches_for_worker
    caches = [p for p in sandbox_write if not records.startswith(os.path.realpath(p) + "/")]
    # the judgement's own compiler caches (beneath its scratch, beside the records' folder)
    caches += [str(c) for c in caches_for_worker(extensions)]
    install(standard_policy(untrusted=[candidate_dir, *scratch, *sandbox_write], reads=[*reads, candidate_dir],
                            writes=[*scratch, *caches], allowed_imports=allowed,
                            allowed_prefixes=submodule_prefixes(allowed), report=report,
                            judge_thread=threading.get_ident()))


def install_for_winners(*, untrusted, reads, writes, report: Callable[[str], None] | None = None) -> None:
    """The hook in a process that runs judged winners (verify, an exported package's selftest): any
    kernel file or ModelNew may import what the static check allows either of them. `report`:
    the routing's refusals.report, so that a served winner's refused event fails its call."""
    from harness.isolation.static_check import allowed_imports, submodule_prefixes
    allowed = allowed_imports("cuda", model=True)
    install(standard_policy(untrusted=untrusted, reads=reads, writes=writes, allowed_imports=allowed,
                            allowed_prefixes=submodule_prefixes(allowed), report=report))
