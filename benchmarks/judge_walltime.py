"""The judge's wall time per kernel, split by phase: worker start-up, the baselines (timed in the clean
baseline worker, once per target and shape per session: 0 where reused), the null call's calibration, compile, the kernel's own calls,
the rest of the stages, the candidate's timing, the parent's rechecks.

    python benchmarks/judge_walltime.py [--device cpu] [--no-fork] [KERNEL_FILE ...]
    python benchmarks/judge_walltime.py --device cuda [--repeat 2] [--types matmul,softmax] [--backends triton]
                                        [--out rows.jsonl]

On the CPU (the Triton interpreter): the given kernels (two small good ones by default) at the
CPU stage shapes. On a GPU: every starter, Triton and CUDA C++, at its bench shape in fp16 with the
torch.compile baseline, as `autokernel bench --suite starters` judges them; target: at most 10 s per
candidate. Both run inside one judge session, as `optimize` does (the pre-imported worker, one
compile baseline per target); --no-fork spawns a worker per kernel, as before. With --repeat 2 the
second round shows what a search's later candidates of a target cost. Each row is printed (and
appended to --out as JSON) as soon as its kernel is judged, so a run cut short keeps what it did.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.judge import judge  # noqa: E402
from harness.workers.judge_session import judge_session  # noqa: E402

DEFAULT = [ROOT / "tests/data/kernels/good/softmax_rows.py", ROOT / "tests/data/kernels/good/rmsnorm_twopass.py"]
PHASES = ("startup", "baselines", "compile", "kernel_calls", "stages", "timing", "calibration", "parent_checks")
HEADER = (f"{'kernel':34} {'round':>5} {'verdict':13} {'total':>7} {'startup':>8} {'eager':>7} {'compile':>8} "
          f"{'calls':>7} {'stages':>7} {'timing':>7} {'baseline':>8} {'checks':>7} worker   (seconds)")


def _fmt(x, width: int = 7) -> str:
    return f"{x:{width}.2f}" if isinstance(x, (int, float)) else " " * (width - 1) + "-"


def jobs(device: str, paths: list[Path], types: list[str] | None,
         backends: tuple[str, ...] = ("triton", "cuda")) -> list[tuple[str, Path, object]]:
    """(name, file, target case or None) for each kernel to judge."""
    if device == "cpu" and paths:
        return [(p.name, p, None) for p in paths]
    if device == "cpu":
        return [(p.name, p, None) for p in DEFAULT]
    from autokernel.judging.suite import suite_targets
    from starter_kernels import starter_path
    out = []
    for case in suite_targets("cuda"):
        if types and case.kernel_type not in types:
            continue
        for backend in backends:
            out.append((f"{case.label()} {backend}", starter_path(case.kernel_type, backend), case))
    return out


def row(name: str, round_no: int, verdict: dict, total_s: float) -> dict:
    split = verdict.get("judge_seconds") or {}
    return {"kernel": name, "round": round_no, "verdict": verdict["verdict"], "total": total_s,
            **{k: split.get(k) for k in PHASES}, "worker": split.get("worker"),
            "compile_cached": bool((verdict.get("timing") or {}).get("compile_cached")),
            "note": verdict.get("usage_error")}


def print_row(r: dict) -> None:
    print(f"{r['kernel'][:34]:34} {r['round']:5d} {r['verdict']:13} {_fmt(r['total'])} {_fmt(r['startup'], 8)} "
          f"{_fmt(r['baselines'])} {_fmt(r['compile'], 8)} {_fmt(r['kernel_calls'])} {_fmt(r['stages'])} {_fmt(r['timing'])} "
          f"{_fmt(r['calibration'], 8)} {_fmt(r['parent_checks'])} {r['worker'] or '-'}", flush=True)


def summary(rows: list[dict], limit_s: float | None) -> str:
    totals = [r["total"] for r in rows]
    text = f"{len(rows)} judged: median {statistics.median(totals):.2f} s, max {max(totals):.2f} s per kernel"
    later = [r["total"] for r in rows if r["round"] > 1]
    if later:
        text += f"; later rounds median {statistics.median(later):.2f} s, max {max(later):.2f} s"
    if limit_s is not None:
        worst = max(later or totals)
        text += f"; target <= {limit_s:.0f} s: {'met' if worst <= limit_s else 'NOT met'}"
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="*", type=Path)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--repeat", type=int, default=None, help="rounds over the kernels (cuda: 2, cpu: 1)")
    p.add_argument("--types", default=None, help="cuda: only these kernel types, comma-separated")
    p.add_argument("--backends", default="triton,cuda", help="cuda: the starters' backends to judge")
    p.add_argument("--no-fork", action="store_true", help="spawn a worker per kernel (no zygote)")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--out", type=Path, default=None, help="append each row here as one JSON line")
    ns = p.parse_args(argv)
    paths = [x for x in ns.paths if not x.name.endswith("__init__.py")]
    todo = jobs(ns.device, paths, ns.types.split(",") if ns.types else None, tuple(ns.backends.split(",")))
    repeat = ns.repeat or (2 if ns.device == "cuda" else 1)
    print(HEADER, flush=True)
    rows: list[dict] = []
    with judge_session(fork=not ns.no_fork):
        for round_no in range(1, repeat + 1):
            for name, path, case in todo:
                start = time.perf_counter()
                verdict = judge(path, target=case, device=ns.device, timeout_s=ns.timeout,
                                compile_baseline=ns.device == "cuda")
                rows.append(row(name, round_no, verdict, time.perf_counter() - start))
                print_row(rows[-1])
                if ns.out:
                    with open(ns.out, "a", encoding="utf-8") as f:
                        f.write(json.dumps(rows[-1]) + "\n")
    print(summary(rows, 10.0 if ns.device == "cuda" else None), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
