"""What the op recorder costs a timed call: the host time harness.correctness.integrity.ComputeRecorder (a
TorchDispatchMode, pushed around every timed call since every timed call is watched) adds to a
wrapper's own PyTorch calls. Figures, not a test.

    python benchmarks/recording_overhead.py [--calls 20000] [--device cpu|cuda]

The wrapper is a kernel file's usual host side without its launch (reshape, contiguous,
empty_like, view: the aten ops a wrapper dispatches); a launch itself dispatches no aten op, so it
costs the recorder nothing, and nothing is added on the device. The eager baseline is timed
without the recorder, so its cost can only understate a candidate's speedup.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from harness.correctness.integrity import ComputeRecorder  # noqa: E402
from harness.correctness import launches  # noqa: E402


def wrapper(x):
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    y = torch.empty_like(x2)
    return y.view(shape)


class _Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def per_call_us(fn, calls: int, recorded: bool, monitor) -> float:
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            if recorded:
                with ComputeRecorder(monitor):
                    fn()
            else:
                fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--device", default="cpu")
    ns = p.parse_args(argv)
    x = torch.randn(64, 4096, device=ns.device)
    counter = _Counter()
    with counter:
        wrapper(x)
    monitor = launches.install()
    plain = per_call_us(lambda: wrapper(x), ns.calls, False, monitor)
    recorded = per_call_us(lambda: wrapper(x), ns.calls, True, monitor)
    empty = per_call_us(lambda: None, ns.calls, True, monitor) - per_call_us(lambda: None, ns.calls, False, monitor)
    extra = recorded - plain
    print(f"wrapper: {counter.ops} aten ops per call on {ns.device}")
    print(f"unrecorded {plain:.2f} us per call, recorded {recorded:.2f} us per call: +{extra:.2f} us per call "
          f"(host time, median of 5 rounds), of which {empty:.2f} us push and pop the mode and "
          f"{(extra - empty) / max(counter.ops, 1):.2f} us go to each aten op")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
