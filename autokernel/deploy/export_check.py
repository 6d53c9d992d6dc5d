"""`autokernel export --selftest`: the exported package's selftest, run inside the OS sandbox.

The selftest imports every exported kernel: judged code, but LLM-written. So it runs in a child
with no secrets in its environment, under Landlock (writes only to its own scratch folder and the
compiler caches, no network), in its own process group with a time limit, on the exported copy of
the package. The child prints one JSON line; only this process writes anything the user keeps.

    python -m autokernel.deploy.export_check PACKAGE_PARENT --child [--package NAME] [--sandbox-write DIR ...] [--device D]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

from autokernel.errors import UserError

PACKAGE = "autokernel_kernels"  # export.PACKAGE; not imported: the child stays light
DEFAULT_TIMEOUT_S = 900.0  # every kernel at its target shape, in the Triton interpreter on a CPU


def selftest_confined(package_parent: str | Path, device: str | None = None, sandbox: bool = True,
                      timeout_s: float = DEFAULT_TIMEOUT_S, package: str = PACKAGE) -> dict:
    """Run the selftest of the package `package` (in package_parent) in a confined child:
    {"ok", "errors" or "failure", "sandbox"}."""
    import torch

    from harness.isolation.process import run_isolated
    from harness.judge import child_env, sandbox_argv
    from harness.isolation.sandbox import private_caches
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory(prefix="ak-selftest-") as tmp:
        scratch_tmp = Path(tmp, "tmp")
        scratch_tmp.mkdir()
        argv = [sys.executable, "-m", "autokernel.deploy.export_check", str(Path(package_parent).resolve()), "--child",
                "--device", device, "--package", package]
        argv += sandbox_argv(Path(tmp)) if sandbox else ["--no-sandbox"]
        # the package's kernels build from source into the selftest's own caches
        child = run_isolated(argv, timeout_s, env={**child_env(device), "TMPDIR": str(scratch_tmp),
                                                   **private_caches(Path(tmp))}, cwd=tmp)
    lines = child.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        how = "timed out" if child.timed_out else (child.signal_name or f"exit status {child.returncode}")
        raise UserError(f"the package's selftest ended without a result ({how}):\n{child.stderr_tail()}",
                        "the package is written; run its tests/test_kernels.py to see the failure") from None
    return result


def confine(ns: argparse.Namespace) -> tuple[object, str | None, dict]:
    """Everything the child does before a kernel is imported, in order: a fresh network namespace
    (first: one thread only), the package's own code, Triton, the OS sandbox, the audit hook over the
    package's kernels/. Returns the package (or None), why it failed to import (or None), and what
    the sandbox enforces. (tests/rehearsal runs a first real launch behind exactly this.)"""
    from harness.isolation import audit_policy, namespace, sandbox
    from harness.isolation.sandbox import caches_for_worker
    network = None if ns.no_sandbox else namespace.isolate_for(ns.device)  # first: one thread only
    package = str(Path(ns.package_parent, ns.package))
    sys.path.insert(0, ns.package_parent)
    loaded, failure = None, None
    try:  # the package's own code, found in a folder the sandbox will not list; its kernels load later
        loaded = importlib.import_module(ns.package)
    except Exception as e:  # noqa: BLE001 - reported as the selftest's failure
        failure = f"{type(e).__name__}: {e}"
    sandbox.import_triton()
    state = sandbox.not_requested() if ns.no_sandbox else sandbox.confine(
        ns.sandbox_write, readable=[package], namespace=network)
    sandbox.warn_if_open(state, "the package's selftest")
    # the package's kernel files are the judged winners: the hook watches what runs from there
    # the package's routing: a refused event fails the winner's call there (routing/refusals.py)
    report = getattr(getattr(getattr(loaded, "routing", None), "refusals", None), "report", None)
    audit_policy.install_for_winners(untrusted=[str(Path(package, "kernels"))], report=report,
                                     reads=[*(state.get("reads") or sandbox.read_roots()), package],
                                     writes=[tempfile.gettempdir(), *ns.sandbox_write, *map(str, caches_for_worker())])
    return loaded, failure, state


def _child(ns: argparse.Namespace) -> int:
    loaded, failure, state = confine(ns)
    result: dict = {"sandbox": state}
    try:
        if failure is not None:
            raise RuntimeError(failure)
        result["errors"] = loaded.selftest(ns.device)
        result["ok"] = True
    except Exception as e:  # a kernel that differs from PyTorch, or one the sandbox stopped
        result.update(ok=False, failure=failure or f"{type(e).__name__}: {e}")
    print(json.dumps(result, default=str), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autokernel.deploy.export_check")
    p.add_argument("package_parent", help="the folder that holds autokernel_kernels/")
    p.add_argument("--child", action="store_true", help="internal: the confined side")
    p.add_argument("--device", default="cpu")
    p.add_argument("--package", default=PACKAGE, help="the package's name (in an hf-kernels variant: the repository's)")
    p.add_argument("--sandbox-write", action="append", default=[])
    p.add_argument("--no-sandbox", action="store_true")
    ns = p.parse_args(argv)
    if ns.child:
        return _child(ns)
    result = selftest_confined(ns.package_parent, ns.device, sandbox=not ns.no_sandbox)
    print(json.dumps(result, indent=1, default=str))
    return 0 if result.get("ok") else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    raise SystemExit(main())
