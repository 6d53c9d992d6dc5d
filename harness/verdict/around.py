"""Shapes around a target: where a kernel is also checked and timed, so that it can be trusted with
the other shapes a model calls it at (sequence lengths, batches, one decode token).

A kernel type's dims are of two kinds. Its *free* dims vary from call to call of one model: the
rows of a row kernel, a linear or an MLP (M: batch x sequence), the rows of cross_entropy (N),
the batch and sequence of attention and rotary (B, S). The others are the model's own sizes
(widths, heads, head size, vocabulary, the weights' shapes), the same in every call: around a
target they stay the target's.

Around a target the judge takes the main free dim halved plus an odd remainder (a ragged tile
edge), doubled, and 1 (one decode token: the decode shape of a linear or an MLP), and for
attention and rotary the batch doubled too. Each shape is timed like the target: PyTorch's eager
op in the clean baseline worker (harness/workers/baseline.py), the kernel after the target's timing, the inputs refilled
before every rep and every rep reported to the judge's witness as it ends (harness/timing/witness.py).
The parent never takes the worker's word for it: it checks each shape's timed output against the
float64 reference and its reported median against its own clock. A shape is proven where the
output was right; its figures say whether the kernel is faster there; a figure the judge's clock
does not back is a lie, and fails the candidate's integrity.

The search asks for this only for a candidate that may be kept (`below_us`: the best time at the
target so far); the worker skips it when its own target timing is not below that, so a slow
candidate costs nothing more.
"""
from __future__ import annotations

from pathlib import Path

from harness.kernel_types.registry import Case
# the stage names and budgets are part of the judge's plan (the records are held to them)
from harness.correctness.cases import AROUND_CPU_BUDGET as CPU_BUDGET, AROUND_STAGE as STAGE, around_limits as limits

# the dims of each kernel type that vary between calls of one model; the last one is halved,
# doubled and set to 1 around a target (autokernel/deploy/routing/serving.py holds the same table)
FREE_DIMS: dict[str, tuple[str, ...]] = {
    "matmul": ("M",), "fused_mlp": ("M",), "softmax": ("M",), "layernorm": ("M",), "rmsnorm": ("M",),
    "reduce": ("M",), "cross_entropy": ("N",), "flash_attention": ("B", "S"), "rotary_embedding": ("B", "S"),
    "add_rmsnorm": ("M",), "silu_mul": ("M",), "rotary_qk": ("B", "S"), "linear_cross_entropy": ("N",),
}
SEED = 8000  # seeds of the cases around a target: apart from every stage's (harness/correctness/cases.py)


def half_odd(n: int) -> int:
    """n halved plus an odd remainder, itself odd: 128 -> 67, 512 -> 259."""
    return (n // 2 + 3) | 1


def cases(target: Case | None, judged_dtype: str) -> list[Case]:
    """The shapes around `target` in the dtype it is judged in. None is more than twice the target,
    which is timed anyway: on the CPU too, where the interpreter times each of them once."""
    free = FREE_DIMS.get(target.kernel_type) if target is not None else None
    if not free:
        return []
    main, dims = free[-1], target.dims
    shapes = [{**dims, main: v} for v in (half_odd(dims[main]), 2 * dims[main], 1)]
    if len(free) > 1:
        shapes.append({**dims, free[0]: 2 * dims[free[0]]})
    found, seen = [], {tuple(dims.items())}
    for dims_around in shapes:
        key = tuple(dims_around.items())
        if key in seen:
            continue
        seen.add(key)
        found.append(target.replace(shape=key, dtype=judged_dtype, seed=SEED + 10 * len(found), variant="plain"))
    return found


# ---------------------------------------------------------------- the worker's side
def time_around(w, judged_dtype: str, target_timing, below_us: float | None, time_candidate) -> None:
    """In the worker, after the target's timing: time and record each shape around it, unless the
    target's own time says this candidate will not be kept."""
    if target_timing is None:
        return
    if below_us is not None and target_timing.median_us >= below_us:
        w.log.event(event="around_skipped", reason=f"{target_timing.median_us:.4g} us at the target is not below "
                                                   f"the best so far ({below_us:.4g} us)")
        return
    for i, case in enumerate(cases(w.target, judged_dtype)):
        time_candidate(w, case, stage=f"{STAGE}:{i}", budget=limits(w.device))
        if not w.untouched(f"after {STAGE}:{i}"):
            return


# ---------------------------------------------------------------- the parent's side
def assess(events: list[dict], out_dir: Path, shapes: list[Case], device: str, witnessed=None) -> dict:
    """Each shape's figures and whether its timed output was right, from the worker's records,
    rechecked here, and its figures checked against the judge's witness (`witnessed`, a
    harness/timing/witness.py Record). {"shapes": [...], "skipped": why or None}."""
    skipped = next((e.get("reason") for e in events if e.get("event") == "around_skipped"), None)
    if skipped:
        return {"shapes": [], "skipped": str(skipped)}
    return {"shapes": [_shape(events, out_dir, i, case, device, witnessed) for i, case in enumerate(shapes)],
            "skipped": None}


def around_lie(assessed: dict | None) -> str | None:
    """The first shape whose reported time the judge's own clock does not back, as the reason."""
    for row in (assessed or {}).get("shapes", []):
        if row.get("lie"):
            return f"at {row['shape']}: {row['detail']}"
    return None


def _witnessed(end: dict, stage: str, witnessed, device: str) -> tuple[str | None, dict]:
    """The shape's record with the figures the judge witnessed, or why they cannot be trusted."""
    from harness.timing.measurement import kernel_phase
    from harness.verdict.timing_checks import witnessed_rounds
    if witnessed is None:
        return None, end
    problem, end = witnessed_rounds(end, witnessed, device, kernel_phase(stage))
    if problem and "differs from the reps" not in problem and "without reporting" not in problem \
            and "does not send" not in problem:
        return problem, end
    if problem:
        return "the worker's timing record differs from the reps it reported to the judge as they ended", end
    return None, end


def _shape(events: list[dict], out_dir: Path, i: int, case: Case, device: str, witnessed=None) -> dict:
    from harness.timing.measurement import budget
    from harness.device.roofline import below_floor
    from harness.verdict.timing_checks import timed_calls_problem
    from harness.verdict.verdict_checks import _Checker
    stage = f"{STAGE}:{i}"
    # ok: proven here; failed: the kernel was wrong here (or raised, or beat the hardware); neither:
    # not checked (the worker stopped first, or did not confirm its clocks)
    row = {"shape": case.label(), "dims": case.dims, "ok": False, "failed": False, "detail": "", "median_us": None,
           "baseline_median_us": None, "speedup_vs_eager": None, "representative_of_gpu": device == "cuda"}
    end = next((e for e in events if e.get("event") == "stage_end" and e.get("stage") == stage), None)
    recs = [e for e in events if e.get("event") == "case" and e.get("stage") == stage]
    confirmed = any(e.get("event") == "identity" and e.get("where") == f"after {stage}" and not e.get("replaced")
                    for e in events)
    if end is None:
        return {**row, "detail": "not timed: the worker stopped before this shape"}
    if end.get("status") != "pass" or not recs:
        return {**row, "failed": end.get("status") == "fail", "detail": str(end.get("detail") or "no timed output")}
    from harness.verdict.records import RecordProblem
    try:
        problem = timed_calls_problem(recs, case, limits(device) or budget(device), end,
                                      _Checker(out_dir, None, device, witnessed))
    except RecordProblem as e:  # an output rewritten after it was saved: a lie, as a time the clock denies
        return {**row, "failed": True, "lie": True, "detail": str(e)}
    if problem:
        return {**row, "failed": True, "detail": f"wrong result: {problem}"}
    lie, end = _witnessed(end, stage, witnessed, device)
    if lie:
        return {**row, "failed": True, "lie": True, "detail": lie}
    kernel, eager = end["kernel"], end.get("eager") or {}
    impossible = below_floor(case, kernel["median_us"], device)
    if impossible:  # a clock that hides the time
        return {**row, "failed": True, "detail": impossible}
    if not confirmed:  # no word that the clocks were still the judge's own: the figures prove nothing
        return {**row, "detail": "the worker did not confirm its clocks after timing this shape"}
    return {**row, "ok": True, "detail": "timed output within tolerance", "median_us": kernel["median_us"],
            "iqr_us": kernel["iqr_us"], "reps": kernel["reps"], "baseline_median_us": eager.get("median_us"),
            "baseline_iqr_us": eager.get("iqr_us"), "baseline_reps": eager.get("reps"),
            "speedup_vs_eager": eager["median_us"] / kernel["median_us"] if eager and kernel["median_us"] > 0 else None,
            "representative_of_gpu": bool(kernel["representative_of_gpu"]), "method": kernel["method"]}
