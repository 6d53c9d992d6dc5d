"""The scheduler's learned estimates (autokernel.search.estimate): the ceiling fit, the record kept
beside the history, the chance a target still pays and the exploration term."""
import math
import random

import pytest

from autokernel.search import estimate
from autokernel.search.run import TargetState


def target(history, eager=100.0):
    t = TargetState(name="softmax[8x128:float32]", kernel_type="softmax", dims={"M": 8, "N": 128},
                    dtype="float32", share=0.5, ceiling_speedup=4.0, eager_median_us=eager)
    t.history = list(history)
    return t


def saturating(ceiling_log, step, start_log, keeps):
    """Log speedups that each win `step` of what is left below `ceiling_log`."""
    logs = [start_log]
    for _ in range(keeps):
        logs.append(logs[-1] + step * (ceiling_log - logs[-1]))
    return tuple(logs)


def test_the_ceiling_fit_finds_the_asymptote_and_the_step_of_saturating_keeps():
    asymptote, step = estimate.walford(saturating(math.log(3.0), 0.4, 0.0, 5))
    assert asymptote == pytest.approx(math.log(3.0)) and step == pytest.approx(0.4)
    assert estimate.walford(saturating(1.0, 0.4, 0.0, 1)) is None  # two points: no fit
    assert estimate.walford((0.0, 0.1, 0.2, 0.3)) is None  # gains that do not shrink do not saturate


def history_of(logs, eager=100.0):
    """The baseline at exp(logs[0]), then a keep at each later point, two reverts between keeps."""
    rows = [{"decision": "BASELINE", "verdict": "PASS", "median_us": eager / math.exp(logs[0])}]
    for before, after in zip(logs, logs[1:]):
        rows += [{"decision": "REVERT", "verdict": "PASS"}, {"decision": "REVERT", "verdict": "FAIL"}]
        rows.append({"decision": "KEEP", "verdict": "PASS", "median_us": eager / math.exp(after),
                     "speedup_vs_best": math.exp(after - before)})
    return rows


def test_the_reachable_ceiling_follows_the_fit_with_the_roofline_only_as_its_bound():
    ceilings = []
    for keeps in (4, 12):  # a target whose keeps close in on 1.5x, where the roofline says 4x
        logs = saturating(math.log(1.5), 0.5, 0.0, keeps)
        ceiling, step = estimate.reachable(target(history_of(logs)), 4.0, math.exp(logs[-1]))
        ceilings.append(ceiling)
        assert step > estimate.KEEP_STEP  # each keep won half of what was left, not the prior's 0.3
    assert 4.0 > ceilings[0] > ceilings[1] and 1.5 <= ceilings[1] < 2.0  # the more keeps, the more the fit counts
    # a fit above the roofline is held down to it; a target with no fit has the roofline as its prior
    high = target(history_of(saturating(math.log(8.0), 0.3, 0.0, 8)))
    assert estimate.reachable(high, 2.0, 1.9)[0] == pytest.approx(2.0)
    assert estimate.reachable(target(history_of((0.0,))), 4.0, 1.0) == (pytest.approx(4.0), estimate.KEEP_STEP)


def random_history(rng, n):
    rows = [{"decision": "BASELINE", "verdict": "PASS", "median_us": 100.0}]
    best = 100.0
    for _ in range(n):
        r = rng.random()
        if r < 0.3:
            rows.append({"decision": "REVERT", "verdict": "FAIL"})
        elif r < 0.8:
            rows.append({"decision": "REVERT", "verdict": "PASS", "median_us": best * 1.1})
        else:
            new = best / rng.uniform(1.02, 1.5)
            rows.append({"decision": "KEEP", "verdict": "PASS", "median_us": new, "speedup_vs_best": best / new})
            best = new
    return rows


def test_the_record_read_in_pieces_equals_the_record_read_at_once():
    rng = random.Random(5)
    rows = random_history(rng, 200)
    grown = target([])
    for row in rows:  # asked after every experiment, as the scheduler does
        grown.history.append(row)
        estimate.learned(grown)
    whole = estimate.learned(target(rows))
    assert estimate.learned(grown) == whole
    assert whole.proposals == 200 and whole.keeps == sum(r["decision"] == "KEEP" for r in rows)
    assert len(whole.keep_logs) == whole.keeps + 1
    # a history replaced by another list (a resume) is read afresh, not added to the old record
    grown.history = rows[:50]
    assert estimate.learned(grown) == estimate.learned(target(rows[:50]))


def test_dry_passes_lower_the_chance_that_a_target_still_pays():
    chances = [estimate.Learned(proposals=10 + m, passes=6 + m, keeps=2, dry_passes=m).still_pays
               for m in (0, 5, 10, 20)]
    assert chances[0] == pytest.approx(estimate.STILL_PAYS)
    assert chances == sorted(chances, reverse=True) and chances[-1] < 0.01


def test_the_exploration_term_shrinks_as_a_target_is_tried():
    terms = [estimate.exploration(estimate.Learned(proposals=2 * n, passes=n), 500) for n in (0, 4, 16, 64)]
    assert terms == sorted(terms, reverse=True) and terms[-1] < terms[0] / 5
    # and it grows, slowly, as the run goes on without trying the target
    assert estimate.exploration(estimate.Learned(), 5000) > estimate.exploration(estimate.Learned(), 50)
