"""`autokernel verify --train`: the model fine-tuned with and without the winners, from one start.

N optimizer steps (default 20, `--steps`) of the model file's training step (autokernel/profile/
training.py: its `train_step` or `loss_fn` and its `get_optimizer`, else the defaults), run from the
same weights, the same data (step i takes the inputs of seed i), the same RNG seed and a fresh
optimizer: once as the model is (eager), once with the winners patched in. A winner whose backward
the judge passed serves the calls that need gradients as a differentiable custom op
(routing/ops.py); a forward-only winner's calls fall back there, each counted with its reason.

Compared, within TOLERANCES (docs/serving-and-export.md says why each is what it is), as Liger
Kernel's convergence test compares a mini model trained with and without its kernels:
- every parameter's gradient after the first backward (its error over its norm), each against the
  tolerance of its own dtype, or of the model's where that is coarser (an fp32 norm weight in a
  bf16 model gets its gradient from bf16 activations): a backward off by a factor shows here even
  where AdamW, which divides each update by its gradient's scale, hides it;
- the loss at every step;
- every parameter's change over the run (patched minus eager, over eager's change).
Then a second workload, one step of what a training step gives a kernel and neither the judge nor
the first workload does (train_workload.py: a ragged batch, padded labels, zero-initialised norm
weights), its loss and every parameter's gradient compared the same way.
When either differs, each winner that served a call under autograd is run alone on the workload
that differed: those that differ alone (or raise) are named guilty.

Timed (train_figures.py): each run's steps after the first, tokens/s where the first input is
token ids (else steps/s), peak memory on a GPU; against torch.compile of the model unmodified and
patched, and Liger Kernel where it is installed and patches the model. Measured: one step's peak
memory, eager and patched (step_memory.py: the CPU allocator's events, and
torch.cuda.max_memory_allocated on a GPU), so a fused loss that never holds the logits shows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

from autokernel.deploy.fine_tune import Trajectory, Workload, fine_tune
from autokernel.errors import UserError

DEFAULT_STEPS = 20
# Per dtype, the largest relative difference that still counts as the same training run:
# - fp32: the kernels round each op once, as PyTorch does, but sum in another order (~1e-7 per op).
#   The test rmsnorm winner, 20 AdamW steps of tests/data/train_tiny.py: losses within 1.3e-7, first
#   gradients within 1.6e-7 of their norm, parameter changes within 1e-6. 1e-4 (loss, gradients)
#   and 1e-3 (changes) leave two to three orders of margin; a wrong backward is off by O(1).
#   Changes get the wider one: AdamW divides each update by the root of its squared gradient, so a
#   parameter whose gradient is near zero moves by a different amount for a rounding-level change.
# - fp16/bf16: every op rounds to 11 (8) mantissa bits, at other places in the kernel than in
#   PyTorch: ~1e-3 (~8e-3) per op, compounding over the steps; no tolerance reaches O(1).
TOLERANCES = {
    "float32": {"loss": 1e-4, "grad": 1e-4, "param_change": 1e-3},
    "float16": {"loss": 1e-2, "grad": 5e-2, "param_change": 1e-1},
    "bfloat16": {"loss": 3e-2, "grad": 1e-1, "param_change": 2e-1},
}


# ---------------------------------------------------------------- the comparison
def tolerance_for(dtype: str, model_dtype: str) -> dict:
    """The tolerances of a parameter in `dtype` inside a model computing in `model_dtype`: its own
    dtype's, or the model's where those are wider."""
    own, model = TOLERANCES.get(dtype, TOLERANCES["float32"]), TOLERANCES.get(model_dtype, TOLERANCES["float32"])
    return {k: max(own[k], model[k]) for k in own}


def relative(a: Any, b: Any) -> float:
    """|a - b| over |b| for tensors (norms) or floats; 0 when both are 0, inf when not finite."""
    import torch
    if isinstance(a, torch.Tensor):
        diff, scale = (a - b).norm().item(), b.norm().item()
    else:
        diff, scale = abs(a - b), abs(b)
    if not math.isfinite(diff):
        return math.inf
    return diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)


def compare(eager: Trajectory, patched: Trajectory, model_dtype: str,
            what: tuple[str, ...] = ("loss", "grad", "param_change")) -> dict:
    """Losses, first gradients and parameter changes (those in `what`) of `patched` against `eager`,
    each parameter's within the tolerance of its dtype (tolerance_for); `problems` says in words
    what differs beyond them (empty: the same run). What eager itself made NaN or infinite (pure
    fp16 AdamW: its second moment and eps underflow to 0) has no true value to compare with: it is
    left out and named in `not_compared`."""
    problems, not_compared = [], []
    if patched.error:
        problems.append(f"the run raised {patched.error}")
    loss_err = _loss_errors(eager, patched, model_dtype, problems if "loss" in what else [], not_compared)
    per_parameter = {n: {"dtype": eager.dtypes.get(n, model_dtype)} for n in eager.grads}
    for key in ("grad", "param_change"):
        if key in what:
            _parameter_errors(key, eager, patched, model_dtype, per_parameter, problems, not_compared)
    finite = [e for e in loss_err if e is not None]
    return {"match": not problems, "problems": problems, "not_compared": not_compared, "loss_rel_err": loss_err,
            "worst_loss_rel_err": max(finite, default=None), "per_parameter": per_parameter,
            **{f"worst_{key}_rel_err": _worst(per_parameter, key) for key in ("grad", "param_change") if key in what}}


def _loss_errors(eager: Trajectory, patched: Trajectory, model_dtype: str, problems: list,
                 not_compared: list) -> list:
    """The loss's relative difference per step (None where eager's own loss is not finite)."""
    tol = TOLERANCES.get(model_dtype, TOLERANCES["float32"])["loss"]
    errors = [relative(p, e) if math.isfinite(e) else None for p, e in zip(patched.losses, eager.losses)]
    if None in errors:
        not_compared.append(f"the loss from step {errors.index(None) + 1} (eager's own is not finite)")
    over = [i for i, err in enumerate(errors) if err is not None and err > tol]
    if over:
        i = over[0]
        problems.append(f"the loss at step {i + 1} is {patched.losses[i]:.6g} against eager's {eager.losses[i]:.6g} "
                        f"(relative difference {errors[i]:.3g} > {tol:g})")
    return errors


def _parameter_errors(key: str, eager: Trajectory, patched: Trajectory, model_dtype: str, per_parameter: dict,
                      problems: list, not_compared: list) -> None:
    """Each parameter's first gradient (key "grad") or change over the run ("param_change"), into
    `per_parameter`; the worst beyond its tolerance, relative to it, into `problems`."""
    mine, theirs = (patched.grads, eager.grads) if key == "grad" else (patched.change, eager.change)
    words = "the gradient of {} after the first backward" if key == "grad" else "the change of {} over the run"
    over = {}
    for name, want in theirs.items():
        if not bool(want.isfinite().all()):
            not_compared.append(words.format(name) + " (eager's own is not finite)")
            continue
        row = per_parameter.setdefault(name, {"dtype": model_dtype})
        err = relative(mine.get(name, 0 * want), want)
        row.update({f"{key}_rel_err": err, f"{key}_tolerance": tolerance_for(row["dtype"], model_dtype)[key]})
        if err > row[f"{key}_tolerance"]:
            over[name] = err / row[f"{key}_tolerance"]
    if over and not patched.error:
        name = max(over, key=over.get)
        err, row = per_parameter[name][f"{key}_rel_err"], per_parameter[name]
        how = (f"differs from eager's by {err:.3g} of its norm" if math.isfinite(err)
               else "is NaN or infinite, or not zero where eager's is")
        problems.append(f"{words.format(name)} {how} (tolerance {row[f'{key}_tolerance']:g}, {row['dtype']})")


def _worst(per_parameter: dict, key: str) -> Optional[dict]:
    """The parameter whose error is the largest share of its tolerance."""
    rows = {n: d for n, d in per_parameter.items() if f"{key}_rel_err" in d}
    if not rows:
        return None
    name = max(rows, key=lambda n: rows[n][f"{key}_rel_err"] / rows[n][f"{key}_tolerance"])
    return {"parameter": name, "rel_err": rows[name][f"{key}_rel_err"], "tolerance": rows[name][f"{key}_tolerance"]}


# ---------------------------------------------------------------- verify --train
@dataclass
class Check:
    """One comparison verify --train made: what a winner is run alone on when it differed."""

    name: str
    steps: int
    eager: Trajectory
    workload: Optional[Workload] = None  # None: the model file's own step at its profiled inputs
    what: tuple[str, ...] = ("loss", "grad", "param_change")


def verify_train(loaded: Any, winners: list, steps: int = DEFAULT_STEPS, compile_baseline: bool = False,
                 log: Optional[Callable[[str], None]] = None, dtype: str = "float32") -> dict:
    """verify.json's `train`: the two runs compared, the second workload, the guilty winners, the
    throughput figures (`dtype`: the model's, which chooses the tolerances)."""
    from autokernel.deploy import train_figures
    log = log or (lambda message: None)
    if steps < 1:
        raise UserError(f"--steps {steps}: a fine-tuning run needs at least one step", "e.g. --steps 20")
    log(f"verify --train: {steps} steps of {loaded.spec.path}, eager and with {len(winners)} winner(s)")
    eager = fine_tune(loaded, None, steps, memory=True)
    patched = fine_tune(loaded, winners, steps, catch=True, memory=True)
    compared = compare(eager, patched, dtype)
    checks = [Check("the fine-tuning run", steps, eager)] if not compared["match"] else []
    second, second_check, second_tally = second_workload_result(loaded, winners, dtype, log)
    checks += [second_check] if second_check is not None else []
    served = _served_under_autograd([patched.tally, second_tally], winners)
    guilty = find_guilty(loaded, winners, served, checks, dtype, log) if checks else {}
    failures = [f"{t}: {why}" for t, why in guilty.items()]
    if checks and not guilty:
        differ = compared["problems"] + [f"{second['name']}: {p}" for p in second.get("problems", [])]
        failures.append("training with the winners differs from eager: " + "; ".join(differ))
    result = {"steps": steps, "step": eager.how, "optimizer": eager.optimizer, "dtype": dtype,
              "tolerances": dict(TOLERANCES.get(dtype, TOLERANCES["float32"])),
              "losses": {"eager": eager.losses, "patched": patched.losses},
              **{k: v for k, v in compared.items() if k != "problems"}, "problems": compared["problems"],
              "second_workload": second, "served_under_autograd": served,
              "per_kernel": _training_tally(patched.tally), "guilty": guilty, "failures": failures}
    result["memory"] = train_figures.memory(eager, patched)
    result["throughput"] = train_figures.throughput(loaded, winners, steps, eager, patched, compile_baseline, log)
    return result


def second_workload_result(loaded: Any, winners: list, dtype: str,
                           log: Callable[[str], None]) -> tuple[dict, Optional[Check], Optional[dict]]:
    """verify.json's `second_workload`, its Check when it differs, and the router's tally of it."""
    from autokernel.deploy.train_workload import second_workload
    workload, about = second_workload(loaded)
    if workload is None:
        log(f"verify --train: the second workload is left out: {about['skipped']}")
        return about, None, None
    log(f"verify --train: one step of the second workload, {about['name']}: padded labels, zeroed norm weights")
    eager = fine_tune(loaded, None, 1, workload=workload, catch=True)
    grads = list(eager.grads.values())
    if eager.error or not all(math.isfinite(x) for x in eager.losses) or not all(g.isfinite().all() for g in grads):
        why = eager.error or "eager's own loss or gradients are not finite there"
        return {**about, "skipped": f"eager PyTorch cannot train it: {why}"}, None, None
    patched = fine_tune(loaded, winners, 1, workload=workload, catch=True)
    compared = compare(eager, patched, dtype, what=("loss", "grad"))
    result = {**about, "step": eager.how, **{k: v for k, v in compared.items() if k != "loss_rel_err"},
              "per_kernel": _training_tally(patched.tally)}
    check = None if compared["match"] else Check(about["name"], 1, eager, workload, ("loss", "grad"))
    return result, check, patched.tally


def _served_under_autograd(tallies: list, winners: list) -> list[str]:
    """The winners with a backward that served calls in a patched run (its calls need gradients)."""
    def served(target: str) -> bool:
        return any((t or {}).get("per_kernel", {}).get(target, {}).get("calls_served") for t in tallies)
    return [w.target for w in winners if w.backward_fn is not None and served(w.target)]


def _training_tally(tally: Optional[dict]) -> dict:
    keep = ("calls_served", "fallbacks", "fallback_reasons", "errors")
    return {t: {k: v for k, v in d.items() if k in keep} for t, d in (tally or {}).get("per_kernel", {}).items()}


def find_guilty(loaded: Any, winners: list, served: list, checks: list[Check], dtype: str,
                log: Callable[[str], None]) -> dict[str, str]:
    """The winners that, alone in the model, train differently from eager (or raise) on a workload
    where all of them together did."""
    log("verify --train: training differs from eager: trying each winner that served a call under autograd alone")
    guilty = {}
    for w in winners:
        if w.target not in served:
            continue
        for check in checks:
            alone = compare(check.eager, fine_tune(loaded, [w], check.steps, catch=True, workload=check.workload),
                            dtype, check.what)
            if not alone["match"]:
                guilty[w.target] = (f"its backward trains the model differently from eager ({check.name}): alone, "
                                    + "; ".join(alone["problems"]))
                break
    return guilty
