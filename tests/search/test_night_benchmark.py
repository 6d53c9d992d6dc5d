"""benchmarks/night.py measures what each policy's budget bought: the winners as they stood when
the budget ended, not a verdict that came back after it."""
from __future__ import annotations

import math

from paths import ROOT


def test_a_keep_that_came_back_after_the_budget_is_not_counted(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import night
    seen = {}
    measure = night.true_e2e

    def spy(run, targets, came_back, deadline_s):
        seen.update(run=run, targets=targets, came_back=came_back, deadline_s=deadline_s)
        return measure(run, targets, came_back, deadline_s)
    monkeypatch.setattr(night, "true_e2e", spy)
    # round robin does not look at the time left: in this world its last experiment starts a minute
    # before the end of a half-hour budget, comes back after it, and keeps a faster kernel
    outcome = night.night("wrong", 36, 1800.0, "round robin", tmp_path)
    assert outcome.used > 1.0 and seen["deadline_s"] == 1800.0
    late = [key for key, at in seen["came_back"].items() if at > 1800.0]
    assert late
    everything = measure(seen["run"], seen["targets"], seen["came_back"], math.inf)
    assert outcome.e2e < everything  # what stood at the deadline, without the late keep
    # the scheduler starts nothing it cannot finish: all it measured counts
    scheduled = night.night("wrong", 36, 1800.0, "new", tmp_path / "new")
    assert scheduled.used <= 1.0
    assert all(at <= 1800.0 for at in seen["came_back"].values())
