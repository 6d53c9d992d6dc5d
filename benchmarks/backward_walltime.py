"""The backward's share of the judge's wall time on the CPU, per Triton starter with a backward.

    python benchmarks/backward_walltime.py [--types rmsnorm,softmax] [--repeat 2] [--out rows.jsonl]

Each starter is judged as `autokernel bench` judges a training target on the CPU (the Triton
interpreter, no target: the type's CPU shapes), inside one judge session. The backward's share is
the worker's time in the backward's stages (the sum of the backward stages' seconds, timing
included) plus the judging process's time reading them (backward_checks.assess and
backward_timing_checks.assess, timed here by wrapping them); the clean worker's training baselines
(eager autograd, torch.compile's joint graph) are the session's, not the backward judge's, and are
shown apart. Rows are printed as each kernel is judged.
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
from harness.verdict import backward_checks, backward_timing_checks  # noqa: E402
from harness.workers.judge_session import judge_session  # noqa: E402

TYPES = ("rmsnorm", "layernorm", "softmax", "reduce", "cross_entropy", "rotary_embedding", "matmul", "fused_mlp",
         "flash_attention")
HEADER = (f"{'kernel':18} {'verdict':8} {'backward':9} {'total':>7} {'baselines':>9} {'forward':>8} "
          f"{'bwd_worker':>10} {'bwd_parent':>10} {'bwd_total':>9}   (seconds)")


class ParentClock:
    """Seconds the judging process spends in the backward's assessment, by wrapping its two readers."""

    def __init__(self):
        self.seconds = 0.0
        for module in (backward_checks, backward_timing_checks):
            module.assess = self._timed(module.assess)

    def _timed(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def row(kernel_type: str, verdict: dict, total_s: float, parent_s: float) -> dict:
    back = verdict.get("backward") or {}
    worker_s = sum(s.get("seconds", 0.0) for s in back.get("stages", []))
    baselines = (verdict.get("judge_seconds") or {}).get("baselines") or 0.0
    return {"kernel": kernel_type, "verdict": verdict["verdict"], "backward": back.get("verdict"),
            "failed_stage": back.get("failed_stage"), "total": total_s, "baselines": baselines,
            "forward": total_s - baselines - worker_s - parent_s, "bwd_worker": worker_s, "bwd_parent": parent_s,
            "bwd_total": worker_s + parent_s,
            "stages": {s["name"]: round(s.get("seconds", 0.0), 3) for s in back.get("stages", [])}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    ns = p.parse_args(argv)
    from starter_kernels import starter_path
    clock = ParentClock()
    rows = []
    print(HEADER, flush=True)
    with judge_session(fork=True):
        for _ in range(ns.repeat):
            for kernel_type in ns.types.split(","):
                start = time.perf_counter()
                verdict = judge(starter_path(kernel_type), device="cpu", backward=True)
                r = row(kernel_type, verdict, time.perf_counter() - start, clock.take())
                rows.append(r)
                print(f"{r['kernel']:18} {r['verdict']:8} {str(r['backward']):9} {r['total']:7.1f} "
                      f"{r['baselines']:9.1f} {r['forward']:8.1f} {r['bwd_worker']:10.1f} {r['bwd_parent']:10.1f} "
                      f"{r['bwd_total']:9.1f}   {r['stages']}", flush=True)
                if ns.out:
                    with open(ns.out, "a", encoding="utf-8") as f:
                        f.write(json.dumps(r) + "\n")
    print(f"backward's share, summed over {len(rows)} judgements: {sum(r['bwd_total'] for r in rows):.1f} s "
          f"(median {statistics.median(r['bwd_total'] for r in rows):.1f} s per kernel); the rest of the judge "
          f"without baselines: {sum(r['forward'] for r in rows):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
