"""python -m harness FILE [--device cpu|cuda] [--arch sm_90] [--timeout S] [--target JSON]

Prints exactly one verdict JSON object on stdout. Exit status: 0 for PASS and COMPILE_ONLY, 1 for
FAIL, CRASH and TIMEOUT, 2 for a usage error.
"""
from __future__ import annotations

import argparse
import json
import sys

from harness.judge import JudgeUsageError, judge
from harness.kernel_types.registry import Case


def exit_status(verdict: dict) -> int:
    if verdict.get("usage_error"):
        return 2
    return 0 if verdict["verdict"] in ("PASS", "COMPILE_ONLY") else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness", description="Judge one kernel file.")
    p.add_argument("kernel_file")
    p.add_argument("--device", default=None)
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--target", default=None, help="a Case as JSON: the shapes and dtype to time")
    p.add_argument("--json", action="store_true", help="accepted for symmetry; output is always JSON")
    p.add_argument("--no-sandbox", action="store_true",
                   help="run the candidate without the OS sandbox (it gets your file and network rights)")
    ns = p.parse_args(argv)
    try:
        target = Case.from_json(json.loads(ns.target)) if ns.target else None
        verdict = judge(ns.kernel_file, target=target, device=ns.device, arch=ns.arch, timeout_s=ns.timeout,
                        sandbox=not ns.no_sandbox)
    except JudgeUsageError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(verdict))
    if verdict.get("usage_error"):
        print(f"Error: {verdict['usage_error']}", file=sys.stderr)
    return exit_status(verdict)


if __name__ == "__main__":
    raise SystemExit(main())
