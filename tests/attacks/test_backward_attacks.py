"""Wrong backwards (tests/attacks/backward_attack_kernels.py), judged as `autokernel bench` judges a
training kernel (a judge session, forked workers, two at a time, the static check off so that the
stages behind it must stop them), beside the two honest backwards they were made from, judged
first with the other core kept busy. Each wrong backward ends with its backward FAIL at its stage
for its named reason, its forward passing and serving inference; the honest ones pass both. (Every
starter's honest backward is judged with its forward: tests/harness/test_starters_triton.py.)"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import backward_attack_kernels
from judge_batch import judge_batch
from paths import DATA, ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox and the hook are Linux's")
HONEST = {"honest_rmsnorm": DATA / "kernels" / "backward" / "rmsnorm.py",
          "honest_cross_entropy": ROOT / "starter_kernels" / "triton" / "cross_entropy.py"}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("backward_attacks")
    paths: dict[str, Path] = dict(HONEST)
    for name, text in backward_attack_kernels.sources().items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    return judge_batch(paths, None, busy_for=tuple(HONEST), static_check=False, backward=True)


def _why(back: dict) -> str:
    return next((s["detail"] for s in back["stages"] if s["name"] == back["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(backward_attack_kernels.EXPECTED))
def test_each_wrong_backward_fails_for_its_named_reason_and_its_forward_serves_inference(judged, name):
    stage, phrase = backward_attack_kernels.EXPECTED[name]
    v = judged[name]
    assert v["verdict"] == "PASS", v["failed_stage"]  # the forward is the honest one
    back = v["backward"]
    assert (back["verdict"], back["failed_stage"]) == ("FAIL", stage), _why(back)[:2000]
    assert phrase in _why(back), _why(back)[:2000]
    assert v["serves"] == f"inference only: the backward failed {stage}"


@pytest.mark.parametrize("name", sorted(HONEST))
def test_the_honest_backwards_beside_them_pass_in_every_dtype_that_runs(judged, name):
    v = judged[name]
    back = v["backward"]
    assert (v["verdict"], back["verdict"]) == ("PASS", "PASS"), _why(back)[:2000]
    assert v["serves"] == "training and inference"
    judged_dtypes = {d for s in back["stages"] for d in ("float32", "float16", "bfloat16") if d in s["detail"]}
    assert {"float16", "bfloat16"} <= judged_dtypes  # the accumulation stage names its cases
