"""What a target's own history says about it: the scheduler's learned estimates.

- its pass rate (failures are a target's cost with nothing to show for it), over every proposal;
- its keep rate while it still pays: keeps among the passes up to its last keep (the passes since
  then are what the next point weighs), with a prior of KEEP_PRIOR;
- whether it still hides a gap: a target with a gap left is kept at its keep rate k, so m passes in
  a row without a keep happen with chance (1 - k)^m; against a prior of STILL_PAYS, Bayes gives the
  chance that the gap is still there. Ten dry passes of a target kept one pass in three leave
  about 1%: a target that has stopped paying is left, whatever the plan promised for it;
- its reachable ceiling: a saturating fit of its best speedup over its keeps (a Ford-Walford fit:
  each keep wins a fixed part of what is left, so y_k = a + b * y_(k-1) in log speedup, with the
  asymptote a / (1 - b)); the plan's roofline ceiling is its upper bound and, with few keeps, its
  prior, not an estimate;
- what a keep wins: its recent keeps' gains (discounted by DISCOUNT per keep), with the fitted
  part of the gap as their prior, never more than the gap to its reachable ceiling;
- what the next proposal is expected to win: pass rate x (the chance it still pays x its keep rate,
  plus a UCB term EXPLORE * sqrt(log(the run's passes) / (1 + its passes)), so a target tried too
  little is not written off) x what a keep wins.

The record is kept beside the history (like TargetState's tally) and only the entries appended
since the last call are read, so asking after every experiment costs the same late in a run as
early: `learned` on a history read in pieces equals `learned` on the whole of it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from autokernel.search.run import TargetState

KEEP_STEP = 0.3  # the prior part of the remaining gap a keep wins (log speedup)
KEEP_PRIOR = (1.0, 2.0)  # (keeps, passes) the keep rate starts from: one pass in three kept
STILL_PAYS = 0.7  # the prior chance that a gap is left after a keep (or the baseline)
PRIOR_FIT = 3.0  # keeps the roofline prior weighs as, against the fit of the target's own keeps
PRIOR_GAIN_KEEPS = 0.2  # keeps the fitted step's prior weighs as, against what its keeps won
DISCOUNT = 0.7  # per keep: what a keep wins is judged on its last few keeps (gains shrink)
EXPLORE = 0.05  # the UCB term's weight on the keep rate


@dataclass(frozen=True)
class Learned:
    proposals: int = 0
    passes: int = 0
    keeps: int = 0
    dry_passes: int = 0  # passes since its last keep (or its baseline)
    gain: float = 0.0  # discounted sum of its keeps' log gains over the best before them
    weight: float = 0.0  # discounted count of its keeps
    keep_logs: tuple[float, ...] = ()  # log speedup vs eager of the baseline's best and each keep, in order

    @property
    def pass_rate(self) -> float:
        return (self.passes + 1) / (self.proposals + 2)

    @property
    def keep_rate(self) -> float:
        """P(keep | pass) while a gap is left: the passes up to its last keep, with a prior."""
        keeps, passes = KEEP_PRIOR
        return (self.keeps + keeps) / (self.passes - self.dry_passes + passes)

    @property
    def still_pays(self) -> float:
        """The chance that a gap is still left after its dry passes (Bayes, see the module)."""
        dry = STILL_PAYS * (1.0 - self.keep_rate) ** self.dry_passes
        return dry / (dry + 1.0 - STILL_PAYS)


def learned(t: TargetState) -> Learned:
    """The target's learned record, updated from the entries appended since the last call."""
    history = t.history
    held = t.__dict__.get("_learned")
    if held is None or held[0] is not history or held[1] > len(history) or (
            held[1] and history[held[1] - 1] is not held[2]):
        held = (history, 0, None, Learned())  # another list, or one rewritten: read it all
    now = held[3]
    for h in history[held[1]:]:
        now = _step(now, h, t.eager_median_us)
    t.__dict__["_learned"] = (history, len(history), history[-1] if history else None, now)
    return now


def _step(now: Learned, h: dict, eager_us: float | None) -> Learned:
    """The record after one more history entry."""
    decision, passed = h.get("decision"), h.get("verdict") == "PASS"
    logs = now.keep_logs
    if decision in ("KEEP", "BASELINE") and passed and h.get("median_us") and eager_us:
        logs = (*logs, math.log(eager_us / h["median_us"]))
    if decision == "BASELINE":
        return Learned(now.proposals, now.passes, now.keeps, 0, now.gain, now.weight, logs)
    kept = decision == "KEEP"
    gain, weight = now.gain, now.weight
    if kept:
        won = math.log(h["speedup_vs_best"]) if h.get("speedup_vs_best") else 0.0
        gain, weight = DISCOUNT * gain + max(won, 0.0), DISCOUNT * weight + 1.0
    dry = 0 if kept else now.dry_passes + passed
    return Learned(now.proposals + 1, now.passes + passed, now.keeps + kept, dry, gain, weight, logs)


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
    if not 0.0 < b < 1.0 - 1e-6:  # b at 1 (to rounding): steady gains, no asymptote in sight
        return None
    a = my - b * mx
    return a / (1.0 - b), 1.0 - b


def reachable(t: TargetState, roofline: float, best: float) -> tuple[float, float]:
    """(the reachable ceiling, the part of the gap a keep wins): the fit of the target's keeps,
    weighed against the roofline as a prior by how many keeps there are; never above the
    roofline, never below the best."""
    own = learned(t)
    top = math.log(max(roofline, best))
    fit = walford(own.keep_logs)
    log_ceiling, step = top, KEEP_STEP
    if fit is not None:
        asymptote, fitted_step = fit
        weight = len(own.keep_logs) - 2
        log_ceiling = (PRIOR_FIT * top + weight * min(asymptote, top)) / (PRIOR_FIT + weight)
        step = (PRIOR_FIT * KEEP_STEP + weight * fitted_step) / (PRIOR_FIT + weight)
    return best * math.exp(max(log_ceiling - math.log(best), 0.0)), step


def exploration(own: Learned, run_passes: int) -> float:
    """The UCB term added to the chance of a keep: it shrinks as the target's passes grow."""
    return EXPLORE * math.sqrt(math.log(2.0 + run_passes) / (1.0 + own.passes))


def expected_log_gain(t: TargetState, roofline: float, best: float, run_passes: int) -> float:
    """What the next proposal on `t` is expected to win, in log speedup, optimistic by what is still
    unknown (see the module's docstring); `run_passes`: the passes of every target in the run."""
    own = learned(t)
    ceiling, step = reachable(t, roofline, best)
    left = math.log(ceiling / best)
    if left <= 0.0:
        return 0.0
    per_keep = (PRIOR_GAIN_KEEPS * step * left + own.gain) / (PRIOR_GAIN_KEEPS + own.weight)
    chance = min(own.still_pays * own.keep_rate + exploration(own, run_passes), 1.0)
    return own.pass_rate * chance * min(per_keep, left)
