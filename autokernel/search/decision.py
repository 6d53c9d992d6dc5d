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


def decide(verdict: dict | None, target: TargetState) -> str:
    """KEEP when every stage passed and the candidate is faster than the best beyond noise."""
    if not verdict or verdict.get("verdict") != "PASS" or not (verdict.get("timing") or {}).get("median_us"):
        return "REVERT"
    if verdict["timing"].get("spread_ok") is False:  # a median its reps' spread makes meaningless
        return "REVERT"
    if target.best_median_us is None:
        return "KEEP"
    return "KEEP" if faster_beyond_noise(verdict["timing"], target.best_median_us, target.best_iqr_us,
                                         target.best_reps) else "REVERT"


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

