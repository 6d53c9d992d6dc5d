"""The judge's wall time per kernel on this machine, split into process start-up, compile, the
kernel's own calls, the rest of the stages, timing and the parent's rechecking.

    python benchmarks/judge_walltime.py [KERNEL_FILE ...]

Target: a full verdict for a small kernel in under 20 s on a 2-core CPU, most of it in the
kernel's own runs. CPU figures: the Triton interpreter.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from harness.judge import judge

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [ROOT / "tests/kernels/good/softmax_rows.py", ROOT / "tests/kernels/good/rmsnorm_twopass.py"]


def main(paths: list[Path]) -> None:
    print(f"{'kernel':28} {'verdict':8} {'total':>7} {'startup':>8} {'compile':>8} {'calls':>7} "
          f"{'stages':>7} {'timing':>7} {'checks':>7}   (seconds)")
    for path in paths:
        start = time.perf_counter()
        v = judge(path, device="cpu")
        total = time.perf_counter() - start
        s = v.get("judge_seconds") or {}
        if not s:
            print(f"{path.name:28} {v['verdict']:8} {total:7.2f}   ({v.get('usage_error', 'not judged')})")
            continue
        fmt = lambda x: f"{x:7.2f}" if isinstance(x, (int, float)) else "      -"  # noqa: E731
        print(f"{path.name:28} {v['verdict']:8} {total:7.2f} {fmt(s['startup']):>8} {fmt(s['compile']):>8} "
              f"{fmt(s['kernel_calls'])} {fmt(s['stages'])} {fmt(s['timing'])} {fmt(s['parent_checks'])}")


if __name__ == "__main__":
    main([Path(p) for p in sys.argv[1:] if not p.endswith("__init__.py")] or DEFAULT)
