"""`autokernel verify`: the run's winners inside the unmodified model, judged against the true answer.

The model file is loaded exactly as the run profiled it (the ModelSpec in config.json). Each
winner (best/<target>.py) is bound into the model through autokernel.deploy.routing (its recorded
modules' forwards and the torch functions of its type, each behind a guard: nothing intercepts
every op), and serves the calls inside its serving range (autokernel/deploy/routing/serving.py).

verify runs a workload, not one forward (autokernel/deploy/workload.py): the profiled inputs over several
seeds, then the model file's get_workload() or the profiled inputs with their leading dims varied
(half plus an odd remainder, double, one decode token). On every input set the patched model and
the model as it is are both compared with the model run in float64 (float32 where float64 cannot
run), and the patched one is accepted when its error is no worse than eager's own, with the margins
accuracy.py states (so a bf16 kernel that rounds once, where eager rounds twice, is not called
guilty). When it is worse, each winner is tried alone to find the guilty one(s); they are named in
verify.json, and `export` leaves them out. Each set is timed unmodified and patched (and, by
default on a GPU, torch.compile of both); verify.json reports per set the calls served and fallen
back with their reasons, the accuracy and the times, and how much of the workload the winners
served. The profiled set's speedup is reported beside the Amdahl projection.

verify fails (status "failed", exit 1, each reason named) when the outputs are not accepted, when a
winner serves no call of the model (unless every call fell back because, on a GPU, it was slower
there), or when a target's dtype is not the model's. A winner this machine cannot run (CUDA C++
without a GPU), or whose verdict ran another dtype in place of its own (it is served nowhere: the
judge never ran its own dtype), is not run: verify.json names it and why under "not_run", and the
status is "partial" (exit 0, `ok` false: nothing is claimed about it). A bf16 winner runs in bf16,
in the Triton interpreter too, whose bf16 dot products the judge's launch monitor computes as tensor
cores do (harness/correctness/interpreter_numerics.py). "ok" means every winner ran in its own
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
from autokernel.deploy import verify_parameters
from autokernel.search.run import RunDir, write_json_atomic
from autokernel.deploy.winners import (WinnerFile, load_winners, members_instead, not_runnable, unbound_chains,
                                       winner_files)

__all__ = ["FILENAME", "WinnerFile", "load_winners", "not_runnable", "run_folder", "verify", "winner_files"]

FILENAME = "verify.json"
SEEDS = (0, 1, 2)
Log = Callable[[str], None]


def run_folder(run: str | Path, runs_dir: str | Path) -> Path:
    """A run given as a folder or as an id under runs_dir."""
    for path in (Path(run), Path(runs_dir) / str(run)):
        if (path / "state.json").is_file():
            return path
    known = sorted(p.parent.name for p in Path(runs_dir).glob("*/state.json"))[-5:]
    raise UserError(f"no run {run!r} under {runs_dir}",
                    f"pass a run folder or one of: {', '.join(known) or 'none (run autokernel optimize first)'}")


# ---------------------------------------------------------------- the command
def choose_device(run: RunDir, device: Optional[str] = None) -> str:
    """The device verify runs on (`device`, else the run's model's), with Triton's mode set for it:
    on the CPU the interpreter, chosen before Triton is first imported (the @triton.jit functions of
    its standard library are made at import, compiled or interpreted for good: an interpreted
    kernel that calls a compiled one raises). Raises UserError for a CUDA device this machine lacks."""
    device = device or run.load_config()["model"]["device"]
    if device.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            raise UserError(f"the run's model is on {device} but this machine has no usable CUDA device",
                            "verify on a machine with a GPU, or pass --device cpu (Triton interpreter)")
    else:
        os.environ["TRITON_INTERPRET"] = "1"
    return device


def verify(run_path: str | Path, device: Optional[str] = None, compile_baseline: Optional[bool] = None,
           seeds: tuple[int, ...] = SEEDS, log: Optional[Log] = None, train: Optional[bool] = None,
           steps: Optional[int] = None) -> dict:
    """Verify a run's winners inside its model over its workload; writes and returns verify.json.
    `compile_baseline`: also time torch.compile of the model unmodified and patched (None: on a GPU).
    `train`: also fine-tune it `steps` steps with and without the winners (verify_train.py; None:
    when the run profiled a training step)."""
    from autokernel.deploy import verify_workload, workload
    from autokernel.profile.modelfile import ModelSpec, load_model
    from autokernel.search.seal import require_sealed
    log = log or (lambda message: None)
    run = RunDir(run_path)
    require_sealed(run.path, "verify refused")  # never serve a winner that is not the text that was judged
    sys.dont_write_bytecode = True  # no bytecode beside the records: the check would refuse the next verify
    spec = ModelSpec.from_json(run.load_config()["model"])
    spec.device = choose_device(run, device or spec.device)
    compile_baseline = spec.device.startswith("cuda") if compile_baseline is None else compile_baseline
    files = winner_files(run)
    loaded = load_model(spec)
    not_run = {f.target: why for f in files if (why := not_runnable(f, spec.device))}
    # a chain or its members, whichever measured the smaller gain (winners.choose_alternatives), is not bound
    winners, failed = load_winners([f for f in files if f.target not in not_run and not f.not_served])
    input_sets, source, skipped = workload.input_sets(loaded, seeds)
    sets, reference_dtype = verify_workload.prepare(loaded, input_sets)
    log(f"verify: {len(winners)} winner(s) inside {Path(spec.path).name} on {spec.device}, over "
        f"{len(sets)} input set(s) ({', '.join(s.name for s in sets)}), judged against the model in {reference_dtype}"
        + (f"; {len(not_run)} not run here" if not_run else ""))
    for name, why in skipped.items():
        log(f"verify: input set {name} left out: {why}")
    for d in (f.decision for f in files if f.decision):
        log(f"verify: {d['chain']}: {'the ' + d['served'] if d['served'] != 'neither' else 'neither'} served: {d['why']}")
    params = verify_parameters.fingerprint(loaded.model)  # every weight, bit for bit, before any winner runs
    full, rest, guilty, clean = judge_winners(loaded, winners, failed, sets, log)
    unbound = unbound_chains(files, full["tally"])
    if unbound:  # a chain whose form fits no call here: its members serve those calls instead
        for chain, reason in unbound.items():
            why = f"its form fits no call of this model ({reason}), so its members' winners serve"
            members_instead(files, chain, why)
            log(f"verify: {chain}: {why}")
        winners, failed = load_winners([f for f in files if f.target not in not_run and not f.not_served])
        full, rest, guilty, clean = judge_winners(loaded, winners, failed, sets, log)
    times = verify_workload.time_sets(loaded, sets, spec.device, clean, compile_baseline, log)
    touched = verify_parameters.changed(params)  # before training, whose optimizer changes them on purpose
    if touched:
        log(f"verify: {verify_parameters.failure(touched)}")
    result = _result(run, spec, files, full, rest, guilty, clean, times[0], seeds)
    result["workload"] = _workload(sets, full, times, source, skipped)
    if compile_baseline:
        result.update(_compiled(times[0]))
    if loaded.training if train is None else train:
        from autokernel.deploy.verify_train import DEFAULT_STEPS, verify_train
        result["train"] = verify_train(loaded, clean, steps or DEFAULT_STEPS, compile_baseline, log,
                                       model_dtype(loaded))
    from autokernel.deploy.routing.binding import in_loss
    # a fused projection + loss serves a training step with labels only: every forward here keeps its logits
    loss = {f.target for f in files if in_loss(f.modules) or f.kernel_type == "linear_cross_entropy"}
    result["parameters_changed"] = touched
    result.update(_verdict(result, model_dtype(loaded), not_run, reference_dtype, loss))
    write_json_atomic(run.path / FILENAME, result)
    return result


def judge_winners(loaded: Any, winners: list, failed: dict, sets: list, log: Log) -> tuple:
    """(all winners' comparison, the clean ones', guilty target -> why, the clean winners)."""
    from autokernel.deploy.verify_workload import compare
    full = compare(loaded, winners, sets)
    guilty = dict(failed)
    if not full["outputs_match"] or any(k["errors"] for k in full["tally"]["per_kernel"].values()):
        log("verify: outputs not accepted (or a kernel raised): trying each winner alone")
        guilty.update(find_guilty(loaded, winners, sets, full["tally"]))
    clean = [w for w in winners if w.target not in guilty]
    rest = compare(loaded, clean, sets) if len(clean) < len(winners) else full
    if not rest["outputs_match"]:  # they disagree only together: none of them can be trusted
        guilty.update({w.target: "changes the outputs together with the others" for w in clean})
        clean = []
    return full, rest, guilty, clean


def find_guilty(loaded: Any, winners: list, sets: list, tally: dict) -> dict[str, str]:
    """Winners that raised inside the model, or that change its outputs on their own."""
    from autokernel.deploy.verify_workload import compare
    guilty = {t: "raised inside the model: " + "; ".join(k["errors"])
              for t, k in tally["per_kernel"].items() if k["errors"]}
    for w in winners:
        if w.target in guilty:
            continue
        alone = compare(loaded, [w], sets)
        if not alone["outputs_match"]:
            where = [s["name"] for s in alone["sets"] if not s["outputs_match"]]
            guilty[w.target] = (f"alone it takes the model's outputs further from the float64 reference than "
                                f"eager does (rms error {alone['patched_err_vs_reference']:.3g} against eager's "
                                f"{alone['eager_err_vs_reference']:.3g}; max error "
                                f"{alone['patched_max_err_vs_reference']:.3g} against "
                                f"{alone['eager_max_err_vs_reference']:.3g}, of the output's rms; "
                                f"at {', '.join(where)})")
    return guilty


def model_dtype(loaded: Any) -> str:
    """The dtype the model computes in: its first floating parameter's (else --dtype, else float32)."""
    from autokernel.deploy.routing import dtype_name
    for p in loaded.model.parameters():
        if p.is_floating_point():
            return dtype_name(p)
    return loaded.spec.dtype or "float32"


def _verdict(result: dict, dtype: str, not_run: dict, reference_dtype: str,
             loss: set = frozenset()) -> dict:
    """What failed, per winner and in words; the status; `ok` only when every winner was checked in
    its own dtype. `loss`: the targets of a training step's loss, which the model's forward never
    calls: they must serve in verify --train's steps instead, when it runs."""
    from autokernel.deploy.accuracy import rule
    from autokernel.deploy.routing.serving import only_for_speed
    failures = []
    for target, k in result["per_kernel"].items():
        k["not_run"] = not_run.get(target)
        k["dtype_matches_model"] = k["dtype"] == dtype
        if k["dtype"] != dtype:
            failures.append(f"{target}: the target's dtype {k['dtype'] or '(none)'} is not the model's {dtype}")
        if k["guilty"]:
            failures.append(f"{target}: {k['guilty_reason']}")
        elif k.get("alternative"):  # not bound: the chain's other side measured a larger gain
            k["not_served"] = k["alternative"]
        elif not k["not_run"] and k["calls_served"] == 0 and target in loss:
            trained = ((result.get("train") or {}).get("per_kernel") or {}).get(target)
            served = (trained or {}).get("calls_served")
            if trained is not None and not served:
                failures.append(f"{target}: served no call of the training step's loss")
            where = ("a fused loss, served in a training step with labels (these forwards return logits)"
                     if k.get("kernel_type") == "linear_cross_entropy"
                     else "in the training step's loss, which the model's forward does not run")
            k["not_served"] = where + (f": served {served} call(s) in verify --train" if served else "")
            k["training_loss_calls"] = served  # the report's verdict column: where it serves instead
        elif not k["not_run"] and k["calls_served"] == 0:
            if k["fallbacks"] and only_for_speed(k.get("fallback_reasons") or {}):
                # not wrong, only no faster here: PyTorch keeps every call, and verify says so
                k["not_served"] = f"no call served: {_unserved_reason(result, k)}"
            else:
                failures.append(f"{target}: served no call of the model ({_unserved_reason(result, k)})")
    if not result["outputs_match"] and not result["guilty"]:
        failures.append("the patched model's outputs were not accepted")
    if result.get("parameters_changed"):
        failures.append(verify_parameters.failure(result["parameters_changed"]))
    failures += [f"training: {why}" for why in (result.get("train") or {}).get("failures", [])]
    status = "failed" if failures else "partial" if not_run else "ok"
    return {"status": status, "ok": status == "ok", "failures": failures, "not_run": dict(not_run),
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


def _workload(sets: list, full: dict, times: list[dict], source: str, skipped: dict) -> dict:
    """Per input set: the calls served and fallen back with the reasons, the accuracy, the times;
    and how much of the workload the winners served."""
    from autokernel.deploy.verify_workload import ERRORS, served_summary
    rows = []
    for s, compared, timed in zip(sets, full["sets"], times):
        rows.append({"name": s.name, "profiled": s.profiled, "shapes": s.shapes, "seeds": list(s.seeds),
                     "outputs_match": compared["outputs_match"], **{k: compared[k] for k in ERRORS},
                     **served_summary(compared["tally"]), "per_kernel": {
                         t: {k: v for k, v in c.items() if k in ("calls_served", "fallbacks", "fallback_reasons")}
                         for t, c in compared["tally"]["per_kernel"].items()},
                     **{k: v for k, v in timed.items() if k not in ("eager", "patched")}})
    total = served_summary(full["tally"])
    share = total["served_share"]
    reasons = "; ".join(f"{why} ({n})" for why, n in list(total["fallback_reasons"].items())[:3])
    summary = (f"the winners served {total['calls_served']} of the {total['calls_served'] + total['fallbacks']} "
               f"calls they could take ({share:.0%}) over {len(rows)} input set(s)"
               if share is not None else f"no call of a winner's kind over {len(rows)} input set(s)")
    summary += f"; {total['fallbacks']} fell back: {reasons}" if total["fallbacks"] else ""
    return {"source": source, "skipped": dict(skipped), **total, "summary": summary, "sets": rows}


def _compiled(profiled: dict) -> dict:
    """torch.compile of the model, unmodified and patched, at the profiled inputs."""
    return {"compile_median_us": profiled.get("compile_median_us"), "compile_error": profiled.get("compile_error"),
            "patched_compile_median_us": profiled.get("patched_compile_median_us"),
            "compiled_e2e_speedup": profiled.get("compiled_e2e_speedup"),
            "e2e_speedup_vs_compile": (profiled["compile_median_us"] / profiled["patched_median_us"]
                                       if profiled.get("compile_median_us") and profiled["patched_median_us"]
                                       else None)}


def _result(run: RunDir, spec: Any, files: list[WinnerFile], full: dict, rest: dict, guilty: dict,
            clean: list, timed: dict, seeds: tuple) -> dict:
    from autokernel.profile.plan import CPU_NOTE, amdahl_many
    from harness.device.versions import versions
    from harness.device.peaks import device_name
    served = {w.target for w in clean}
    on_cpu = not spec.device.startswith("cuda")
    eager, patched = timed["eager"], timed["patched"]
    per_kernel = {}
    for f in files:
        counts = full["tally"]["per_kernel"].get(f.target, {"calls_served": 0, "fallbacks": 0, "fallback_reasons": {},
                                                           "served_by_op": {}, "errors": []})
        per_kernel[f.target] = {
            "kernel_type": f.kernel_type, "dims": f.dims, "dtype": f.dtype, "kwargs": f.kwargs, "route": f.route,
            "file": run.relative(f.path), "experiment": f.experiment, "share": f.share,
            "kernel_speedup_vs_eager": f.speedup_vs_eager, "serving": f.serving, "serving_range": _range_words(f),
            "backward": f.backward, "inference_only": f.inference_only,
            "alternative": f.not_served or None, "chain_decision": f.decision,
            **{k: v for k, v in counts.items() if k != "kernel_type"},
            "guilty": f.target in guilty, "guilty_reason": guilty.get(f.target)}
    projected = amdahl_many((f.share, f.speedup_vs_eager) for f in files if f.target in served and f.speedup_vs_eager)
    return {
        "run_id": run.run_id, "created": datetime.now().isoformat(timespec="seconds"),
        "device": spec.device, "device_name": device_name(spec.device), "cpu_figures": on_cpu,
        **({"note": CPU_NOTE + "; kernels ran in the Triton interpreter"} if on_cpu else {}),
        "model": spec.to_json(), "seeds": list(seeds), "forwards_per_check": len(seeds),
        "outputs_match": full["outputs_match"],
        **{k: full[k] for k in ("max_abs_err", "max_rel_err", "eager_err_vs_reference", "patched_err_vs_reference",
                                "eager_max_err_vs_reference", "patched_max_err_vs_reference")},
        "per_seed": full["per_seed"],
        "guilty": sorted(guilty), "outputs_match_without_guilty": rest["outputs_match"] if guilty else None,
        "patched_targets": sorted(served),
        "eager_median_us": eager.median_us, "patched_median_us": patched.median_us,
        "e2e_speedup": eager.median_us / patched.median_us if patched.median_us else None,
        "projected_e2e_speedup": projected, "timing_method": eager.method,
        "per_kernel": per_kernel, "per_op": full["tally"]["per_op"], "versions": versions(),
        "chains": [f.decision for f in files if f.decision],  # chain or members: which serves, and both figures
    }


def _range_words(f: WinnerFile) -> Optional[str]:
    from autokernel.deploy.routing.serving import ServingRange
    return ServingRange.from_json(f.serving).summary() if f.serving else None
