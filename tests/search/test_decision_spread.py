"""decide() never keeps a candidate on a median its reps' spread makes meaningless."""
from __future__ import annotations

from autokernel.search import decision
from autokernel.search.run import TargetState


def _target(**kw) -> TargetState:
    return TargetState(name="softmax[8x128:float32]", kernel_type="softmax", dims={"M": 8, "N": 128},
                       dtype="float32", **kw)


def _passed(median_us: float, **timing) -> dict:
    return {"verdict": "PASS", "timing": {"median_us": median_us, "iqr_us": 0.0, "reps": 25, **timing}}


def test_a_pass_whose_spread_is_too_wide_is_reverted_even_with_nothing_to_beat():
    wide = _passed(10.0, spread_ok=False, spread_note="IQR 300% of the median after re-timing")
    assert decision.decide(wide, _target()) == "REVERT"
    assert decision.decide(wide, _target(best_median_us=1000.0, best_iqr_us=0.0, best_reps=25)) == "REVERT"


def test_a_tight_spread_or_a_verdict_that_does_not_say_keeps_the_usual_rule():
    assert decision.decide(_passed(10.0, spread_ok=True, spread_note="ok"), _target()) == "KEEP"
    assert decision.decide(_passed(10.0), _target()) == "KEEP"  # verdicts written before the key existed
