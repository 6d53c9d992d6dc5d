"""`autokernel verify --train`: the model fine-tuned with and without the winners, from one start.

N optimizer steps (default 20, `--steps`) of the model file's training step (autokernel/profile/
training.py: its `train_step` or `loss_fn` and its `get_optimizer`, else the defaults), run from the
same weights, the same data (step i takes the inputs of seed i), the same RNG seed and a fresh
optimizer: once as the model is (eager), once with the winners patched in. A winner whose backward
the judge passed serves the calls that need gradients as a differentiable custom op
(routing/ops.py); a forward-only winner's calls fall back there, each counted with its reason.

Compared, within TOLERANCES (docs/serving-and-export.md says why each is what it is), as Liger
Kernel's convergence test compares a mini model trained with and without its kernels:
- every parameter's gradient after the first backward (its error over its norm): a backward off by a
  factor shows here even where AdamW, which divides each update by its gradient's scale, hides it;
- the loss at every step;
- every parameter's change over the run (patched minus eager, over eager's change).
When they differ, each winner that served a call under autograd is run alone: those that differ
alone (or raise) are named guilty.

Timed (train_figures.py): each run's steps after the first, tokens/s where the first input is
token ids (else steps/s), peak memory on a GPU; against torch.compile of the model unmodified and
patched, and Liger Kernel where it is installed and patches the model.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

from autokernel.deploy.fine_tune import Trajectory, fine_tune
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


def compare(eager: Trajectory, patched: Trajectory, tolerance: dict) -> dict:
    """Losses, first gradients and parameter changes of `patched` against `eager`; `problems` says
    in words what differs beyond `tolerance` (empty: the same run)."""
    problems = []
    if patched.error:
        problems.append(f"the run raised {patched.error}")
    loss_err = [relative(p, e) for p, e in zip(patched.losses, eager.losses)]
    over = [i for i, err in enumerate(loss_err) if err > tolerance["loss"]]
    if over:
        i = over[0]
        problems.append(f"the loss at step {i + 1} is {patched.losses[i]:.6g} against eager's {eager.losses[i]:.6g} "
                        f"(relative difference {loss_err[i]:.3g} > {tolerance['loss']:g})")
    grad_err = {n: relative(patched.grads.get(n, 0 * g), g) for n, g in eager.grads.items()}
    change_err = {n: relative(patched.change[n], c) for n, c in eager.change.items() if n in patched.change}
    for what, errors, tol, words in (
            ("grad", grad_err, tolerance["grad"], "the gradient of {} after the first backward"),
            ("param_change", change_err, tolerance["param_change"], "the change of {} over the run")):
        name = max(errors, key=errors.get) if errors else None
        if name is not None and errors[name] > tol and not patched.error:
            problems.append(f"{words.format(name)} differs from eager's by {errors[name]:.3g} of its norm (> {tol:g})")
    return {"match": not problems, "problems": problems, "loss_rel_err": loss_err,
            "worst_loss_rel_err": max(loss_err, default=None),
            "worst_grad_rel_err": _worst(grad_err), "worst_param_change_rel_err": _worst(change_err)}


def _worst(errors: dict) -> Optional[dict]:
    if not errors:
        return None
    name = max(errors, key=errors.get)
    return {"parameter": name, "rel_err": errors[name]}


# ---------------------------------------------------------------- verify --train
def verify_train(loaded: Any, winners: list, steps: int = DEFAULT_STEPS, compile_baseline: bool = False,
                 log: Optional[Callable[[str], None]] = None, dtype: str = "float32") -> dict:
    """verify.json's `train`: the two runs compared, the guilty winners, the throughput figures
    (`dtype`: the model's, which chooses the tolerances)."""
    from autokernel.deploy import train_figures
    log = log or (lambda message: None)
    if steps < 1:
        raise UserError(f"--steps {steps}: a fine-tuning run needs at least one step", "e.g. --steps 20")
    tolerance = TOLERANCES.get(dtype, TOLERANCES["float32"])
    log(f"verify --train: {steps} steps of {loaded.spec.path}, eager and with {len(winners)} winner(s)")
    eager = fine_tune(loaded, None, steps)
    patched = fine_tune(loaded, winners, steps, catch=True)
    compared = compare(eager, patched, tolerance)
    served = _served_under_autograd(patched.tally, winners)
    guilty = {} if compared["match"] else find_guilty(loaded, winners, served, steps, eager, tolerance, log)
    failures = [f"{t}: {why}" for t, why in guilty.items()]
    if not compared["match"] and not guilty:
        failures.append("training with the winners differs from eager: " + "; ".join(compared["problems"]))
    result = {"steps": steps, "step": eager.how, "optimizer": eager.optimizer, "dtype": dtype,
              "tolerances": dict(tolerance), "losses": {"eager": eager.losses, "patched": patched.losses},
              **{k: v for k, v in compared.items() if k != "problems"}, "problems": compared["problems"],
              "served_under_autograd": served, "per_kernel": _training_tally(patched.tally),
              "guilty": guilty, "failures": failures}
    result["throughput"] = train_figures.throughput(loaded, winners, steps, eager, patched, compile_baseline, log)
    return result


def _served_under_autograd(tally: Optional[dict], winners: list) -> list[str]:
    """The winners with a backward that served calls in the patched run (its calls need gradients)."""
    per_kernel = (tally or {}).get("per_kernel", {})
    return [w.target for w in winners if w.backward_fn is not None and per_kernel.get(w.target, {}).get("calls_served")]


def _training_tally(tally: Optional[dict]) -> dict:
    keep = ("calls_served", "fallbacks", "fallback_reasons", "errors")
    return {t: {k: v for k, v in d.items() if k in keep} for t, d in (tally or {}).get("per_kernel", {}).items()}


def find_guilty(loaded: Any, winners: list, served: list, steps: int, eager: Trajectory, tolerance: dict,
                log: Callable[[str], None]) -> dict[str, str]:
    """The winners that, alone in the model, train differently from eager (or raise)."""
    log("verify --train: training differs from eager: trying each winner that served a call under autograd alone")
    guilty = {}
    for w in winners:
        if w.target not in served:
            continue
        alone = compare(eager, fine_tune(loaded, [w], steps, catch=True), tolerance)
        if not alone["match"]:
            guilty[w.target] = "its backward trains the model differently from eager: alone, " + "; ".join(
                alone["problems"])
    return guilty
