"""`autokernel verify`: the run's winners inside the unmodified model, compared with the model as it is.

The model file is loaded exactly as the run profiled it (the ModelSpec in config.json). Each
winner (best/<target>.py) serves the calls that match it through autokernel.routing: ops through a
TorchFunctionMode, hand-written forms through the modules the plan recorded. The patched model's
outputs are compared with the unmodified model's over several fresh seeded inputs, relative to the
rms of each output (routing.TOLERANCE: fp32 1e-4, fp16 1e-2, bf16 2e-2); both are timed; the
measured end-to-end speedup is reported beside the Amdahl projection from the plan's shares and
the winners' own speedups. When the outputs differ, each winner is tried alone to find the guilty
one(s); they are named in verify.json, and `export` leaves them out.

On the CPU the kernels run in the Triton interpreter (TRITON_INTERPRET=1 is set here, before any
kernel file is imported); every time is then a CPU-interpreter figure and labelled so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

from autokernel.errors import UserError
from autokernel.run import RunDir, target_slug, write_json_atomic

FILENAME = "verify.json"
SEEDS = (0, 1, 2)
# The interpreter runs a Triton program per grid cell in numpy: a patched forward can take seconds.
CPU_TIMING = {"budget_ms": 500.0, "warmup": 1, "min_reps": 3, "max_reps": 10}
GPU_TIMING = {"budget_ms": 2000.0, "warmup": 3, "min_reps": 10, "max_reps": 200}
Log = Callable[[str], None]


def run_folder(run: str | Path, runs_dir: str | Path) -> Path:
    """A run given as a folder or as an id under runs_dir."""
    for path in (Path(run), Path(runs_dir) / str(run)):
        if (path / "state.json").is_file():
            return path
    known = sorted(p.parent.name for p in Path(runs_dir).glob("*/state.json"))[-5:]
    raise UserError(f"no run {run!r} under {runs_dir}",
                    f"pass a run folder or one of: {', '.join(known) or 'none (run autokernel optimize first)'}")


@dataclass
class WinnerFile:
    """A target's best kernel on disk, with what routing and the projection need to know of it."""

    target: str
    kernel_type: str
    dims: dict
    dtype: str
    path: Path
    kwargs: dict = field(default_factory=dict)
    route: str = "op"
    modules: list = field(default_factory=list)
    share: float = 0.0
    speedup_vs_eager: Optional[float] = None
    experiment: Optional[int] = None

    @property
    def module_name(self) -> str:
        return "autokernel_winner_" + target_slug(self.target).replace("-", "_").replace(".", "_").replace("=", "_")


def winner_files(run: RunDir) -> list[WinnerFile]:
    """Every target with a best kernel, in plan order, joined with its plan entry (route, modules)."""
    state, plan = run.load_state(), _read_plan(run)
    by_rank = {e.get("rank"): e for e in plan.get("entries", [])}
    by_name = {e.get("target"): e for e in plan.get("entries", [])}
    found = []
    for t in state.targets:
        path = run.best_file(t)
        if t.best_experiment is None or not path.is_file():
            continue
        entry = by_rank.get(t.rank) or by_name.get(t.name.split("#")[0].replace(",causal]", "]"), {})
        found.append(WinnerFile(target=t.name, kernel_type=t.kernel_type, dims=dict(t.dims), dtype=t.dtype,
                                path=path, kwargs=dict(t.kwargs), route=entry.get("route") or "op",
                                modules=list(entry.get("modules", [])), share=t.share,
                                speedup_vs_eager=t.speedup_vs_eager, experiment=t.best_experiment))
    return found


def _read_plan(run: RunDir) -> dict:
    import json
    try:
        return json.loads(run.plan_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def load_winners(files: list[WinnerFile]) -> tuple[list, dict[str, str]]:
    """The kernels imported in this process, and why any failed to import (it is then guilty)."""
    from autokernel import routing
    winners, failed = [], {}
    for f in files:
        try:
            module = routing.load_kernel(f.path, f.module_name)
        except Exception as e:  # noqa: BLE001 (a judged file should import; report whatever it raised)
            failed[f.target] = f"importing {f.path.name} raised {type(e).__name__}: {e}"
            continue
        winners.append(routing.Winner(target=f.target, kernel_type=f.kernel_type, dims=f.dims, dtype=f.dtype,
                                      kernel_fn=module.kernel_fn, kwargs=f.kwargs, route=f.route, modules=f.modules))
    return winners, failed


# ---------------------------------------------------------------- comparing and timing
def compare(loaded: Any, winners: list, cases: list[tuple[list, Any]]) -> dict:
    """The patched model against the unmodified one's outputs (`cases`: (inputs, reference))."""
    from autokernel import routing
    router = routing.Router(winners)
    per_seed, match = [], True
    with router.patched(loaded.model):
        for inputs, expected in cases:
            out = loaded.forward(inputs)
            errors = [routing.error_vs(o, r) for o, r in zip(routing.tensors_of(out), routing.tensors_of(expected))]
            ok = routing.same_result(out, expected)
            match = match and ok
            per_seed.append({"outputs_match": ok, "max_abs_err": max((e[0] for e in errors), default=0.0),
                             "max_rel_err": max((e[1] for e in errors), default=0.0)})
    return {"outputs_match": match, "max_abs_err": max(s["max_abs_err"] for s in per_seed),
            "max_rel_err": max(s["max_rel_err"] for s in per_seed), "per_seed": per_seed, "tally": router.tally.to_json()}


def find_guilty(loaded: Any, winners: list, cases: list, tally: dict) -> dict[str, str]:
    """Winners that raised inside the model, or that change its outputs on their own."""
    guilty = {t: "raised inside the model: " + "; ".join(k["errors"])
              for t, k in tally["per_kernel"].items() if k["errors"]}
    for w in winners:
        if w.target in guilty:
            continue
        alone = compare(loaded, [w], cases)
        if not alone["outputs_match"]:
            guilty[w.target] = (f"alone it changes the model's outputs (max error {alone['max_rel_err']:.3g} "
                                "of the output's rms)")
    return guilty


def time_forward(loaded: Any, inputs: list, device: str, winners: Optional[list] = None) -> Any:
    from harness.timing import time_fn
    settings = GPU_TIMING if device.startswith("cuda") else CPU_TIMING
    if winners is None:
        return time_fn(lambda: loaded.forward(inputs), device=device, **settings)
    from autokernel import routing
    with routing.Router(winners).patched(loaded.model):
        return time_fn(lambda: loaded.forward(inputs), device=device, **settings)


def time_compiled(loaded: Any, inputs: list, device: str) -> dict:
    """torch.compile of the unmodified model: a second baseline, as a user would get it for free."""
    import torch
    from harness.timing import time_fn
    settings = GPU_TIMING if device.startswith("cuda") else CPU_TIMING
    try:
        compiled = torch.compile(loaded.model)

        def forward() -> Any:
            with torch.no_grad():
                return compiled(*inputs)
        return {"median_us": time_fn(forward, device=device, **settings).median_us}
    except Exception as e:  # noqa: BLE001 (no compiler on the machine, an unsupported op...)
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}


# ---------------------------------------------------------------- the command
def verify(run_path: str | Path, device: Optional[str] = None, compile_baseline: bool = False,
           seeds: tuple[int, ...] = SEEDS, log: Optional[Log] = None) -> dict:
    """Verify a run's winners inside its model; writes and returns verify.json."""
    from autokernel.modelfile import ModelSpec, load_model
    log = log or (lambda message: None)
    run = RunDir(run_path)
    spec = ModelSpec.from_json(run.load_config()["model"])
    spec.device = device or spec.device
    if spec.device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise UserError(f"the run's model is on {spec.device} but this machine has no usable CUDA device",
                            "verify on a machine with a GPU, or pass --device cpu (Triton interpreter)")
    else:
        # read when a kernel file's @triton.jit runs: the kernel files are imported below, after this
        os.environ["TRITON_INTERPRET"] = "1"
    files = winner_files(run)
    loaded = load_model(spec)
    winners, failed = load_winners(files)
    cases = [(inputs, loaded.forward(inputs)) for inputs in (loaded.make_inputs(s) for s in seeds)]
    log(f"verify: {len(winners)} winner(s) inside {Path(spec.path).name} on {spec.device}, {len(seeds)} seeded inputs")
    full = compare(loaded, winners, cases)
    guilty = dict(failed)
    if not full["outputs_match"] or any(k["errors"] for k in full["tally"]["per_kernel"].values()):
        log("verify: outputs differ (or a kernel raised): trying each winner alone")
        guilty.update(find_guilty(loaded, winners, cases, full["tally"]))
    clean = [w for w in winners if w.target not in guilty]
    rest = compare(loaded, clean, cases) if len(clean) < len(winners) else full
    if not rest["outputs_match"]:  # they disagree only together: none of them can be trusted
        guilty.update({w.target: "changes the outputs together with the others" for w in clean})
        clean = []
    log(f"verify: timing the model unmodified and with {len(clean)} winner(s)")
    eager = time_forward(loaded, cases[0][0], spec.device)
    patched = time_forward(loaded, cases[0][0], spec.device, clean)
    result = _result(run, spec, files, full, rest, guilty, clean, eager, patched, seeds)
    if compile_baseline:
        log("verify: timing torch.compile of the unmodified model")
        compiled = time_compiled(loaded, cases[0][0], spec.device)
        result["compile_median_us"] = compiled.get("median_us")
        result["compile_error"] = compiled.get("error")
        result["e2e_speedup_vs_compile"] = (compiled["median_us"] / patched.median_us
                                            if compiled.get("median_us") else None)
    write_json_atomic(run.path / FILENAME, result)
    return result


def _result(run: RunDir, spec: Any, files: list[WinnerFile], full: dict, rest: dict, guilty: dict,
            clean: list, eager: Any, patched: Any, seeds: tuple) -> dict:
    from autokernel.plan import CPU_NOTE, amdahl_many
    from harness.judge import versions
    from harness.peaks import device_name
    served = {w.target for w in clean}
    on_cpu = not spec.device.startswith("cuda")
    per_kernel = {}
    for f in files:
        counts = full["tally"]["per_kernel"].get(f.target, {"calls_served": 0, "fallbacks": 0, "fallback_reasons": {},
                                                           "served_by_op": {}, "errors": []})
        per_kernel[f.target] = {
            "kernel_type": f.kernel_type, "dims": f.dims, "dtype": f.dtype, "kwargs": f.kwargs, "route": f.route,
            "file": run.relative(f.path), "experiment": f.experiment, "share": f.share,
            "kernel_speedup_vs_eager": f.speedup_vs_eager, **{k: v for k, v in counts.items() if k != "kernel_type"},
            "guilty": f.target in guilty, "guilty_reason": guilty.get(f.target)}
    projected = amdahl_many((f.share, f.speedup_vs_eager) for f in files if f.target in served and f.speedup_vs_eager)
    return {
        "run_id": run.run_id, "created": datetime.now().isoformat(timespec="seconds"),
        "device": spec.device, "device_name": device_name(spec.device), "cpu_figures": on_cpu,
        **({"note": CPU_NOTE + "; kernels ran in the Triton interpreter"} if on_cpu else {}),
        "model": spec.to_json(), "seeds": list(seeds), "forwards_per_check": len(seeds),
        "tolerance_rel_rms": _tolerance(), "outputs_match": full["outputs_match"],
        "max_abs_err": full["max_abs_err"], "max_rel_err": full["max_rel_err"], "per_seed": full["per_seed"],
        "guilty": sorted(guilty), "outputs_match_without_guilty": rest["outputs_match"] if guilty else None,
        "ok": full["outputs_match"] and not guilty,
        "patched_targets": sorted(served),
        "eager_median_us": eager.median_us, "patched_median_us": patched.median_us,
        "e2e_speedup": eager.median_us / patched.median_us if patched.median_us else None,
        "projected_e2e_speedup": projected, "timing_method": eager.method,
        "per_kernel": per_kernel, "per_op": full["tally"]["per_op"], "versions": versions(),
    }


def _tolerance() -> dict:
    from autokernel.routing import TOLERANCE
    return dict(TOLERANCE)


def after_optimize(run_path: str | Path, log: Log) -> int:
    """`autokernel verify` at the end of `optimize`, in its own process (a kernel that crashes the
    interpreter cannot take the run with it). Never raises: the run is kept whatever happens."""
    from autokernel.verify_child import verify_confined
    try:  # the winners run in a sandboxed child on a copy of the run; only this process writes the run
        code = verify_confined(run_path)
    except OSError as e:
        code = -1
        log(f"verify could not start: {e}")
    if code != 0:
        log(f"verify did not pass (exit {code}); the run is kept: see {Path(run_path) / FILENAME}, "
            f"or rerun `autokernel verify {run_path}`")
    return code


def summary_table(result: dict) -> Any:
    """verify.json as a rich Table: per target, calls served and fallbacks; the e2e result below."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    cpu = " (CPU figures: Triton interpreter)" if result.get("cpu_figures") else ""
    table = Table(title=f"verify {result['run_id']} on {result['device_name']}{cpu}", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for name in ("target", "route", "served", "fallbacks", "main fallback reason", "kernel vs eager", "verdict"):
        table.add_column(name, justify="right" if name in ("served", "fallbacks", "kernel vs eager") else "left",
                         overflow="fold")
    for target, k in result["per_kernel"].items():
        reasons = k.get("fallback_reasons") or {}
        reason = max(reasons, key=reasons.get) if reasons else ""
        speedup = k.get("kernel_speedup_vs_eager")
        table.add_row(escape(target), k["route"], str(k["calls_served"]), str(k["fallbacks"]), escape(reason[:60]),
                      f"{speedup:.3g}x" if speedup else "", "[red]GUILTY[/]" if k["guilty"] else "[green]ok[/]")
    match = "match" if result["outputs_match"] else "DIFFER"
    e2e = result.get("e2e_speedup")
    table.caption = (f"outputs {match} (max error {result['max_rel_err']:.3g} of the output's rms over "
                     f"{len(result['seeds'])} seeded inputs); end to end {e2e:.3g}x measured"
                     f" vs {result['projected_e2e_speedup']:.3g}x projected"
                     + (f"; {result['e2e_speedup_vs_compile']:.3g}x vs torch.compile"
                        if result.get("e2e_speedup_vs_compile") else ""))
    table.caption_justify = "left"
    return table
