"""`autokernel verify` with the winners inside the OS sandbox.

Verify imports every winner into one process with the model: candidate code, judged but still
LLM-written. So that process works on a copy of the run folder in its own scratch folder, under
Landlock (writes only there and to the compiler caches, no network), with no secrets in its
environment; only this parent, which never imports a winner, writes the real run's verify.json,
from the copy's. Where Landlock is missing the child says so on stderr and in verify.json.

    python -m autokernel.verify_child RUN_FOLDER [--device cpu|cuda] [--compile]
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

FILENAME = "verify.json"


def verify_confined(run_path: str | Path, device: str | None = None, compile_baseline: bool = False,
                    sandbox: bool = True) -> int:
    """Run `autokernel verify` on a copy of the run, confined; copy its verify.json back. Returns the
    child's exit status (0: the winners serve the model with the same outputs)."""
    from harness.isolation import scrubbed_env
    from harness.judge import sandbox_argv
    run = Path(run_path).resolve()
    root = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory(prefix="ak-verify-") as tmp:
        copy, scratch_tmp = Path(tmp, "run", run.name), Path(tmp, "tmp")
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns(FILENAME))
        scratch_tmp.mkdir()
        argv = [sys.executable, "-m", "autokernel.verify_child", str(copy), "--child"]
        argv += sandbox_argv(Path(tmp)) if sandbox else ["--no-sandbox"]
        argv += (["--device", device] if device else []) + (["--compile"] if compile_baseline else [])
        env = scrubbed_env({"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
                            "TMPDIR": str(scratch_tmp)})
        code = subprocess.call(argv, env=env, cwd=tmp)
        result = copy / FILENAME
        if result.is_file():
            _write_atomic(run / FILENAME, result.read_bytes())
    return code


def _write_atomic(path: Path, data: bytes) -> None:
    json.loads(data)  # only a whole JSON document replaces the run's verify.json
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _child(ns: argparse.Namespace) -> int:
    from harness import sandbox
    state = sandbox.not_requested() if ns.no_sandbox else sandbox.confine(ns.sandbox_write)
    sandbox.warn_if_open(state, "autokernel verify")
    argv = ["verify", ns.run] + (["--device", ns.device] if ns.device else []) + (["--compile"] if ns.compile else [])
    from autokernel import cli
    sys.argv = ["autokernel", *argv]  # the CLI's own entry point: its error lines and exit statuses
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    else:
        code = 0
    path = Path(ns.run) / FILENAME
    if path.is_file():  # what was enforced, in the record the parent copies back
        data = json.loads(path.read_text(encoding="utf-8"))
        data["sandbox"] = state
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autokernel.verify_child")
    p.add_argument("run")
    p.add_argument("--device", default=None)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--child", action="store_true", help="internal: the confined side")
    p.add_argument("--sandbox-write", action="append", default=[])
    p.add_argument("--no-sandbox", action="store_true")
    ns = p.parse_args(argv)
    if ns.child:
        return _child(ns)
    return verify_confined(ns.run, ns.device, ns.compile, sandbox=not ns.no_sandbox)


if __name__ == "__main__":
    raise SystemExit(main())
