"""Kernels right on random plain tensors and wrong on what a model passes (tests/attacks/
input_kernels.py), judged in one batch beside honest kernels of the same types: each attack ends in
FAIL for its named reason (a stray store outside an input view's elements, a store past the output,
a weight written back when it is an nn.Parameter, a sum wrong where a row's maximum repeats), the
honest kernels in a PASS, in fp32 and in bf16."""
from __future__ import annotations

import sys

import pytest

import input_kernels
import judge_kernels
from judge_batch import judge_batch
from harness.kernel_types.registry import Case
from paths import ROOT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox and the hook are Linux's")

# name -> (the stage that fails it, phrases its reason must hold)
EXPECTED = {
    # q = qkv[:, :d]: the store past q's row lands in k, outside the view's own elements
    "stores_past_row": ("integrity", ("softmax[6x100:float32,model_views]", "wrote outside the elements of its input x",
                                      "24 byte(s), the first at byte offset 400 from its first element",
                                      "outside its elements (the wider buffer it is a view of)")),
    # past the output kernel_fn allocated: on a GPU another tensor's memory
    "stores_past_output": ("integrity", ("softmax[8x128:float32]", "wrote past the end of the output",
                                         "byte offset 4096 of a storage of 4096 bytes")),
    # the judge passes weights as nn.Parameters with requires_grad=True, as every served model does
    # (judged with the static check off: with it on, reading requires_grad is refused before import)
    "writes_weight_back": ("integrity", ("rmsnorm[8x256:float32]", "modified its input weight",
                                         "nn.Parameter with requires_grad=True")),
    # a view of a wider buffer it allocated: the stash past each row is gone where a served output is copied
    "borrowed_output": ("integrity", ("softmax[", "the output does not own its storage",
                                      "spanning", "of its storage's")),
    # bf16 holds 1e20, fp16 does not: a row staged through fp16 turns into NaN
    "fp16_staged_bf16": ("stability", ("softmax[6x300:bfloat16,scale:1e20]", "NaN where the reference has none")),
    # a QK-norm's q, per head of a fused projection: no one row stride
    "one_row_stride": ("edge_cases", ("rmsnorm[2x3x4x40:float32,model_views]", "out of tolerance")),
    # the targets a column of a wider integer buffer: read densely, every other label is another's
    "dense_targets": ("edge_cases", ("cross_entropy[6x100:float32,model_views]",)),
    # random rows never tie at their maximum; constant, zero and tied rows do
    "counts_max_once": ("stability", ("softmax[11x100:float32,structured]", "row 0: a constant row (its maximum repeats",
                                      "row 2: ties at the maximum", "right on: ", "a one-hot row")),
}
STATIC_CHECK_OFF = ("writes_weight_back",)  # reaches the layer behind the check
HONEST = {"honest_softmax": ROOT / "starter_kernels/triton/softmax.py",
          "honest_softmax_rows": judge_kernels.GOOD / "softmax_rows.py",
          "honest_rmsnorm": ROOT / "starter_kernels/triton/rmsnorm.py",
          "honest_rmsnorm_twopass": judge_kernels.GOOD / "rmsnorm_twopass.py"}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("inputs_and_values")
    paths = dict(HONEST)
    for name, text in input_kernels.sources().items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    behind = {name: paths.pop(name) for name in STATIC_CHECK_OFF}
    return {**judge_batch(paths, None), **judge_batch(behind, None, static_check=False)}


def test_a_branch_on_requires_grad_is_refused_before_import():
    from harness.isolation.static_check import check_source
    found = check_source(input_kernels.sources()["writes_weight_back"])
    assert [v.rule for v in found] == ["judge tell"] and "requires_grad" in found[0].detail, [v.text() for v in found]


@pytest.fixture(scope="module")
def judged_bf16():
    """The honest starters at a bf16 target: judged in their own dtype (no dot products to stand in for)."""
    out = {}
    for name, kernel_type in (("honest_softmax", "softmax"), ("honest_rmsnorm", "rmsnorm")):
        target = Case.make(kernel_type, {"M": 8, "N": 256}, "bfloat16", seed=5)
        out.update(judge_batch({name: HONEST[name]}, target))
    return out


def _reason(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_attack_fails_for_its_named_reason(judged, name):
    v = judged[name]
    stage, phrases = EXPECTED[name]
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", stage), _reason(v)[:2000]
    for phrase in phrases:
        assert phrase in _reason(v), _reason(v)[:2000]


@pytest.mark.parametrize("name", sorted(HONEST))
def test_the_honest_kernels_pass_beside_them(judged, name):
    v = judged[name]
    assert v["verdict"] == "PASS", _reason(v)[:2000]
    stability = next(s for s in v["stages"] if s["name"] == "stability")
    assert stability["status"] == "pass"


@pytest.mark.parametrize("name", ["honest_softmax", "honest_rmsnorm"])
def test_the_honest_starters_pass_at_a_bf16_target(judged_bf16, name):
    v = judged_bf16[name]
    assert v["verdict"] == "PASS", _reason(v)[:2000]
    assert v.get("judged_dtype") == "bfloat16" and v.get("stand_in_for") is None
