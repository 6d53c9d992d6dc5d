"""Keep or revert: a passing candidate is kept only when it beats the best beyond the noise of both
timings; and what a target still offers the model end to end, which orders the run's time.
"""
from __future__ import annotations

import math

from autokernel.search.run import TargetState

# McGill, Tukey & Larsen (1978) notches: median +- 1.57 * IQR / sqrt(n); two medians whose notches
# do not overlap differ at roughly 95% confidence. A speedup smaller than that is noise.
NOTCH = 1.57


def notch_us(median_us: float, iqr_us: float | None, reps: int | None) -> float:
    return NOTCH * (iqr_us or 0.0) / math.sqrt(max(reps or 1, 1))


def faster_beyond_noise(new: dict, best_median_us: float, best_iqr_us: float | None,
                        best_reps: int | None) -> bool:
    """True when the new timing's median beats the best by more than both medians' uncertainty."""
    new_high = new["median_us"] + notch_us(new["median_us"], new.get("iqr_us"), new.get("reps"))
    best_low = best_median_us - notch_us(best_median_us, best_iqr_us, best_reps)
    return new_high < best_low


def has_backward(source: str) -> bool:
    """Whether a kernel file gives a backward_fn (the contract's training half)."""
    import re
    return re.search(r"^def backward_fn\(", source, re.M) is not None


def ranked(verdict: dict | None) -> dict | None:
    """A verdict as a training run ranks it. Its target's share of the step is its forward's time
    plus its backward's, so the kernel is timed by one forward plus backward against eager
    autograd's: `timing` becomes the judge's forward_backward figures (the forward's spread rule
    still applies). A kernel whose backward failed, or that gives none, serves inference alone,
    which a training step cannot use: here a FAIL at `backward:<stage>`, untimed. The forward's grid
    rule goes with it (`fills_target`). The verdict on disk stays the judge's own; this is the view
    the decision, the tuner, the leaderboard and the state see."""
    if not verdict or verdict.get("verdict") != "PASS":
        return verdict
    back = verdict.get("backward")
    if not isinstance(back, dict) or back.get("verdict") != "PASS":
        if isinstance(back, dict):
            failed = back.get("failed_stage") or "run"
            detail = next((st.get("detail") for st in back.get("stages") or []
                           if st.get("name") == failed and st.get("status") == "fail"), None)
            detail = detail or f"the backward {str(back.get('verdict', 'FAIL')).lower()} at {failed}"
        else:
            failed, detail = "missing", "the file gives no backward_fn: it serves inference only"
        stage = f"backward:{failed}"
        return {**verdict, "verdict": "FAIL", "failed_stage": stage, "timing": None,
                "stages": list(verdict.get("stages") or []) + [{"name": stage, "status": "fail", "detail": detail}]}
    forward = verdict.get("timing") or {}
    both = (back.get("timing") or {}).get("forward_backward") or {}
    timing = {"step": "forward_backward", "median_us": both.get("median_us"), "iqr_us": both.get("iqr_us"),
              "reps": both.get("reps"), "baseline_median_us": both.get("eager_median_us"),
              "speedup_vs_eager": both.get("speedup_vs_eager"),
              "compiled_median_us": both.get("compiled_median_us"),
              "spread_ok": forward.get("spread_ok"), "spread_note": forward.get("spread_note"),
              # a training step runs the forward too: a CPU time won by a forward grid a GPU would
              # leave idle chooses nothing (fills_target), in training as in inference
              "representative_of_gpu": (back.get("timing") or {}).get("representative_of_gpu",
                                                                  forward.get("representative_of_gpu")),
              "grid": forward.get("grid")}
    return {**verdict, "timing": {k: v for k, v in timing.items() if v is not None}}


def decide(verdict: dict | None, target: TargetState) -> str:
    """KEEP when every stage passed and the candidate is faster than the best beyond noise."""
    if not verdict or verdict.get("verdict") != "PASS" or not (verdict.get("timing") or {}).get("median_us"):
        return "REVERT"
    if verdict["timing"].get("spread_ok") is False:  # a median its reps' spread makes meaningless
        return "REVERT"
    if not fills_target(verdict["timing"]):  # a CPU time won by a grid a GPU would leave idle
        return "REVERT"
    if target.best_median_us is None:
        return "KEEP"
    return "KEEP" if faster_beyond_noise(verdict["timing"], target.best_median_us, target.best_iqr_us,
                                         target.best_reps) else "REVERT"


def fills_target(timing: dict) -> bool:
    """Whether a timing may choose a kernel for the target GPU: always on a GPU; on the CPU (the
    interpreter's times) only where its heaviest launch has the programs to fill that GPU at the
    target shape (the judge's timing["grid"], harness/verdict/grid_fill.py). A KernelBench module's
    timing has no grid (a ModelNew launches what it likes): the rule does not reach it."""
    grid = timing.get("grid")
    if timing.get("representative_of_gpu") is not False or grid is None:
        return True
    return bool(grid.get("fills_target"))


def left_to_win(target: TargetState) -> float:
    """Share of the model's time still to be won on this target if it reached its ceiling
    (inf when unknown: keep searching)."""
    speedup = target.speedup_vs_eager
    if not speedup or not target.ceiling_speedup:
        return math.inf
    return target.share * max(1.0 / speedup - 1.0 / target.ceiling_speedup, 0.0)


def offer(target: TargetState) -> float:
    """Share of the model's time a target could win from eager to its ceiling."""
    return target.share * (1.0 - 1.0 / target.ceiling_speedup) if target.ceiling_speedup else 0.0

