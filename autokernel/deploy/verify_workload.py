"""The patched model run over the workload (autokernel/deploy/workload.py), one input set at a time: its
outputs against the model in float64, the calls each winner served and those that fell back (with
the reasons), and the times of the model unmodified and patched, and of torch.compile of both.

Each set gets a router of its own, so its tally is its own; the run's tally is their sum.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

# The interpreter runs a Triton program per grid cell in numpy: a patched forward can take seconds.
CPU_TIMING = {"budget_ms": 500.0, "warmup": 1, "min_reps": 3, "max_reps": 10}
GPU_TIMING = {"budget_ms": 2000.0, "warmup": 3, "min_reps": 10, "max_reps": 200}
# the other input sets' patched forwards on the CPU: one, timed once (an interpreter figure anyway,
# and a patched forward of the LLaMA example at 2x128 takes tens of seconds there)
CPU_OTHER_TIMING = {"budget_ms": 0.0, "warmup": 0, "min_reps": 1, "max_reps": 1}
ERRORS = ("max_abs_err", "max_rel_err", "eager_err_vs_reference", "patched_err_vs_reference",
          "eager_max_err_vs_reference", "patched_max_err_vs_reference")


@dataclass
class SetCases:
    """One input set's seeded inputs, with the model's eager and float64 outputs for each."""

    name: str
    profiled: bool
    seeds: tuple
    cases: list = field(default_factory=list)  # [(inputs, eager outputs, reference outputs)]

    @property
    def shapes(self) -> list:
        return [list(x.shape) for x in self.cases[0][0] if hasattr(x, "shape")]


def prepare(loaded: Any, sets: list) -> tuple[list[SetCases], str]:
    """Every set's inputs per seed, eager outputs and float64 reference; (sets, the reference dtype)."""
    from autokernel.deploy.accuracy import reference_outputs
    inputs = [(s, seed, s.make(seed)) for s in sets for seed in s.seeds]
    references, reference_dtype = reference_outputs(loaded, [i for _, _, i in inputs])
    prepared = {s.name: SetCases(s.name, s.profiled, s.seeds) for s in sets}
    for (s, _, x), reference in zip(inputs, references):
        prepared[s.name].cases.append((x, loaded.forward(x), reference))
    return list(prepared.values()), reference_dtype


def compare(loaded: Any, winners: list, sets: list[SetCases]) -> dict:
    """The patched model judged on every set and seed: per set, the verdict, the errors and the
    tally; overall, all of them accepted, the worst errors, and the summed tally."""
    from autokernel.deploy import accuracy, routing
    per_set = []
    for s in sets:
        router = routing.Router(winners)
        with router.patched(loaded.model):
            per_seed = [accuracy.judge(loaded.forward(x), eager, ref) for x, eager, ref in s.cases]
        per_set.append({"name": s.name, "outputs_match": all(p["outputs_match"] for p in per_seed),
                        **{k: max(p[k] for p in per_seed) for k in ERRORS}, "per_seed": per_seed,
                        "tally": router.tally.to_json()})
    profiled = next(p for p, s in zip(per_set, sets) if s.profiled)
    return {"outputs_match": all(p["outputs_match"] for p in per_set),
            **{k: max(p[k] for p in per_set) for k in ERRORS}, "per_seed": profiled["per_seed"],
            "sets": per_set, "tally": merge_tallies([p["tally"] for p in per_set])}


def merge_tallies(tallies: list[dict]) -> dict:
    """The sum of several routers' tallies (Tally.to_json()), in the same form."""
    per_kernel: dict[str, dict] = {}
    per_op: dict[str, dict] = {}
    for tally in tallies:
        for target, k in tally["per_kernel"].items():
            into = per_kernel.setdefault(target, {"kernel_type": k["kernel_type"], "calls_served": 0, "fallbacks": 0,
                                                  "fallback_reasons": Counter(), "served_by_op": Counter(),
                                                  "errors": []})
            into["calls_served"] += k["calls_served"]
            into["fallbacks"] += k["fallbacks"]
            into["fallback_reasons"].update(k["fallback_reasons"])
            into["served_by_op"].update(k["served_by_op"])
            into["errors"] += [e for e in k["errors"] if e not in into["errors"]][:5 - len(into["errors"])]
        for op, o in tally["per_op"].items():
            into = per_op.setdefault(op, {"routed": 0, "fell_back": 0, "reasons": Counter()})
            into["routed"] += o["routed"]
            into["fell_back"] += o["fell_back"]
            into["reasons"].update(o["reasons"])
    plain = lambda d: {k: dict(v) if isinstance(v, Counter) else v for k, v in d.items()}  # noqa: E731
    return {"per_kernel": {t: plain(d) for t, d in per_kernel.items()},
            "per_op": {op: plain(d) for op, d in sorted(per_op.items())}}


def served_summary(tally: dict) -> dict:
    """How much of what the winners could serve they served: calls served, calls of a winner's
    family that fell back (with the reasons), and calls of a winner's kernel type at shapes no
    winner was searched at (another target's, counted apart)."""
    served = sum(k["calls_served"] for k in tally["per_kernel"].values())
    fallbacks = sum(k["fallbacks"] for k in tally["per_kernel"].values())
    reasons: Counter = Counter()
    for k in tally["per_kernel"].values():
        reasons.update(k["fallback_reasons"])
    other = sum(n for o in tally["per_op"].values() for why, n in o["reasons"].items() if why.startswith("no winner at"))
    return {"calls_served": served, "fallbacks": fallbacks, "fallback_reasons": dict(reasons.most_common()),
            "served_share": served / (served + fallbacks) if served + fallbacks else None,
            "calls_without_a_winner": other}


# ---------------------------------------------------------------- timing
def time_forward(loaded: Any, inputs: list, device: str, winners: Optional[list] = None,
                 settings: Optional[dict] = None) -> Any:
    """The model's forward (patched by `winners` when given) on `inputs`, timed."""
    from harness.timing.timer import time_fn
    settings = settings or (GPU_TIMING if device.startswith("cuda") else CPU_TIMING)
    if winners is None:
        return time_fn(lambda: loaded.forward(inputs), device=device, **settings)
    from autokernel.deploy import routing
    with routing.Router(winners).patched(loaded.model):
        return time_fn(lambda: loaded.forward(inputs), device=device, **settings)


def time_compiled(loaded: Any, inputs: list, device: str, winners: Optional[list] = None,
                  settings: Optional[dict] = None) -> dict:
    """torch.compile of the model, unmodified or patched by `winners` (compiled inside the patch,
    after one eager forward that binds the hand-written forms): {"median_us"} or {"error"}.
    Compiling happens on the first call, before the timed ones."""
    import contextlib

    import torch

    from autokernel.deploy import routing
    from harness.timing.timer import time_fn
    settings = settings or (GPU_TIMING if device.startswith("cuda") else CPU_TIMING)
    torch._dynamo.reset()  # every set and variant compiles afresh: no recompile limit reached on the way
    patch = routing.Router(winners).patched(loaded.model) if winners is not None else contextlib.nullcontext()
    try:
        with patch, torch.no_grad():
            if winners is not None:
                loaded.model(*inputs)
            compiled = torch.compile(loaded.model)
            compiled(*inputs)
            return {"median_us": time_fn(lambda: compiled(*inputs), device=device, **settings).median_us}
    except Exception as e:  # noqa: BLE001 (no compiler on the machine, an unsupported op...)
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}


def time_sets(loaded: Any, sets: list[SetCases], device: str, winners: list, compiled: bool,
              log: Callable[[str], None]) -> list[dict]:
    """Per set: eager and patched times on its first seed's inputs; and, when `compiled`, at the
    profiled inputs torch.compile of both (a compile costs tens of seconds: once per variant)."""
    cpu = not device.startswith("cuda")
    rows = []
    for s in sets:
        settings = CPU_OTHER_TIMING if cpu and not s.profiled else None  # the patched model's
        inputs = s.cases[0][0]
        compiling = compiled and s.profiled
        log(f"verify: timing {s.name}: the model unmodified and with {len(winners)} winner(s)"
            + (", and torch.compile of both" if compiling else ""))
        eager = time_forward(loaded, inputs, device)
        patched = time_forward(loaded, inputs, device, winners, settings=settings)
        row = {"eager": eager, "patched": patched, "eager_median_us": eager.median_us,
               "patched_median_us": patched.median_us, "patched_reps": patched.reps,
               "e2e_speedup": eager.median_us / patched.median_us if patched.median_us else None}
        if compiling:
            plain, fast = (time_compiled(loaded, inputs, device, w, settings) for w in (None, winners))
            row.update(compile_median_us=plain.get("median_us"), patched_compile_median_us=fast.get("median_us"),
                       compile_error=plain.get("error") or fast.get("error"),
                       compiled_e2e_speedup=(plain["median_us"] / fast["median_us"]
                                             if plain.get("median_us") and fast.get("median_us") else None))
        rows.append(row)
    return rows
