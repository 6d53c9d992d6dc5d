"""compute-sanitizer over every starter and the attack suite's race and out-of-bounds kernels.

    python benchmarks/sanitize_check.py [--work DIR] [--dry-run]

On a GPU with compute-sanitizer (benchmarks/gpu_check.sh's step 8), one child per tool and batch
(harness/verdict/sanitizer.py), the attacks first since they matter most:
- memcheck on tests/attacks' stores_past_the_end softmax: must be a finding;
- racecheck on its racy_block_sum (the CUDA C++ reduce starter without its barrier): must be a finding;
- memcheck, then racecheck, on every Triton starter in one child each, then every CUDA C++ starter:
  must be clean;
- the judge's own path: the softmax starter judged as a kernel about to be kept (time_around), its
  sanitizer runs in a child confined as the judge's worker is: both tools must be clean.
Each at a small case (the type's smoke shape, fp16), so that the runs fit a 15-minute device
budget; the CUDA C++ builds share one cache across the runs (--work). One JSON line per run as it
ends; exit status 1 when an attack went uncaught or a starter was not found clean (a run the tool
could not complete counts: it checked nothing), 0 otherwise; a machine without the tool skips every
run and says so. --dry-run (no GPU) prints the commands it would run.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT, ROOT / "tests" / "attacks"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from harness.verdict import sanitizer  # noqa: E402
from harness.kernel_types import registry  # noqa: E402
from harness.kernel_types.registry import Case  # noqa: E402


def _case(kernel_type: str, dims: dict | None = None) -> dict:
    return Case.make(kernel_type, dims or registry.get(kernel_type).smoke_shape, "float16").to_json()


def runs(work: Path) -> list[tuple[str, str, list[tuple[str, dict]], bool]]:
    """(name, tool, [(kernel file, case)], whether a finding is expected)."""
    import gpu_semantics_kernels as attacks
    oob, race = work / "stores_past_the_end.py", work / "racy_block_sum.py"
    oob.write_text(attacks.STORES_PAST_THE_END, encoding="utf-8")
    race.write_text(attacks.racy_block_sum(), encoding="utf-8")
    out = [("attack: a store past the end", "memcheck", [(str(oob), _case("softmax", {"M": 64, "N": 1000}))], True),
           ("attack: a block sum without its barrier", "racecheck", [(str(race), _case("reduce", {"M": 64, "N": 4096}))], True)]
    for backend in ("triton", "cuda"):
        starters = [(str(ROOT / "starter_kernels" / backend / f"{t}.py"), _case(t)) for t in registry.names()]
        out += [(f"{backend} starters", tool, starters, False) for tool in sanitizer.TOOLS]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=None, help="scratch folder (the CUDA C++ builds' cache)")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per run")
    p.add_argument("--dry-run", action="store_true", help="print the commands; run nothing (no GPU)")
    ns = p.parse_args(argv)
    work = ns.work or Path(tempfile.mkdtemp(prefix="sanitize-"))
    work.mkdir(parents=True, exist_ok=True)
    from harness.isolation.process import child_env
    from harness.isolation.sandbox import private_caches
    env = {**child_env("cuda"), **private_caches(work)}  # one build cache for every run
    wrong = 0
    for name, tool, kernels, expect_finding in runs(work):
        if ns.dry_run:
            args = [a for path, case in kernels for a in (path, json.dumps(case))]
            print(json.dumps({"run": name, "tool": tool, "command": sanitizer.command(
                sanitizer.executable() or "compute-sanitizer", tool, args)[:12] + ["..."]}), flush=True)
            continue
        record = sanitizer.run(tool, kernels, env, ns.timeout, cwd=work)
        ok = record["status"] == ("finding" if expect_finding else "clean")
        wrong += record["status"] != "skipped" and not ok
        print(json.dumps({"run": name, "tool": tool, "kernels": len(kernels), "expected": "finding" if expect_finding
                          else "clean", "status": record["status"], "ok": ok, "detail": record["detail"][:600]}),
              flush=True)
    if not ns.dry_run and sanitizer.executable() is not None:
        wrong += not judged_path()
    return 1 if wrong else 0


def judged_path() -> bool:
    """The softmax starter judged on the GPU as the search judges a kernel it is about to keep."""
    from harness.judge import judge
    case = Case.make("softmax", {"M": 64, "N": 1000}, "float16")
    verdict = judge(ROOT / "starter_kernels" / "triton" / "softmax.py", target=case, device="cuda", time_around=True)
    record = verdict.get("sanitizer") or {}
    statuses = {tool: (record.get(tool) or {}).get("status") for tool in sanitizer.TOOLS}
    ok = verdict["verdict"] == "PASS" and all(s == "clean" for s in statuses.values())
    print(json.dumps({"run": "the judge's path (a sandboxed child)", "verdict": verdict["verdict"], "ok": ok,
                      **{tool: (record.get(tool) or {}).get("detail") for tool in sanitizer.TOOLS}}), flush=True)
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
