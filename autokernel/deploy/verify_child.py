"""`autokernel verify` with the winners inside the OS sandbox.

Verify imports every winner into one process with the model: candidate code, judged but still
LLM-written. So that process works on a copy of the run folder in its own scratch folder, under
Landlock (writes only there and to the compiler caches, no network), with no secrets in its
environment. Only this parent, which never imports a winner, checks the run's records first and
writes the real run's verify.json, from the copy's. Where Landlock is missing the child says so on
stderr and in verify.json.

    python -m autokernel.deploy.verify_child RUN_FOLDER [--device cpu|cuda] [--compile|--no-compile]
        [--train|--no-train] [--steps N] [--no-sandbox]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from autokernel.errors import UserError

FILENAME = "verify.json"


def verify_confined(run_path: str | Path, device: str | None = None, compile_baseline: bool | None = None,
                    sandbox: bool = True, train: bool | None = None, steps: int | None = None) -> dict:
    """Verify the run's winners in a confined child working on a copy of the run; the result, which
    this process writes into the run as verify.json. Raises UserError when the records do not match
    what was judged, or when the child ends without a result."""
    from autokernel.search.seal import require_sealed
    from harness.isolation.process import scrubbed_env
    from harness.judge import sandbox_argv
    from harness.isolation.sandbox import private_caches  # the winners build from source: no candidate's binary
    run = Path(run_path).resolve()
    require_sealed(run, "verify refused")  # checked here, outside the child: never serve unjudged text
    root = str(Path(__file__).resolve().parents[2])  # the folder that holds autokernel/ and harness/
    with tempfile.TemporaryDirectory(prefix="ak-verify-") as tmp:
        copy, scratch_tmp = Path(tmp, "run", run.name), Path(tmp, "tmp")
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns(FILENAME))
        scratch_tmp.mkdir()
        argv = [sys.executable, "-m", "autokernel.deploy.verify_child", str(copy), "--child"]
        argv += sandbox_argv(Path(tmp)) if sandbox else ["--no-sandbox"]
        argv += (["--device", device] if device else []) + _compile_flag(compile_baseline)
        argv += ([] if train is None else ["--train" if train else "--no-train"]) + (["--steps", str(steps)] if steps else [])
        env = scrubbed_env({"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
                            "TMPDIR": str(scratch_tmp), **private_caches(Path(tmp))})
        code = subprocess.call(argv, env=env, cwd=tmp)
        written = copy / FILENAME
        if code != 0 or not written.is_file():
            raise UserError(f"verify ended without a result (exit status {code}); the run is unchanged",
                            "its error is printed above; AUTOKERNEL_DEBUG=1 shows the child's traceback")
        data = written.read_bytes()
    result = json.loads(data)  # only a whole JSON document replaces the run's verify.json
    _write_atomic(run / FILENAME, data)
    return result


def _compile_flag(compile_baseline: bool | None) -> list[str]:
    """None: verify's default (torch.compile timed on a GPU only)."""
    return [] if compile_baseline is None else ["--compile"] if compile_baseline else ["--no-compile"]


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def confine(ns: argparse.Namespace) -> dict:
    """Everything the child does before a winner is imported, in order: a fresh network namespace
    (first: one thread only), Triton's mode for the device, Triton imported, the OS sandbox, the audit
    hook over the copy of the run. Returns what the sandbox enforces; raises UserError for a device
    this machine lacks. (tests/rehearsal runs a first real launch behind exactly this.)"""
    from harness.isolation import audit_policy, namespace, sandbox
    from harness.isolation.sandbox import caches_for_worker
    network = None if ns.no_sandbox else namespace.isolate_for(ns.device)  # first: one thread only
    from autokernel.deploy import verify as verifier
    from autokernel.search.run import RunDir
    model_folder = _model_folder(Path(ns.run))  # the model imports its neighbours
    verifier.choose_device(RunDir(ns.run), ns.device)  # Triton's mode, then Triton, before the rules
    sandbox.import_triton()
    state = sandbox.not_requested() if ns.no_sandbox else sandbox.confine(
        ns.sandbox_write, readable=[model_folder] if model_folder else [], namespace=network)
    sandbox.warn_if_open(state, "autokernel verify")
    reads = [*(state.get("reads") or sandbox.read_roots()), ns.run, *([model_folder] if model_folder else [])]
    caches = [p for p in ns.sandbox_write if not (ns.run + "/").startswith(os.path.realpath(p) + "/")]
    from autokernel.deploy.routing import refusals
    audit_policy.install_for_winners(untrusted=[ns.run], reads=reads, report=refusals.report,
                                     writes=[tempfile.gettempdir(), *caches, *map(str, caches_for_worker())])
    return state


def _child(ns: argparse.Namespace) -> int:
    """The confined side: verify the copy, write its verify.json (with the sandbox in force, and the
    audit hook watching the winners, whose code is what lives in the copy of the run)."""
    try:
        state = confine(ns)
    except UserError as e:
        return _refused(e)
    from autokernel.deploy import verify as verifier
    from autokernel.deploy.routing import KernelRefused
    try:
        verifier.verify(Path(ns.run), device=ns.device, compile_baseline=ns.compile,
                        log=lambda m: print(m, file=sys.stderr, flush=True), train=ns.train, steps=ns.steps)
    except UserError as e:
        return _refused(e)
    except KernelRefused as e:  # a winner reached what no kernel needs: it must not ship
        return _refused(UserError(f"a winner reached an event the audit hook refuses, so verify stopped: {e}",
                                  "judge that target again; its winner does more than a kernel does"))
    path = Path(ns.run) / FILENAME
    data = json.loads(path.read_text(encoding="utf-8"))
    data["sandbox"] = state  # what was enforced, in the record the parent copies back
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


def _refused(e: UserError) -> int:
    if os.environ.get("AUTOKERNEL_DEBUG"):
        raise e
    print(f"Error: {e}", file=sys.stderr)
    return 1


def _model_folder(run: Path) -> str | None:
    try:
        path = json.loads((run / "config.json").read_text(encoding="utf-8"))["model"]["path"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return str(Path(path).resolve().parent)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autokernel.deploy.verify_child")
    p.add_argument("run")
    p.add_argument("--device", default=None)
    p.add_argument("--compile", action="store_true", default=None)
    p.add_argument("--no-compile", action="store_false", dest="compile")
    p.add_argument("--train", action="store_true", default=None)
    p.add_argument("--no-train", action="store_false", dest="train")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--child", action="store_true", help="internal: the confined side")
    p.add_argument("--sandbox-write", action="append", default=[])
    p.add_argument("--no-sandbox", action="store_true")
    ns = p.parse_args(argv)
    if ns.child:
        return _child(ns)
    try:
        result = verify_confined(ns.run, ns.device, ns.compile, sandbox=not ns.no_sandbox, train=ns.train,
                                 steps=ns.steps)
    except UserError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    return 1 if result.get("status") == "failed" else 0


if __name__ == "__main__":
    raise SystemExit(main())
