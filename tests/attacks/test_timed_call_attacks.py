"""Kernels that behave differently when timed (tests/attacks/timed_call_kernels.py), judged as
`autokernel optimize` judges them (a judge session, forked workers, two at a time), beside the
honest kernels judged with the other core kept busy (all behind the static check, which refuses the
attacks before import for the state they keep). Each attack ends in FAIL with a named reason,
or for a timing whose spread leaves its median meaningless, in a verdict the search never keeps;
the honest kernels PASS with a spread the judge trusts, unless the judge measured the machine
oversubscribed while it timed them."""
from __future__ import annotations

import sys

import pytest

import judge_kernels
from judge_batch import judge_batch
import timed_call_kernels
from autokernel.search import decision
from autokernel.search.run import TargetState
from harness.timing import spread
from harness.kernel_types.registry import Case

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox and the hook are Linux's")
TARGET = Case.make("softmax", {"M": timed_call_kernels.TARGET_ROWS, "N": timed_call_kernels.TARGET_COLS},
                   "float32", seed=11)
HONEST = ("honest_correct", "honest_softmax_rows")

# name -> (the stage that fails it, a phrase its reason must hold)
EXPECTED = {
    "eager_when_timed": ("integrity", "PyTorch compute inside kernel_fn: aten::"),
    # caught where the output was made, right after its rep, whether or not it is saved
    "right_only_when_checked": ("integrity", "compared on the device"),
    "remembers_inputs": ("integrity", "compared on the device"),
}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("timed_calls")
    paths = {}
    for name, text in timed_call_kernels.sources().items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    paths["honest_correct"] = folder / "honest_correct.py"
    paths["honest_correct"].write_text(judge_kernels.source())
    paths["honest_softmax_rows"] = judge_kernels.GOOD / "softmax_rows.py"

    # the attacks keep state between calls, which the static check refuses before import: judged
    # behind the filter, so that the stages, not the filter, must stop them
    return judge_batch(paths, TARGET, busy_for=HONEST, static_check=False)


@pytest.mark.parametrize("name", sorted(timed_call_kernels.sources()))
def test_each_timed_call_attack_is_refused_before_import_for_the_state_it_keeps(name):
    from harness.isolation.static_check import check_source
    found = check_source(timed_call_kernels.sources()[name], "triton", filename=f"{name}.py")
    assert any("_calls" in str(v) or "_cache" in str(v) for v in found), [str(v) for v in found]


def _reason(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_timed_call_attack_fails_with_its_named_reason(judged, name):
    v = judged[name]
    stage, phrase = EXPECTED[name]
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", stage), _reason(v)[:2000]
    assert phrase in _reason(v), _reason(v)[:2000]


def test_a_wildly_spread_timing_is_said_so_and_never_kept(judged):
    v = judged["wild_spread"]
    assert v["verdict"] == "PASS", _reason(v)[:2000]  # it is right: only its time is untrustworthy
    timing = v["timing"]
    assert timing["spread_ok"] is False, timing["spread_note"]
    assert "measured twice" in timing["spread_note"] and len(timing["rounds"]) == 2
    target = TargetState(name=TARGET.label(), kernel_type="softmax", dims=TARGET.dims, dtype="float32")
    assert decision.decide(v, target) == "REVERT"


# docs/judge.md's rule, written out here rather than read from the judge: a round whose IQR exceeds
# 75% of its median on the CPU is measured again, and the median is trusted unless the last round is
# as wide or the two medians lie more than 2x apart; the machine's load changes nothing in it.
CPU_SPREAD_LIMIT = 0.75


def trusted_by_the_rule(rounds: list[dict]) -> bool:
    last = rounds[-1]
    medians = [r["median_us"] for r in rounds]
    return last["iqr_us"] <= CPU_SPREAD_LIMIT * last["median_us"] and max(medians) <= 2 * min(medians)


def test_the_honest_kernels_pass_with_a_trusted_spread_on_a_loaded_machine(judged):
    for name in HONEST:
        v = judged[name]
        assert v["verdict"] == "PASS", _reason(v)[:2000]
        timing = v["timing"]
        assert timing["witness"]["agrees"], timing["witness"]
        # whatever the load: the median is trusted exactly when its own rounds meet the rule (a judge
        # that tightened the limit on a busy machine would distrust an honest 20% spread here)
        assert timing["spread_ok"] == trusted_by_the_rule(timing["rounds"]), (timing["spread_note"], timing["rounds"])
        if not timing["spread_ok"]:
            # the limit was chosen with one judge beside one busy process; here two judges share the
            # cores with it, and a test run adds its own work. Where the judge measured the machine
            # oversubscribed an honest median may mean nothing, and the verdict must say why
            last = timing["rounds"][-1]
            assert last.get("cpu_wait_pct", 0) >= 100 * spread.BUSY_SHARE, (timing["spread_note"], last)
            assert "oversubscribed" in timing["spread_note"], timing["spread_note"]
