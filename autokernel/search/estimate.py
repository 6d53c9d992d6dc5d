"""What a target's own history says about it: the scheduler's learned estimates.

- its pass rate (failures are a target's cost with nothing to show for it), over every proposal;
- its recent keep rate among passes: counts discounted by DISCOUNT per proposal, so a target that
  has stopped paying is seen to have stopped within a few experiments, and a revisit that pays
  again is seen as quickly;
- the part of the remaining gap a keep wins, learned from its keeps;
- its reachable ceiling: a saturating fit of its best speedup over its keeps (a Ford-Walford fit:
  each keep wins a fixed part of what is left, so y_k = a + b * y_(k-1) in log speedup, with the
  asymptote a / (1 - b)); the plan's roofline ceiling is its upper bound and, with few keeps, its
  prior, not an estimate;
- its minutes per experiment.

The estimates are kept beside the history (like TargetState's tally) and only the entries appended
since the last call are read, so asking after every experiment costs the same late in a run as
early. Pure functions of a TargetState otherwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from autokernel.search.run import TargetState

DISCOUNT = 0.9  # per proposal: the keep rate remembers about the last ten passes
KEEP_STEP = 0.3  # the prior part of the remaining gap a keep wins (log speedup)
PRIOR_KEEPS = 1.0  # Beta prior of the keep rate: one keep in two passes, before any record
DRY = 10.0  # passes without a keep that halve the gap a target is believed to hide
PRIOR_FIT = 3.0  # keeps the roofline prior weighs as, against the fit of the target's own keeps


@dataclass(frozen=True)
class Learned:
    proposals: int
    passes: int
    keeps: int
    recent_passes: float  # discounted
    recent_keeps: float  # discounted
    recent_gain: float  # discounted sum of the log speedup each proposal won (0 unless kept)
    recent_weight: float  # discounted count of proposals
    dry_passes: int  # passes since its last keep (or its baseline)
    keep_logs: tuple[float, ...]  # log speedup vs eager of the baseline's best and each keep, in order

    @property
    def pass_rate(self) -> float:
        return (self.passes + 1) / (self.proposals + 2)

    @property
    def keep_rate(self) -> float:
        """P(keep | pass), recent: Beta posterior mean over discounted counts."""
        return (self.recent_keeps + PRIOR_KEEPS) / (self.recent_passes + 2 * PRIOR_KEEPS)

    @property
    def keep_rate_sd(self) -> float:
        a = self.recent_keeps + PRIOR_KEEPS
        b = self.recent_passes - self.recent_keeps + PRIOR_KEEPS
        return math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))


def learned(t: TargetState) -> Learned:
    """The target's learned record, updated from the entries appended since the last call."""
    history = t.history
    held = t.__dict__.get("_learned")
    if held is None or held[0] is not history or held[1] > len(history) or (
            held[1] and history[held[1] - 1] is not held[2]):
        held = (history, 0, None, Learned(0, 0, 0, 0.0, 0.0, 0.0, 0.0, 0, ()))
    _, counted, _, now = held
    proposals, passes, keeps = now.proposals, now.passes, now.keeps
    recent_passes, recent_keeps, logs = now.recent_passes, now.recent_keeps, list(now.keep_logs)
    gain, weight, dry = now.recent_gain, now.recent_weight, now.dry_passes
    for h in history[counted:]:
        kept = h.get("decision") in ("KEEP", "BASELINE") and h.get("verdict") == "PASS" and h.get("median_us")
        if kept and t.eager_median_us:
            logs.append(math.log(t.eager_median_us / h["median_us"]))
        if h.get("decision") != "REVERT":  # a baseline or a keep: a new best to start from
            dry = 0
        if h.get("decision") == "BASELINE":
            continue
        passed = h.get("verdict") == "PASS"
        dry += passed and h.get("decision") == "REVERT"
        proposals, passes, keeps = proposals + 1, passes + passed, keeps + (h.get("decision") == "KEEP")
        recent_passes = DISCOUNT * recent_passes + passed
        recent_keeps = DISCOUNT * recent_keeps + (h.get("decision") == "KEEP")
        won = math.log(h["speedup_vs_best"]) if h.get("decision") == "KEEP" and h.get("speedup_vs_best") else 0.0
        gain, weight = DISCOUNT * gain + max(won, 0.0), DISCOUNT * weight + 1.0
    now = Learned(proposals, passes, keeps, recent_passes, recent_keeps, gain, weight, dry, tuple(logs))
    t.__dict__["_learned"] = (history, len(history), history[-1] if history else None, now)
    return now


def walford(logs: tuple[float, ...]) -> tuple[float, float] | None:
    """(asymptote, part of the gap a keep wins) of y_k = a + b * y_(k-1), least squares, or None
    when the keeps do not saturate (fewer than three, or gains that do not shrink)."""
    if len(logs) < 3:
        return None
    xs, ys = logs[:-1], logs[1:]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 1e-12:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    if not 0.0 < b < 1.0:
        return None
    a = my - b * mx
    return a / (1.0 - b), 1.0 - b


def reachable(t: TargetState, roofline: float, best: float) -> tuple[float, float]:
    """(the reachable ceiling, the part of the gap a keep wins): the fit of the target's keeps,
    weighed against the roofline as a prior by how many keeps there are, then shrunk towards its
    best by the passes since its last keep (a gap of L is missed by m passes in a row with a
    chance that falls with m / L, so the gap it can still hide falls as DRY / (DRY + m)); never
    above the roofline, never below the best."""
    own = learned(t)
    top = math.log(max(roofline, best))
    fit = walford(own.keep_logs)
    log_ceiling, step = top, KEEP_STEP
    if fit is not None:
        asymptote, fitted_step = fit
        weight = len(own.keep_logs) - 2
        log_ceiling = (PRIOR_FIT * top + weight * min(asymptote, top)) / (PRIOR_FIT + weight)
        step = (PRIOR_FIT * KEEP_STEP + weight * fitted_step) / (PRIOR_FIT + weight)
    left = max(log_ceiling - math.log(best), 0.0) * DRY / (DRY + own.dry_passes)
    return best * math.exp(left), step
