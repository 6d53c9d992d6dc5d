"""What the candidate's process writes in native code is never the judge's word: baseline lines on
its witness socket (tests/attacks/baseline_kernels.py) and case records in its events file. Judged with
the static check off, as `autokernel optimize` judges (a judge session, forked workers), beside two
honest kernels: each forgery ends in FAIL naming it, the honest kernels PASS with their baseline
timed in the clean worker."""
from __future__ import annotations

import sys

import pytest

import baseline_kernels
import judge_kernels
from judge_batch import judge_batch
from harness.kernel_types.registry import Case
from harness.workers.baselines import PROCESS

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox and the hook are Linux's")
TARGET = Case.make("softmax", {"M": 8, "N": 256}, "float32", seed=11)
HONEST = ("honest_correct", "honest_softmax_rows")

# name -> (the stage that fails it, a phrase its reason must hold)
EXPECTED = {
    "forged_eager_300ms": ("integrity", "sent a baseline line (phase 'eager') on its witness socket"),
    "forged_eager_5s_wide": ("integrity", "sent a baseline line (phase 'eager') on its witness socket"),
    "forged_records_unreported": ("integrity", "differs from the line the worker reported writing"),
    "forged_records_reported": ("integrity", "the worker's records are not the judge's: "
                                             "record 2 of timing duplicates an earlier record"),
}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("forged")
    paths = {"honest_softmax_rows": judge_kernels.GOOD / "softmax_rows.py"}
    paths["honest_correct"] = folder / "honest_correct.py"
    paths["honest_correct"].write_text(judge_kernels.source())
    for name, text in baseline_kernels.sources().items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    return judge_batch(paths, TARGET, static_check=False)


def _reason(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_forgery_fails_naming_it(judged, name):
    v = judged[name]
    stage, phrase = EXPECTED[name]
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", stage), _reason(v)[:2000]
    assert phrase in _reason(v), _reason(v)[:2000]


def test_the_honest_kernels_pass_with_the_clean_workers_baseline(judged):
    for name in HONEST:
        v = judged[name]
        assert v["verdict"] == "PASS", _reason(v)[:2000]
        assert v["timing"]["baseline_source"]["process"] == PROCESS
        assert v["timing"]["baseline_median_us"] > 0
