"""`autokernel verify`: the run's winners inside the unmodified model, judged against the true answer.

The model file is loaded exactly as the run profiled it (the ModelSpec in config.json). Each
winner (best/<target>.py) is bound into the model through autokernel.routing (its recorded
modules' forwards and the torch functions of its type, each behind a guard: nothing intercepts
every op). Over several fresh seeded inputs, the patched model and the model as it is are both
compared with the model run in float64 (float32 where float64 cannot run), and the patched one is
accepted when its error is no worse than eager's own, with the margins accuracy.py states (so a
bf16 kernel that rounds once, where eager rounds twice, is not called guilty). When it is worse,
each winner is tried alone to find the guilty one(s); they are named in verify.json, and `export`
leaves them out. Both are timed; the measured end-to-end speedup is reported beside the Amdahl
projection from the plan's shares and the winners' own speedups.

verify fails (status "failed", exit 1, each reason named) when the outputs are not accepted, when a
winner serves no call of the model, or when a target's dtype is not the model's. A winner this
machine cannot run (CUDA C++ without a GPU) is not run: verify.json names it and why under
"not_run". A bf16 winner with dot products, which the Triton interpreter cannot run in bf16, runs
with fp16 standing in, as the judge ran it (named under "stand_ins"), so it still serves the model
and is still judged against the truth. Either makes the status "partial" (exit 0, `ok` false:
nothing is claimed about the winner's own dtype path). "ok" means every winner ran in its own
dtype, served calls of the model, and the outputs were accepted.

On the CPU the kernels run in the Triton interpreter (TRITON_INTERPRET=1 is set here, before any
kernel file is imported); every time is then a CPU-interpreter figure and labelled so.
"""
from __future__ import annotations

import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

from autokernel.errors import UserError
from autokernel.run import RunDir, write_json_atomic
from autokernel.winners import STAND_IN, WinnerFile, load_winners, not_runnable, stand_in, winner_files

__all__ = ["FILENAME", "STAND_IN", "WinnerFile", "load_winners", "not_runnable", "run_folder", "stand_in", "verify",
           "winner_files"]

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


# ---------------------------------------------------------------- comparing and timing
def compare(loaded: Any, winners: list, cases: list[tuple]) -> dict:
    """The patched model judged per seed (`cases`: (inputs, eager outputs, reference outputs))."""
    from autokernel import accuracy, routing
    router = routing.Router(winners)
    with router.patched(loaded.model):
        per_seed = [accuracy.judge(loaded.forward(inputs), eager, reference) for inputs, eager, reference in cases]
    return {"outputs_match": all(s["outputs_match"] for s in per_seed),
            **{k: max(s[k] for s in per_seed) for k in ("max_abs_err", "max_rel_err", "eager_err_vs_reference",
                                                         "patched_err_vs_reference", "eager_max_err_vs_reference",
                                                         "patched_max_err_vs_reference")},
            "per_seed": per_seed, "tally": router.tally.to_json()}


def find_guilty(loaded: Any, winners: list, cases: list, tally: dict) -> dict[str, str]:
    """Winners that raised inside the model, or that change its outputs on their own."""
    guilty = {t: "raised inside the model: " + "; ".join(k["errors"])
              for t, k in tally["per_kernel"].items() if k["errors"]}
    for w in winners:
        if w.target in guilty:
            continue
        alone = compare(loaded, [w], cases)
        if not alone["outputs_match"]:
            guilty[w.target] = (f"alone it takes the model's outputs further from the float64 reference than "
                                f"eager does (rms error {alone['patched_err_vs_reference']:.3g} against eager's "
                                f"{alone['eager_err_vs_reference']:.3g}; max error "
                                f"{alone['patched_max_err_vs_reference']:.3g} against "
                                f"{alone['eager_max_err_vs_reference']:.3g}, of the output's rms)")
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
    from autokernel.seal import require_sealed
    log = log or (lambda message: None)
    run = RunDir(run_path)
    require_sealed(run.path, "verify refused")  # never serve a winner that is not the text that was judged
    sys.dont_write_bytecode = True  # no bytecode beside the records: the check would refuse the next verify
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
    not_run = {f.target: why for f in files if (why := not_runnable(f, spec.device))}
    stand_ins = {f.target: why for f in files if (why := stand_in(f, spec.device))}
    winners, failed = load_winners([f for f in files if f.target not in not_run], stand_ins)
    inputs = [loaded.make_inputs(s) for s in seeds]
    from autokernel.accuracy import reference_outputs
    references, reference_dtype = reference_outputs(loaded, inputs)
    cases = [(i, loaded.forward(i), r) for i, r in zip(inputs, references)]
    log(f"verify: {len(winners)} winner(s) inside {Path(spec.path).name} on {spec.device}, {len(seeds)} seeded "
        f"inputs, judged against the model in {reference_dtype}"
        + (f"; {len(not_run)} not run here" if not_run else "")
        + (f"; {len(stand_ins)} with fp16 standing in for bf16" if stand_ins else ""))
    full, rest, guilty, clean = judge_winners(loaded, winners, failed, cases, log)
    log(f"verify: timing the model unmodified and with {len(clean)} winner(s)")
    eager = time_forward(loaded, cases[0][0], spec.device)
    patched = time_forward(loaded, cases[0][0], spec.device, clean)
    result = _result(run, spec, files, full, rest, guilty, clean, eager, patched, seeds)
    result.update(_verdict(result, model_dtype(loaded), not_run, stand_ins, reference_dtype))
    if compile_baseline:
        log("verify: timing torch.compile of the unmodified model")
        compiled = time_compiled(loaded, cases[0][0], spec.device)
        result["compile_median_us"] = compiled.get("median_us")
        result["compile_error"] = compiled.get("error")
        result["e2e_speedup_vs_compile"] = (compiled["median_us"] / patched.median_us
                                            if compiled.get("median_us") else None)
    write_json_atomic(run.path / FILENAME, result)
    return result


def judge_winners(loaded: Any, winners: list, failed: dict, cases: list, log: Log) -> tuple:
    """(all winners' comparison, the clean ones', guilty target -> why, the clean winners)."""
    full = compare(loaded, winners, cases)
    guilty = dict(failed)
    if not full["outputs_match"] or any(k["errors"] for k in full["tally"]["per_kernel"].values()):
        log("verify: outputs not accepted (or a kernel raised): trying each winner alone")
        guilty.update(find_guilty(loaded, winners, cases, full["tally"]))
    clean = [w for w in winners if w.target not in guilty]
    rest = compare(loaded, clean, cases) if len(clean) < len(winners) else full
    if not rest["outputs_match"]:  # they disagree only together: none of them can be trusted
        guilty.update({w.target: "changes the outputs together with the others" for w in clean})
        clean = []
    return full, rest, guilty, clean


def model_dtype(loaded: Any) -> str:
    """The dtype the model computes in: its first floating parameter's (else --dtype, else float32)."""
    from autokernel.routing import dtype_name
    for p in loaded.model.parameters():
        if p.is_floating_point():
            return dtype_name(p)
    return loaded.spec.dtype or "float32"


def _verdict(result: dict, dtype: str, not_run: dict, stand_ins: dict, reference_dtype: str) -> dict:
    """What failed, per winner and in words; the status; `ok` only when every winner was checked in
    its own dtype."""
    from autokernel.accuracy import rule
    failures = []
    for target, k in result["per_kernel"].items():
        k["not_run"] = not_run.get(target)
        k["stand_in"] = stand_ins.get(target)
        k["dtype_matches_model"] = k["dtype"] == dtype
        if k["dtype"] != dtype:
            failures.append(f"{target}: the target's dtype {k['dtype'] or '(none)'} is not the model's {dtype}")
        if k["guilty"]:
            failures.append(f"{target}: {k['guilty_reason']}")
        elif not k["not_run"] and k["calls_served"] == 0:
            failures.append(f"{target}: served no call of the model ({_unserved_reason(result, k)})")
    if not result["outputs_match"] and not result["guilty"]:
        failures.append("the patched model's outputs were not accepted")
    status = "failed" if failures else "partial" if (not_run or stand_ins) else "ok"
    return {"status": status, "ok": status == "ok", "failures": failures, "not_run": dict(not_run),
            "stand_ins": dict(stand_ins),
            "model_dtype": dtype, "acceptance": {**rule(), "reference_dtype": reference_dtype}}


def _unserved_reason(result: dict, kernel: dict) -> str:
    """The commonest reason a winner's calls fell back; else the commonest call of its type that no
    winner matched (those are counted per op: no target owns them)."""
    reasons = dict(kernel.get("fallback_reasons") or {})
    if not reasons:
        prefix = f"no winner at {kernel['kernel_type']}["
        for op in result["per_op"].values():
            for why, n in op["reasons"].items():
                if why.startswith(prefix):
                    reasons[why] = reasons.get(why, 0) + n
    return max(reasons, key=reasons.get) if reasons else "no call of the model reached it"


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
            "kernel_speedup_vs_eager": f.speedup_vs_eager, "serving": f.serving,
            **{k: v for k, v in counts.items() if k != "kernel_type"},
            "guilty": f.target in guilty, "guilty_reason": guilty.get(f.target)}
    projected = amdahl_many((f.share, f.speedup_vs_eager) for f in files if f.target in served and f.speedup_vs_eager)
    return {
        "run_id": run.run_id, "created": datetime.now().isoformat(timespec="seconds"),
        "device": spec.device, "device_name": device_name(spec.device), "cpu_figures": on_cpu,
        **({"note": CPU_NOTE + "; kernels ran in the Triton interpreter"} if on_cpu else {}),
        "model": spec.to_json(), "seeds": list(seeds), "forwards_per_check": len(seeds),
        "outputs_match": full["outputs_match"],
        "max_abs_err": full["max_abs_err"], "max_rel_err": full["max_rel_err"],
        **{k: full[k] for k in ("eager_err_vs_reference", "patched_err_vs_reference", "eager_max_err_vs_reference",
                                "patched_max_err_vs_reference")}, "per_seed": full["per_seed"],
        "guilty": sorted(guilty), "outputs_match_without_guilty": rest["outputs_match"] if guilty else None,
        "patched_targets": sorted(served),
        "eager_median_us": eager.median_us, "patched_median_us": patched.median_us,
        "e2e_speedup": eager.median_us / patched.median_us if patched.median_us else None,
        "projected_e2e_speedup": projected, "timing_method": eager.method,
        "per_kernel": per_kernel, "per_op": full["tally"]["per_op"], "versions": versions(),
    }
