"""Which target gets the next experiment, and with which strategy.

The frame is plain round robin's, so the scheduler cannot do much worse than it by construction:
every target's baseline first (one verdict each, so the choices after it rest on measured starts
and every target has a kernel for verify to serve even on a short budget); a visit goes on until a
plateau parks the target; a parked target is still eligible and comes back with the next strategy
of its rotation. Within that frame, a target with fewer than FLOOR of an even split of the
experiments comes next (nothing is written off early), and otherwise the one with the highest
expected end-to-end gain per minute: Amdahl over the model for what its next experiment is expected
to win (autokernel.search.estimate: its pass rate, whether its record says it still pays, what its
keeps win, a UCB term), divided by its minutes per experiment. A target within noise of its
roofline ceiling is done, unless its best went beyond the roofline, which shows the roofline wrong.

The frame is bounded by the time left (`left_s`): a visit is worth what it can return before the
budget ends, so a target whose next experiment (at its own pace) cannot end before the budget does
is not visited, and the baseline round and the minimum of turns cover only the targets the time
left can pay back: the most worth per minute first, each claiming the experiments its gap would take
(PAYBACK to PAYBACK_MAX), as many as the time left holds; a baseline whose claim does not fit is
measured only where the experiments after it still win what the best measured target does. With a
night ahead that is every target; with three minutes, the largest. A visit under way goes on to its
plateau before a baseline the time left comes to pay back later. On the CPU (`cpu`) nothing pays
back (the interpreter is hundreds of times slower than PyTorch), and the frame covers every target
whose next verdict fits: a CPU run's budget returns verdicts, each starter judged, the largest
first. In the last stretch, once the time left holds no more than EXPLORE_AFTER of a target's
experiments (twice what one target's payback may claim), its proposals build on the best alone
(`explores_parents`): another elite's line would catch up with the best, and pay back, only later.

Speeds count as served: a best slower than PyTorch's op is not served, so it counts as 1x.

Everything here is a pure function of the targets' states (autokernel.search.run.TargetState):
the search (run_search.py) and the simulated night (benchmarks/night.py) use the same code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from autokernel.search import estimate
from autokernel.search.decision import notch_us
from autokernel.search.run import TargetState

# Where the plan knows no ceiling: a conservative guess, so such a target is neither ignored nor
# preferred over one whose ceiling was measured.
DEFAULT_CEILING = 2.0
PRIOR_SECONDS = 60.0  # per experiment, until a target has a record of its own
FLOOR = 0.35  # of round robin's even split: the experiments every eligible target is sure of
MIN_NOISE = 0.03  # a best within 3% of the ceiling is at the ceiling, whatever its spread says
# experiments a target needs to pay back its baseline: the baseline, a plateau's 8 and a keep
PAYBACK = 10
PAYBACK_MAX = 30  # experiments: the most of the time left one target's payback may claim
# experiments the time left must hold for a proposal to build on another elite than the best: its
# line must catch up with the best (up to a payback's worth) and then pay back (as many again)
EXPLORE_AFTER = 2 * PAYBACK_MAX

LLM_STRATEGIES = ("refine", "next_tier", "different_algorithm", "ideas_first")
TUNER_STRATEGIES = ("tune", "reseed")


@dataclass(frozen=True)
class Choice:
    """The scheduler's answer: the target (its index) for the next experiment and why, in words."""

    index: int
    gain_per_min: float
    why: str


def speedup_now(t: TargetState) -> float:
    """The target's best speedup over PyTorch eager so far (1.0 until it has one)."""
    return t.speedup_vs_eager or 1.0


def roofline_disproved(t: TargetState) -> bool:
    """Its best is beyond its roofline ceiling by more than noise: the plan's peaks read low, and
    the roofline says nothing of where this target stops."""
    if not t.ceiling_speedup or not t.speedup_vs_eager:
        return False
    return t.speedup_vs_eager > t.ceiling_speedup * (1.0 + _noise(t))


def ceiling_of(t: TargetState) -> float:
    """Its roofline ceiling; where none is known, or its best disproved it, a guess above its best."""
    if t.ceiling_speedup and not roofline_disproved(t):
        return t.ceiling_speedup
    return max(DEFAULT_CEILING, 1.5 * speedup_now(t))


def served(speedup: float) -> float:
    """What a speedup is worth to the model: a kernel slower than PyTorch's op is not served (the
    model runs the op as before), so below 1x it wins nothing."""
    return max(speedup, 1.0)


def model_time(targets: Sequence[TargetState]) -> float:
    """The model's time now, as a fraction of its eager time (Amdahl over every target's best as
    served)."""
    return 1.0 - sum(t.share * (1.0 - 1.0 / served(speedup_now(t))) for t in targets)


def left_share(t: TargetState) -> float:
    """The share of the model's eager time still to win on this target, best -> ceiling."""
    return t.share * max(1.0 / served(speedup_now(t)) - 1.0 / served(ceiling_of(t)), 0.0)


def e2e_gain_left(targets: Sequence[TargetState], t: TargetState) -> float:
    """How much faster the whole model would be if this target alone reached its ceiling."""
    now = model_time(targets)
    return now / max(now - left_share(t), 1e-12)


def _noise(t: TargetState) -> float:
    if not t.best_median_us:
        return MIN_NOISE
    return max(notch_us(t.best_median_us, t.best_iqr_us, t.best_reps) / t.best_median_us, MIN_NOISE)


def at_roofline(t: TargetState) -> bool:
    """Its best is within noise of its roofline ceiling, or beyond it: the plain rule, which trusts
    the plan's ceiling (round robin's)."""
    if not t.ceiling_speedup or not t.best_median_us or not t.speedup_vs_eager:
        return False
    return t.speedup_vs_eager * (1.0 + _noise(t)) >= t.ceiling_speedup


def at_ceiling(t: TargetState) -> bool:
    """Within noise of its roofline ceiling, and not beyond it: searching it further cannot pay. A
    best beyond the roofline shows the roofline wrong, and the search goes on to find the real one."""
    return at_roofline(t) and not roofline_disproved(t)


def expected_log_gain(targets: Sequence[TargetState], t: TargetState) -> float:
    """What the next experiment on `t` is expected to win, in log speedup (autokernel.search.estimate)."""
    passes = sum(o.record.passes for o in targets)
    return estimate.expected_log_gain(t, ceiling_of(t), speedup_now(t), passes)


def minutes_per_experiment(targets: Sequence[TargetState], t: TargetState) -> float:
    """Its own time per experiment so far; for a target not yet tried, the run's (so a fresh
    target is neither favoured nor held back by a guess), PRIOR_SECONDS before anything ran."""
    experiments, seconds = len(t.history), t.seconds
    if not experiments or seconds <= 0:
        experiments = sum(len(o.history) for o in targets if o.seconds > 0)
        seconds = sum(o.seconds for o in targets if o.history)
    per_s = seconds / experiments if experiments and seconds > 0 else PRIOR_SECONDS
    return max(per_s, 1e-3) / 60.0


def gain_per_min(targets: Sequence[TargetState], t: TargetState) -> float:
    """Expected end-to-end gain (the model's speedup minus 1) per minute of search on `t`. A best
    slower than PyTorch's op is not served, so the step is counted from 1x as served: a target
    below 1x is worth what its gap above 1x is, not what climbing back to PyTorch's speed would win
    on paper."""
    start = served(speedup_now(t))
    after = min(start * math.exp(expected_log_gain(targets, t)), max(ceiling_of(t), start))
    before = model_time(targets)
    gain = before / max(before - t.share * (1.0 / start - 1.0 / after), 1e-12) - 1.0
    return gain / minutes_per_experiment(targets, t)


def eligible(t: TargetState) -> bool:
    return t.status != "done" and not t.blocked


def choose(targets: Sequence[TargetState], current: int | None = None, cpu: bool = False,
           left_s: float = math.inf) -> Choice | None:
    """The target for the next experiment (None: no target is left to search, or none whose next
    experiment can end, or pay back, within `left_s`, the seconds of budget left). Round robin's frame, kept
    exactly where the time left holds every target: every target's baseline first, the current
    target keeps its turn until a plateau parks it, and eligible means not done and not blocked.
    Then a target with fewer than FLOOR of the experiments round robin would have given it comes
    first (the fewest first), so no target is written off early; otherwise the one with the highest
    expected end-to-end gain per minute. The baseline round and the minimum of turns cover only the
    targets the time left can pay back (`payback`); a target whose next experiment cannot end
    before the budget does is not visited at all. `cpu`: the timings are the Triton interpreter's:
    the baseline round and the minimum of turns cover every target whose verdict fits (`_paid`), and
    the reason given says so instead of a ceiling."""
    left = [i for i, t in enumerate(targets) if eligible(t) and fits(targets, t, left_s)]
    if not left:
        return None
    if current in left and targets[current].proposals:  # a visit goes on: a baseline waits for its plateau
        return Choice(current, gain_per_min(targets, targets[current]), "its visit goes on until a plateau")
    scores = {i: gain_per_min(targets, targets[i]) for i in left}
    if any(not targets[i].history for i in left):
        fresh = [i for i in _paid(targets, left, scores, left_s, cpu) if not targets[i].history]
        if fresh:  # every target the time left can pay back measured once before any is searched further
            first = min(fresh, key=lambda i: (-targets[i].share, i))
            measured = sum(1 for t in targets if t.history)
            return Choice(first, 0.0, f"the baseline round: each target's starter is measured once before any "
                          f"is searched ({measured} of {len(targets)} measured so far"
                          f"{_covering(targets, left, scores, left_s, cpu)}); {targets[first].share:.0%} of the model")
    paid = _paid(targets, left, scores, left_s, cpu)
    measured = [i for i in left if targets[i].history]  # a baseline outside the payback is not measured
    if not measured:  # none measured can be searched, and no baseline can pay back in the time left
        return None
    fair = fair_share(targets, paid)
    behind = [i for i in paid if len(targets[i].history) < FLOOR * fair]
    if behind:
        first = min(behind, key=lambda i: (len(targets[i].history), i))
        return Choice(first, scores[first], f"{len(targets[first].history)} experiments, fewer than "
                      f"{FLOOR:.0%} of an even split ({fair:.0f}): every target keeps a minimum of turns")
    best = max(measured, key=lambda i: (scores[i], -i))
    return Choice(best, scores[best], _why(targets, best, scores, cpu))


def fits(targets: Sequence[TargetState], t: TargetState, left_s: float) -> bool:
    """Its next experiment, at its pace (`pace_s`), can end before the budget does. A target with no
    record of its own takes at least as long as the verdicts measured so far (a verdict is the least
    an experiment costs: a first baseline that took seven minutes says a second will not take the
    prior minute). Before anything has run there is no pace to go by, and every target fits."""
    measured = [o for o in targets if o.history and o.seconds > 0]
    if not measured:
        return True
    least = 0.0 if t.history else sum(o.seconds for o in measured) / sum(len(o.history) for o in measured)
    return max(pace_s(targets, t), least) <= left_s


def pace_s(targets: Sequence[TargetState], t: TargetState) -> float:
    """Seconds per experiment of its search: its own once it has proposals; before, at least the
    pace of the targets searched so far (a baseline is a verdict alone, without the proposal a
    search's experiment waits for), PRIOR_SECONDS before any was searched."""
    own = t.seconds / len(t.history) if t.history and t.seconds > 0 else 0.0
    if t.proposals:
        return max(own, 1e-3)
    searched = [o for o in targets if o.proposals and o.seconds > 0]
    run = (sum(o.seconds for o in searched) / sum(len(o.history) for o in searched)) if searched else PRIOR_SECONDS
    return max(own, run)


def payback(targets: Sequence[TargetState], left: Sequence[int], scores: dict[int, float],
            left_s: float) -> list[int]:
    """The targets the time left can pay back: the most expected gain per minute first, each taking
    the experiments it can use (`visit_experiments`) at its pace, while the time left holds them.
    The first is always among them where it has been measured, or where nothing has been (a run's
    first baseline has no pace to go by); one not yet measured otherwise only where its baseline
    pays back (`baseline_pays`). With a night ahead that is every target."""
    order = sorted(left, key=lambda i: (-scores[i], i))
    searched = [scores[i] for i in left if targets[i].history]
    paid, spent = [], 0.0
    for i in order:
        t = targets[i]
        spent += visit_experiments(targets, t) * pace_s(targets, t)
        if spent > left_s and (paid or (not t.history and any(o.history for o in targets)
                                        and not baseline_pays(scores[i], pace_s(targets, t), left_s, searched))):
            break
        paid.append(i)
    return paid


def baseline_pays(score: float, pace: float, left_s: float, searched: Sequence[float]) -> bool:
    """Whether a target's baseline pays back in the time left where its visit does not fit whole:
    of the experiments the time left holds at its pace, the baseline is one that wins nothing, and
    what the others win per minute must still match the best target already measured."""
    n = left_s / pace
    return n >= 2 and score * (1.0 - 1.0 / n) >= max(searched, default=0.0)


def visit_experiments(targets: Sequence[TargetState], t: TargetState) -> float:
    """The experiments a target can use: what its gap to its reachable ceiling would take at its
    expected gain per experiment, at least PAYBACK (its baseline and a visit to a plateau) and at
    most PAYBACK_MAX (a target that pays slowly is not given the whole run on its estimate)."""
    gain = expected_log_gain(targets, t)
    reach, _ = estimate.reachable(t, ceiling_of(t), speedup_now(t))
    gap = math.log(max(reach / speedup_now(t), 1.0))
    if gain <= 0.0:
        return PAYBACK
    return min(max(gap / gain, PAYBACK), PAYBACK_MAX)


def explores_parents(targets: Sequence[TargetState], t: TargetState, left_s: float) -> bool:
    """Whether a proposal's parent may be another elite than the best. A line of ideas from a
    slower elite is an investment: it wins only once it has caught up with the best, experiments
    later, and pays back only over the experiments after that. Once the time left holds no more
    than EXPLORE_AFTER of the target's experiments at its pace (a payback's worth to catch up and as
    many to pay back), it cannot be expected to, and the best alone is the parent."""
    return left_s > EXPLORE_AFTER * pace_s(targets, t)


def _paid(targets: Sequence[TargetState], left: Sequence[int], scores: dict[int, float], left_s: float,
          cpu: bool) -> list[int]:
    """The targets the baseline round and the minimum of turns cover. On a GPU, those the time left
    can pay back (`payback`). On the CPU, every one whose next verdict fits: the interpreter runs a
    kernel hundreds to thousands of times slower than PyTorch runs the op (a served speed below 1x
    counts as 1x), so no experiment there can pay back in any time, and what a CPU run's budget can
    return is verdicts: each target's starter judged (forward and backward) and ready for verify to
    serve (the baseline round takes the largest share first)."""
    return list(left) if cpu else payback(targets, left, scores, left_s)


def _covering(targets: Sequence[TargetState], left: Sequence[int], scores: dict[int, float],
              left_s: float, cpu: bool) -> str:
    paid = _paid(targets, left, scores, left_s, cpu)
    if len(paid) == sum(1 for t in targets if eligible(t)):
        return ""
    return f"; the time left pays back {len(paid)} of them, the most worth first"


def fair_share(targets: Sequence[TargetState], among: Sequence[int]) -> float:
    """The experiments each of `among` would have had under round robin among them alone: their
    experiments, split evenly."""
    return sum(len(targets[i].history) for i in among) / max(len(among), 1)


def round_robin(targets: Sequence[TargetState], current: int | None = None, cpu: bool = False,
                left_s: float = math.inf) -> Choice | None:
    """The plain policy every scheduler must beat: the target being searched keeps its turn until a
    plateau parks it; then the eligible target with the fewest experiments (the plan's order on a
    tie). It knows nothing of shares, ceilings, records or the time left."""
    left = [i for i, t in enumerate(targets) if eligible(t)]
    if not left:
        return None
    if current in left:
        return Choice(current, 0.0, "round robin: its turn goes on until a plateau")
    first = min(left, key=lambda i: (len(targets[i].history), i))
    return Choice(first, 0.0, "round robin: the fewest experiments so far")


def _why(targets: Sequence[TargetState], index: int, scores: dict[int, float], cpu: bool) -> str:
    t = targets[index]
    r = t.record
    others = sorted((s for i, s in scores.items() if i != index), reverse=True)
    versus = f"; next best {others[0]:.2g}" if others else "; the only target left"
    record = f"{r.keeps} kept of {r.proposals}: expected gain {scores[index]:.2g}/min{versus}"
    if cpu:  # the interpreter against PyTorch on the CPU: neither figure says anything of a GPU
        return (f"{t.share:.0%} of the model, {speedup_now(t):.3g}x vs PyTorch on the CPU so far (Triton "
                f"interpreter timings: no ceiling is promised for a GPU), {record}")
    reach, _ = estimate.reachable(t, ceiling_of(t), speedup_now(t))
    return (f"{t.share:.0%} of the model, {speedup_now(t):.3g}x, its record suggests up to {reach:.3g}x "
            f"(roofline {ceiling_of(t):.3g}x: up to {e2e_gain_left(targets, t):.3g}x end to end), {record}")


def strategy_for(agent: str, parks: int) -> str:
    """The strategy of a target's visit after `parks` plateaus: the first visit refines the best;
    each revisit takes the next of the others, in turn."""
    rotation = LLM_STRATEGIES if agent == "llm" else TUNER_STRATEGIES
    if parks <= 0:
        return rotation[0]
    return rotation[1 + (parks - 1) % (len(rotation) - 1)]


def model_for(models: Sequence[str], parks: int) -> str:
    """With several models (--llm cheap,strong): the first for a first visit, the last (the
    strongest) once the target has plateaued."""
    return models[0] if parks <= 0 or len(models) == 1 else models[-1]
