"""The child compute-sanitizer watches (harness/verdict/sanitizer.py): each kernel file's kernel_fn
called once at its case on the GPU, synchronized, and a line saying it returned.

    python -m harness.workers.sanitize_child KERNEL_FILE CASE_JSON [...] [--sandbox-write DIR]

With --sandbox-write (the judge's path: a candidate) the child is confined as the judge's worker is
before it imports anything (harness/workers/worker.py's enter_sandbox: Landlock, the socket filter)
and runs the candidate under the same audit hook and launch monitor; without it (benchmarks/
gpu_check.sh over the starters) it runs the files as they are. Nothing here decides anything: the
tool's report is read by the parent.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RETURNED = "sanitize: returned "  # harness/verdict/sanitizer.py reads these lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.workers.sanitize_child")
    p.add_argument("pairs", nargs="+", help="KERNEL_FILE CASE_JSON, repeated")
    p.add_argument("--sandbox-write", action="append", default=[], help="confine the child as the judge's worker")
    p.add_argument("--device", default="cuda", help="cuda; cpu (the Triton interpreter) only to test this child")
    ns = p.parse_args(argv)
    import torch

    from harness.correctness import launches
    from harness.correctness.candidate import import_candidate
    from harness.kernel_types import registry
    from harness.kernel_types.registry import Case
    launches.install()  # the one launch monitor, as judged: before any kernel file is imported
    kernels = [(Path(ns.pairs[i]).resolve(), Case.from_json(json.loads(ns.pairs[i + 1])))
               for i in range(0, len(ns.pairs) - 1, 2)]
    if ns.sandbox_write:
        _confine(ns, kernels[0][0], ns.device)
    for path, case in kernels:
        module = import_candidate(path)
        args, kwargs = registry.build_inputs(case, ns.device)
        module.kernel_fn(*args, **kwargs)
        if ns.device == "cuda":
            torch.cuda.synchronize()
        print(f"{RETURNED}{path.name}", flush=True)
    return 0


def _confine(ns, candidate: Path, device: str) -> None:
    """The judge's worker's sandbox and audit hook, before the candidate is imported."""
    from harness.isolation import audit_policy, sandbox
    from harness.isolation.static_check import allowed_imports
    from harness.workers.worker import enter_sandbox
    confine = argparse.Namespace(no_sandbox=False, sandbox_write=ns.sandbox_write, device=device)
    state = enter_sandbox(confine)
    from harness.correctness.candidate import read_header
    backend = read_header(candidate).get("BACKEND", "triton")
    audit_policy.install_for_candidate(candidate_dir=str(candidate.parent),
                                       records_dir=str(Path(ns.sandbox_write[0], "out")),
                                       sandbox_write=ns.sandbox_write,
                                       reads=state.get("reads") or sandbox.read_roots(),
                                       allowed=allowed_imports(backend))


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    raise SystemExit(code)
