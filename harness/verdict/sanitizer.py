"""compute-sanitizer on a GPU: a kernel about to be kept runs once under memcheck and racecheck.

CUDA ships compute-sanitizer: memcheck names an access outside every allocation (a store one
element past an output), racecheck a shared-memory hazard between the threads of a block (a
reduction missing its barrier). Both see what a correct-looking output hides. On a GPU, a kernel the
search is about to keep (judged with the shapes around its target: `judge(..., time_around=True)`)
runs once more under each tool, at the target shape, in a child of its own
(harness/workers/sanitize_child.py: the same sandbox and audit hook as the judge's worker, the
caching allocator off so that every tensor is an allocation of its own and a store past one is
outside it); a finding fails the verdict at `integrity` with the tool's own words. Where the tool
or a GPU is missing the check is skipped and the verdict says so.

    python -m harness.verdict.sanitizer --tool memcheck KERNEL_FILE CASE_JSON [KERNEL_FILE CASE_JSON ...]

runs several kernels in one child (benchmarks/gpu_check.sh: every starter, and the attack suite's
race and out-of-bounds kernels) and prints the report as JSON. The parsing below is tested on the
tool's own output text (tests/harness/verdict/test_sanitizer.py); nothing here needs a GPU but the run.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = ("memcheck", "racecheck")
ERROR_EXIT = 86  # the tool's exit status when it found an error (--error-exitcode)
PREFIX = re.compile(r"^\s*=========\s?")
ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+errors?")
RACE_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards?\s+displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)")
# the first line of one report, after the tool's prefix
REPORT_START = re.compile(r"^(Invalid |Error:|ERROR:|Warning:|WARN|Program hit|Out-of-range|Misaligned|"
                          r"Malloc|Free|Barrier|Potential|Race reported|Uninitialized|Cuda API error)")
NOT_WORDS = ("Saved host backtrace", "Host Frame", "Device Frame")  # frames: where, not what
RETURNED = "sanitize: returned "  # the child's line after each kernel_fn returned and synchronized


@dataclass
class Report:
    """One tool's run, read from its output."""

    tool: str
    errors: int | None = None  # None: no summary line, so the tool did not finish its run
    warnings: int = 0
    findings: list[str] = field(default_factory=list)  # each report in the tool's words, errors first
    returned: list[str] = field(default_factory=list)  # the kernel files whose kernel_fn returned

    def problem(self) -> str | None:
        """The verdict's words for a finding, or None."""
        if not self.errors:
            return None
        first = self.findings[0] if self.findings else "(no report text)"
        return f"compute-sanitizer {self.tool} found {self.errors} error(s): {first}"


def executable() -> str | None:
    """The compute-sanitizer binary: on PATH, or in the CUDA toolkit."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        candidate = Path(home or "", "bin", "compute-sanitizer")
        if home and candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def command(exe: str, tool: str, child_args: list[str], python: str = sys.executable) -> list[str]:
    """The tool around a child that runs each kernel once. API errors are left out: torch and Triton
    probe the driver with calls that fail by design; the kernels' own accesses are what is judged."""
    if tool not in TOOLS:
        raise ValueError(f"unknown tool {tool!r}: use one of {', '.join(TOOLS)}")
    args = [exe, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "20",
            "--report-api-errors", "no"]
    if tool == "racecheck":
        args += ["--racecheck-report", "analysis"]
    return args + [python, "-m", "harness.workers.sanitize_child", *child_args]


def child_env(env: dict[str, str]) -> dict[str, str]:
    """Every tensor its own allocation: PyTorch's caching allocator hands out slices of large blocks,
    inside which a store past a tensor is no error to memcheck."""
    return {**env, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}


def parse(text: str, tool: str) -> Report:
    """A tool's output (its lines prefixed "========="; the child's own lines among them)."""
    report = Report(tool)
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for raw in text.splitlines():
        if raw.startswith(RETURNED):
            report.returned.append(raw[len(RETURNED):].strip())
        if not PREFIX.match(raw):
            continue
        line = PREFIX.sub("", raw).rstrip()
        race = RACE_SUMMARY.search(line)
        summary = ERROR_SUMMARY.search(line)
        if race:
            report.errors, report.warnings = int(race.group(2)), int(race.group(3))
        elif summary and report.errors is None:
            report.errors = int(summary.group(1))
        if REPORT_START.match(line.strip()) and not line.startswith(" "):
            current = [line.strip()]
            blocks.append(current)
        elif current is not None and line.strip() and line.startswith(" "):
            if not line.strip().startswith(NOT_WORDS) and len(current) < 6:
                current.append(line.strip())
        elif not line.strip():
            current = None
    words = ["; ".join(b) for b in blocks if not b[0].startswith(("Warning", "WARN"))]
    report.findings = words + ["; ".join(b) for b in blocks if b[0].startswith(("Warning", "WARN"))]
    return report


def run(tool: str, kernels: list[tuple[str, dict]], env: dict[str, str], timeout_s: float, cwd=None,
        sandbox_write: str | None = None) -> dict:
    """One tool over a child that runs each (kernel file, case as JSON) once: {"tool", "status":
    "clean" | "finding" | "skipped" | "failed", "detail", "errors", "warnings", "findings", "returned"}."""
    from harness.isolation.process import run_isolated
    exe = executable()
    if exe is None:
        return {"tool": tool, "status": "skipped", "detail": "compute-sanitizer is not installed here"}
    args = []
    for path, case in kernels:
        args += [str(path), json.dumps(case)]
    if sandbox_write:
        args += ["--sandbox-write", sandbox_write]
    child = run_isolated(command(exe, tool, args), timeout_s, env=child_env(env), cwd=cwd)
    return outcome(parse(child.stdout + "\n" + child.stderr, tool), child.returncode, child.timed_out,
                   child.stdout + "\n" + child.stderr, len(kernels))


def outcome(report: Report, returncode: int | None, timed_out: bool, text: str, kernels: int) -> dict:
    """The record of one tool's run: a finding, clean, or why it did not say."""
    record = {"tool": report.tool, "errors": report.errors, "warnings": report.warnings,
              "findings": report.findings[:5], "returned": report.returned}
    if report.problem():
        return {**record, "status": "finding", "detail": report.problem()}
    tail = " | ".join(line.strip() for line in text.strip().splitlines()[-6:])
    if timed_out:
        return {**record, "status": "failed", "detail": f"compute-sanitizer {report.tool} did not finish in time"}
    if report.errors is None or returncode not in (0, None):
        return {**record, "status": "failed",
                "detail": f"compute-sanitizer {report.tool} did not complete its run (exit {returncode}): {tail}"}
    if len(report.returned) < kernels:
        return {**record, "status": "failed", "detail": f"a kernel_fn did not return under {report.tool}: {tail}"}
    note = f"; {report.warnings} warning(s): {report.findings[0]}" if report.warnings and report.findings else ""
    return {**record, "status": "clean", "detail": f"compute-sanitizer {report.tool}: 0 errors{note}"}


def check(path: Path, case: dict, env: dict[str, str], timeout_s: float, cwd=None,
          sandbox_write: str | None = None) -> dict:
    """Both tools on one kernel at `case`: {"memcheck": record, "racecheck": record, "problem": the
    first finding's words, or None}. A tool that could not run is a record, not a finding."""
    out: dict = {"problem": None}
    for tool in TOOLS:
        out[tool] = run(tool, [(str(path), case)], env, timeout_s, cwd, sandbox_write)
        if out[tool]["status"] == "finding" and out["problem"] is None:
            out["problem"] = out[tool]["detail"]
    return out


def judged(verdict: dict, path: Path, case, env: dict[str, str], timeout_s: float, scratch: Path,
           sandbox: bool) -> dict:
    """A passing GPU verdict of a kernel about to be kept, with `sanitizer` (both tools' records) and,
    on a finding, turned into a FAIL at `integrity` in the tool's words."""
    record = check(path, case.to_json(), env, timeout_s, cwd=scratch / "cwd",
                   sandbox_write=str(scratch) if sandbox else None)
    verdict = {**verdict, "sanitizer": record}
    if record["problem"] is None:
        return verdict
    stages = [dict(s) for s in verdict.get("stages") or []]
    for stage in stages:
        if stage.get("name") == "integrity":
            stage.update(status="fail", detail=f"{record['problem']} (at {case.label()}, run once under the tool)")
    return {**verdict, "stages": stages, "verdict": "FAIL", "failed_stage": "integrity", "timing": None,
            "roofline": None, "timing_around": None, "serves": None}


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m harness.verdict.sanitizer", description=__doc__.splitlines()[0])
    p.add_argument("--tool", choices=TOOLS, required=True)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("pairs", nargs="+", help="KERNEL_FILE CASE_JSON, repeated")
    ns = p.parse_args(argv)
    if len(ns.pairs) % 2:
        p.error("give each kernel file with its case: KERNEL_FILE CASE_JSON ...")
    kernels = [(ns.pairs[i], json.loads(ns.pairs[i + 1])) for i in range(0, len(ns.pairs), 2)]
    from harness.isolation.process import child_env as judge_env
    record = run(ns.tool, kernels, judge_env("cuda"), ns.timeout)
    print(json.dumps(record, indent=1))
    return 0 if record["status"] in ("clean", "finding", "skipped") else 1


if __name__ == "__main__":
    raise SystemExit(main())
