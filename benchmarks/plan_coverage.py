"""How much of each model's time the plan covers, and what its first rows promise.

    python benchmarks/plan_coverage.py [MODEL ...] [--iters 3] [--json PATH]

Profiles each model on the CPU (by default the examples, examples/kernelbench/*.py and the
transformers GPT-2, LLaMA, BERT and Mixtral of tests/data, built from configs) and prints its
coverage (typed and module targets), typed coverage (the nine kernel types), the plan's total
ceiling, and its first rows: share, FLOPs and bytes per call, ceiling and projection. CPU figures on
a shared machine: the shares move by a few points from run to run; coverage is what to compare.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_MODELS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.py")) + \
    sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples" / "kernelbench").glob("*.py")) + \
    [f"tests/data/hf_{name}.py" for name in ("gpt2", "llama", "bert", "mixtral")]


def measure(path: str, iters: int, peaks: dict) -> dict:
    from autokernel.profile import plan as planner
    from autokernel.profile.modelfile import load_model, spec_from_options
    from autokernel.profile.profiler import profile_model
    prof = profile_model(load_model(spec_from_options(ROOT / path, device="cpu")), iters=iters, warmup=1)
    result = planner.make_plan(prof, peaks)
    rows = [{k: e.get(k) for k in ("target", "share", "flops", "bytes", "ceiling_speedup", "projected_e2e_speedup",
                                   "work", "ceiling_note")}
            for e in result["entries"] if e["kernel_type"] != "other"]
    return {"model": path, "coverage": result["coverage"], "typed_coverage": result["typed_coverage"],
            "total_ceiling_e2e_speedup": result["total_ceiling_e2e_speedup"], "rows": rows}


def _x(value) -> str:
    return "null" if value is None else f"{value:.3g}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--json", help="write every row of every model here")
    args = parser.parse_args()
    from harness.device.peaks import measured_peaks
    peaks = measured_peaks("cpu")
    results = []
    for path in args.models:
        r = measure(path, args.iters, peaks)
        results.append(r)
        print(f"{path}: coverage {r['coverage']:.1%} (typed {r['typed_coverage']:.1%}), "
              f"total ceiling {_x(r['total_ceiling_e2e_speedup'])}")
        for row in r["rows"][:args.rows]:
            flops, nbytes = row["flops"], row["bytes"]
            work = f"{flops / 1e6:.3g} MFLOP, {nbytes / 1e6:.3g} MB" if flops is not None and nbytes else "work not counted"
            print(f"    {row['target']}: {row['share']:.1%}, {work}, ceiling {_x(row['ceiling_speedup'])}, "
                  f"e2e {_x(row['projected_e2e_speedup'])}" + (f" [{row['work']}]" if row.get("work") else ""))
        sys.stdout.flush()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
