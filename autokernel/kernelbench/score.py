"""Scoring a KernelBench run the way KernelBench reports results, and exporting it in KernelBench's
own layout.

fast_p is the fraction of ALL problems of the run that are correct and more than p times faster
than the baseline (so fast_0 is the fraction correct); the geometric mean speedup is taken over
the correct problems. Both against eager PyTorch and against torch.compile. A correct problem
whose torch.compile baseline could not be measured counts for fast_0 only and is left out of the
compile geometric mean; the score says how many there were.

A run stores its per-problem best in kernelbench.json (written by `autokernel kernelbench run`):

    {"kind": "autokernel-kernelbench", "version": 1, "level": 1, "precision": "fp32", "device": "cuda",
     "problems": [{"key": "19_ReLU", "level": 1, "problem_id": 19, "name": "ReLU", "path": "...",
                   "solution": "best/19_ReLU.py" | null, "correct": true, "verdict": "PASS",
                   "speedup_vs_eager": 1.8, "speedup_vs_compile": 1.1, "median_us": 12.5,
                   "flags": [], "experiments": 7}, ...]}
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from autokernel.errors import UserError

P_VALUES = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
BASELINES = ("eager", "compile")
SUMMARY_FILE = "kernelbench.json"
SUMMARY_KIND = "autokernel-kernelbench"


@dataclass
class ProblemResult:
    key: str
    correct: bool
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    level: int | None = None
    problem_id: int | None = None
    solution: str | None = None  # relative to the run folder
    flags: list[str] = field(default_factory=list)

    def speedup(self, baseline: str) -> float | None:
        return self.speedup_vs_eager if baseline == "eager" else self.speedup_vs_compile

    @staticmethod
    def from_json(d: dict) -> "ProblemResult":
        return ProblemResult(d["key"], bool(d.get("correct")), d.get("speedup_vs_eager"),
                             d.get("speedup_vs_compile"), d.get("level"), d.get("problem_id"),
                             d.get("solution"), list(d.get("flags") or []))


def fast_p(results: list[ProblemResult], p: float, baseline: str = "eager") -> float:
    """Fraction of all problems that are correct and have speedup > p (p = 0: correct)."""
    if not results:
        return 0.0
    hits = 0
    for r in results:
        s = r.speedup(baseline)
        hits += r.correct and (p == 0 or (s is not None and s > p))
    return hits / len(results)


def geomean_speedup(results: list[ProblemResult], baseline: str = "eager") -> tuple[float | None, int]:
    """(geometric mean of the speedups of the correct problems, how many had one)."""
    logs = [math.log(s) for r in results if r.correct and (s := r.speedup(baseline)) and s > 0]
    return (math.exp(sum(logs) / len(logs)) if logs else None), len(logs)


def score(results: list[ProblemResult]) -> dict:
    out: dict = {"problems": len(results), "correct": sum(r.correct for r in results),
                 "fast_p": {}, "geomean_speedup": {}, "geomean_over": {}}
    for b in BASELINES:
        out["fast_p"][b] = {f"{p:g}": fast_p(results, p, b) for p in P_VALUES}
        out["geomean_speedup"][b], out["geomean_over"][b] = geomean_speedup(results, b)
    out["missing_compile_baseline"] = sum(r.correct and r.speedup_vs_compile is None for r in results)
    out["flagged"] = sorted(r.key for r in results if r.correct and r.flags)
    return out


def summary_path(run: str | Path, runs_dir: str | Path = "runs") -> Path:
    """kernelbench.json of a run given as an id under runs_dir, a run folder, or the file itself."""
    for candidate in (Path(run), Path(run) / SUMMARY_FILE, Path(runs_dir) / str(run) / SUMMARY_FILE):
        if candidate.is_file():
            return candidate
    raise UserError(f"no KernelBench results for {run!r} (looked for {SUMMARY_FILE} in {run} and "
                    f"{Path(runs_dir) / str(run)})", "pass a run id or folder that `autokernel kernelbench run` wrote")


def load_results(path: Path) -> tuple[dict, list[ProblemResult]]:
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UserError(f"{path} is not valid JSON: {e}") from None
    if summary.get("kind") != SUMMARY_KIND:
        raise UserError(f"{path} is not a KernelBench run summary (kind {summary.get('kind')!r})")
    return summary, [ProblemResult.from_json(p) for p in summary.get("problems", [])]


def export(results: list[ProblemResult], run_dir: Path, out_dir: Path) -> tuple[list[Path], list[str]]:
    """The best correct ModelNew of each problem as KernelBench's evaluation reads a run:
    level_{L}_problem_{id}_sample_0_kernel.py. Returns (files written, problems skipped and why).
    The run's records are checked first: only what was judged is exported."""
    from autokernel.search.seal import require_sealed
    require_sealed(run_dir, "kernelbench score --export refused")
    out_dir.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for r in results:
        if not r.correct or not r.solution:
            skipped.append(f"{r.key}: no correct solution")
            continue
        if r.level is None or r.problem_id is None:
            skipped.append(f"{r.key}: level or problem id unknown")
            continue
        source = run_dir / r.solution
        if not source.is_file():
            skipped.append(f"{r.key}: {source} is missing")
            continue
        dest = out_dir / f"level_{r.level}_problem_{r.problem_id}_sample_0_kernel.py"
        shutil.copyfile(source, dest)
        written.append(dest)
    return written, skipped
