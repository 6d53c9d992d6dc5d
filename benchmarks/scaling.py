"""Candidates judged per minute against the number of judge workers, for an offline-tuner search
whose candidates are judged on the CPU (Triton interpreter) by the real judge.

The starter's baseline is judged once into a template run; each worker count then continues a copy
of it for the same number of tuner proposals, so what is timed is the search with candidates in
flight, not the baseline judged alone. Compare figures from one machine at one load only: the load
average before and after each row is printed with it. Run:

    python benchmarks/scaling.py [--workers 1,2,4] [--candidates 8]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autokernel.search import loop, run_search  # noqa: E402
from autokernel.search.run import RunDir, RunState, TargetState  # noqa: E402
from autokernel.search.slots import LocalSlots, local_slots  # noqa: E402

TARGET = dict(name="softmax[16x256:float32]", kernel_type="softmax", dims={"M": 16, "N": 256},
              dtype="float32", share=1.0)


def search(run: RunDir, experiments: int, workers: int) -> tuple[int, float]:
    """(candidates judged, wall seconds) of a search continued from the run's saved state."""
    state = run.load_state()
    state.targets[0].status = "pending"
    done_before = len(state.targets[0].history)
    settings = loop.SearchSettings(max_experiments=experiments, plateau=10**6, device="cpu", timeout_s=600)
    slots = LocalSlots(loop.default_judge, local_slots("cpu", workers))
    start = time.perf_counter()
    try:
        run_search.search_all(run, state, settings, run_search.proposer_factory("tune", seed=0),
                              starter_source=run_search.starter_sources(run), judge=loop.default_judge, slots=slots)
    finally:
        slots.close()
    return len(state.targets[0].history) - done_before, time.perf_counter() - start


def template(folder: Path) -> RunDir:
    """A run whose baseline is judged: the starting point every worker count continues."""
    run = RunDir(folder / "template")
    run.create()
    run.save_state(RunState(run_id="template", agent="tune", budget_s=10**9, targets=[TargetState(**TARGET)]))
    search(run, 0, 1)
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = "1,2,4" if (os.cpu_count() or 1) >= 4 else "1,2"
    parser.add_argument("--workers", default=default, help=f"worker counts to time (default {default})")
    parser.add_argument("--candidates", type=int, default=8, help="tuner proposals per worker count")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory(prefix="ak-scaling-") as tmp:
        base = template(Path(tmp))
        print(f"{'workers':>7} {'candidates':>10} {'wall_s':>8} {'per_min':>8} {'vs_1':>6}  load average (before -> after)")
        first = None
        for workers in counts:
            folder = Path(tmp) / f"w{workers}"
            shutil.copytree(base.path, folder)
            load_before = os.getloadavg()[0]
            judged, wall_s = search(RunDir(folder), args.candidates, workers)
            per_min = judged / wall_s * 60.0
            first = first or per_min
            print(f"{workers:>7} {judged:>10} {wall_s:>8.1f} {per_min:>8.2f} {per_min / first:>5.2f}x"
                  f"  {load_before:.2f} -> {os.getloadavg()[0]:.2f}", flush=True)
    print(f"\n{os.cpu_count()} CPUs; candidates judged by the real judge under the Triton interpreter")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
