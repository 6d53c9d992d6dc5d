"""Bytes the judge writes per verdict for its timed outputs (harness/timing/timed_outputs.py).

    python benchmarks/timed_output_bytes.py computed    # each type's bench shape on a GPU, from the code path
    python benchmarks/timed_output_bytes.py measured [KERNEL_FILE] [--sample-bytes N]
    python benchmarks/timed_output_bytes.py measured --device cuda --target softmax:4096x32000:float16

`computed` runs nothing on a GPU: for each type at its bench shape in fp16 under the GPU budget it
asks the same functions the worker asks (save_policy, saved_reps, unaffordable) which outputs a
verdict saves, one round and two, and prints their bytes beside the earlier rule's (every call saved,
the reps capped so that all fit SAVE_BYTES, an output taken to be as large as the inputs). Both add
the shape sweep's one call at the target, which a verdict also saves.

`measured` judges a kernel file (the softmax starter by default) at the CPU timing shape and sums
the files its worker wrote, by stage, before the parent's checks; with --sample-bytes it also times
the same kernel in this process with SAVE_BYTES lowered to N, so that only the key's sample is
saved, as at a large target on a GPU, and sums what that wrote. Timings on the CPU mean nothing for
a GPU; bytes do. On a GPU, `measured --device cuda --target ...` gives the figure `computed` predicts.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

if not torch.cuda.is_available():  # the in-process timing runs Triton through its interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from harness.kernel_types import registry  # noqa: E402
from harness.kernel_types.registry import Case  # noqa: E402
from harness.timing.measurement import budget  # noqa: E402

MB = 1e6


def _meta_inputs(case: Case) -> tuple[list, dict, int]:
    """The case's inputs as meta tensors (shapes only: a 4096x32000 target costs nothing), and their bytes."""
    kt = registry.get(case.kernel_type)
    with torch.device("meta"):
        args, kwargs = kt.make_inputs(case, None)
    size = sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor))
    return args, kwargs, size


def _before(input_bytes: int, out_bytes: int, limits: dict, rounds: int) -> int:
    """The earlier rule: every call's output saved; max_reps capped so that SAVE_BYTES // input bytes fit."""
    from harness.timing import timed_outputs
    most = timed_outputs.SAVE_BYTES["cuda"] // max(input_bytes, 1)
    reps = max(limits["min_reps"], min(limits["max_reps"], most))
    return (limits["warmup"] + rounds * reps) * out_bytes


def computed() -> None:
    from harness.timing import timed_outputs
    from harness.timing.device_check import unaffordable
    limits = budget("cuda")
    print(f"{'target':38} {'output':>9} {'before 1 round':>15} {'after 1 round':>14} {'before 2':>10} "
          f"{'after 2':>10}  saved   device check (H100/H200, sm_90)")
    for name in registry.names():
        kt = registry.get(name)
        case = Case.make(name, kt.bench_shape, "float16")
        try:
            args, kwargs, in_bytes = _meta_inputs(case)
        except Exception as e:  # an input generator that needs real data
            print(f"{case.label():38} inputs not made on meta: {type(e).__name__}")
            continue
        policy = timed_outputs.save_policy(case, args, kwargs, "cuda", limits)
        out = policy.output_bytes
        reps = limits["max_reps"]  # a fast kernel runs the budget's max_reps: the sample does not grow with them
        after = {n: len(timed_outputs.saved_reps(policy, 1, limits["warmup"], [reps] * n)) for n in (1, 2)}
        sweep = out  # the shape sweep's call at the target, saved in both
        row = [_before(in_bytes, out, limits, n) + sweep for n in (1, 2)]
        print(f"{case.label():38} {out / MB:8.1f}M {row[0] / MB:14.1f}M {(after[1] * out + sweep) / MB:13.1f}M "
              f"{row[1] / MB:9.1f}M {(after[2] * out + sweep) / MB:9.1f}M  "
              f"{'all' if policy.every else str(after[1]) + '/' + str(after[2]):5}   "
              f"{unaffordable(case, 'cuda', (9, 0)) or 'every rep'}")


def _stage_bytes(out_dir: Path) -> dict[str, int]:
    """Bytes of the worker's saved outputs, by the stage whose records name them."""
    stage_of: dict[str, str] = {}
    for line in (out_dir / "events.jsonl").read_text().splitlines():
        e = json.loads(line)
        names = [e.get("output")] + list(e.get("inputs_after") or []) + list((e.get("held_outputs") or {}).values())
        for n in names:
            if n:
                stage_of[n] = str(e.get("stage"))
    sizes: dict[str, int] = {}
    for f in (out_dir / "tensors").iterdir():
        stage = stage_of.get(f.name, "unnamed")
        sizes[stage] = sizes.get(stage, 0) + f.stat().st_size
    return sizes


def measured(path: Path, sample_bytes: int | None, device: str = "cpu", target: Case | None = None) -> None:
    import harness.judge as judge_module
    seen: dict[str, int] = {}
    assess = judge_module.assess

    def measuring(events, out_dir, *a, **k):  # before the parent's checks, with every file still there
        seen.update(_stage_bytes(Path(out_dir)))
        return assess(events, out_dir, *a, **k)
    judge_module.assess = measuring
    verdict = judge_module.judge(path, device=device, target=target)
    timing = verdict.get("timing") or {}
    where = f"at {target.label()}" if target else "at its timing shape"
    print(f"{path.name} judged on {device} {where}: {verdict['verdict']} {verdict.get('failed_stage') or ''}, "
          f"timed {timing.get('reps')} reps (+ warm-up)")
    for stage, size in sorted(seen.items(), key=lambda kv: -kv[1]):
        print(f"  {stage:14} {size / MB:8.3f} MB")
    print(f"  {'total':14} {sum(seen.values()) / MB:8.3f} MB")
    if sample_bytes:
        _sampled(path, sample_bytes)


def _sampled(path: Path, sample_bytes: int) -> None:
    """The same kernel timed in this process with only the key's sample saved."""
    import importlib.util
    from harness.correctness.cases import Capabilities, timing_case
    from harness.correctness import launches
    from harness.timing import measurement, timed_outputs
    from harness.workers.worker import Log
    spec = importlib.util.spec_from_file_location("measured_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    case = timing_case(module.KERNEL_TYPE, Capabilities("cpu", False), None)
    timed_outputs.SAVE_BYTES = {**timed_outputs.SAVE_BYTES, "cpu": sample_bytes}
    with tempfile.TemporaryDirectory() as tmp:
        monitor = launches.install()
        run = measurement.time_kernel(module.kernel_fn, case, "cpu", None, monitor, Log(Path(tmp)), "timing",
                                      second_look=False, key=int.from_bytes(os.urandom(8), "little") % 2**62)
        files = list(Path(tmp, "tensors").iterdir())
        size = sum(f.stat().st_size for f in files)
    calls = budget("cpu")["warmup"] + sum(r.reps for r in run.rounds)
    print(f"  with SAVE_BYTES at {sample_bytes} B: {len(files)} of {calls} timed outputs saved, "
          f"{size / MB:.3f} MB ({math.ceil(100 * size / max(sample_bytes, 1))}% of that budget)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("computed", "measured"))
    p.add_argument("kernel", nargs="?", type=Path, default=ROOT / "starter_kernels/triton/softmax.py")
    p.add_argument("--sample-bytes", type=int, default=None)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--target", default=None, help="TYPE:DIMS:DTYPE, e.g. softmax:4096x32000:float16 (the "
                                                  "type's dims in its own order); default: the timing shape")
    ns = p.parse_args()
    if ns.mode == "computed":
        computed()
    else:
        measured(ns.kernel, ns.sample_bytes, ns.device, _target(ns.target))


def _target(text: str | None) -> Case | None:
    if not text:
        return None
    kind, dims, dtype = text.split(":")
    names = list(registry.get(kind).bench_shape)
    return Case.make(kind, dict(zip(names, (int(d) for d in dims.split("x")))), dtype)


if __name__ == "__main__":
    main()
