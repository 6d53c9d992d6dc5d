"""A target is judged and timed in its own dtype: on the CPU every dtype runs (bf16 dot products as
the judge emulates them: harness/correctness/interpreter_numerics.py); where a GPU cannot run bf16,
fp16 stands in and the plan, the verdict and the leaderboard say so."""
from __future__ import annotations

from pathlib import Path

import pytest

from autokernel.search.leaderboard import COLUMNS, make_row
from harness.kernel_types import registry
from harness.correctness.cases import Capabilities, build_plan
from harness.kernel_types.registry import Case
from paths import ROOT

STARTERS = ROOT / "starter_kernels" / "triton"
CPU = Capabilities("cpu", bf16=False)


def _dtypes(plan, stage: str) -> set[str]:
    return {c.dtype for c in plan.stages[stage]}


def test_only_the_types_that_multiply_tiles_declare_dot_products():
    assert {n for n in registry.names() if registry.get(n).dot_products} == {"matmul", "fused_mlp", "flash_attention",
                                                                                  "linear_cross_entropy"}


def test_a_bf16_rmsnorm_target_is_judged_and_timed_in_bf16_on_the_cpu():
    target = Case.make("rmsnorm", {"M": 128, "N": 384}, "bfloat16")
    plan = build_plan("rmsnorm", CPU, target)
    assert plan.timing.label() == "rmsnorm[128x384:bfloat16]"
    assert target.replace(seed=plan.stages["shape_sweep"][-1].seed) in plan.stages["shape_sweep"]
    assert "bfloat16" in _dtypes(plan, "shape_sweep") and "shape_sweep" not in plan.skipped
    assert plan.dtype_record() == {"judged_dtype": "bfloat16", "stand_in_for": None}
    # the interpreter is slow: one sweep shape in bf16 besides the target's own
    assert sum(c.dtype == "bfloat16" for c in plan.stages["shape_sweep"]) == 2


def test_a_bf16_matmul_target_is_judged_and_timed_in_bf16_on_the_cpu():
    target = Case.make("matmul", {"M": 64, "K": 96, "N": 128}, "bfloat16")
    plan = build_plan("matmul", CPU, target)
    assert plan.timing.label() == "matmul[64x96x128:bfloat16]"
    assert plan.stages["shape_sweep"][-1].label() == "matmul[64x96x128:bfloat16]"
    assert plan.dtype_record() == {"judged_dtype": "bfloat16", "stand_in_for": None}
    assert "shape_sweep" not in plan.skipped


def test_the_cpu_runs_bf16_at_a_shape_whose_dims_are_not_multiples_of_16():
    """A bf16 path that drops a K % 16 remainder shows only where K has one: besides the first
    sweep shape, the one with the most dims off a multiple of 16."""
    bf16 = {t: [c.dims for c in build_plan(t, CPU).stages["shape_sweep"] if c.dtype == "bfloat16"]
            for t in registry.names()}
    assert bf16["matmul"] == [{"M": 64, "K": 64, "N": 64}, {"M": 127, "K": 65, "N": 33}]
    assert bf16["fused_mlp"] == [{"M": 33, "D": 96, "F": 176}, {"M": 7, "D": 40, "F": 72}]
    assert len(bf16["softmax"]) == 1  # its first shape has them already: a case more, not two
    assert all(any(v % 16 for d in shapes for v in d.values()) for shapes in bf16.values())


def test_a_gpu_without_bf16_stands_fp16_in_and_says_so():
    target = Case.make("matmul", {"M": 64, "K": 96, "N": 128}, "bfloat16")
    plan = build_plan("matmul", Capabilities("cuda", bf16=False), target)
    assert plan.timing.label() == "matmul[64x96x128:float16]"
    assert "bfloat16" not in _dtypes(plan, "shape_sweep") | _dtypes(plan, "stability")
    assert plan.dtype_record() == {"judged_dtype": "float16", "stand_in_for": "bfloat16"}
    assert "float16 stands in for the bfloat16 target" in plan.skipped["shape_sweep"][0]


def test_a_gpu_that_runs_bf16_judges_every_type_in_bf16():
    for name in ("matmul", "fused_mlp", "flash_attention", "rmsnorm"):
        kt = registry.get(name)
        plan = build_plan(name, Capabilities("cuda", bf16=True), Case.make(name, kt.cpu_bench_shape, "bfloat16"))
        assert plan.timing.dtype == "bfloat16" and plan.stand_in_for is None
        assert "bfloat16" in _dtypes(plan, "shape_sweep")


def test_float_targets_keep_their_dtype_and_no_target_says_nothing():
    for dtype in ("float32", "float16"):
        plan = build_plan("matmul", CPU, Case.make("matmul", {"M": 8, "K": 8, "N": 8}, dtype))
        assert plan.timing.dtype == dtype and plan.dtype_record() == {"judged_dtype": dtype, "stand_in_for": None}
    assert build_plan("matmul", CPU).dtype_record() == {}


def test_the_leaderboard_says_which_dtype_was_judged():
    assert "judged_dtype" in COLUMNS
    verdict = {"verdict": "PASS", "failed_stage": None, "judged_dtype": "float16", "stand_in_for": "bfloat16"}
    row = make_row(experiment=0, target="matmul[64x96x128:bfloat16]", kernel_type="matmul", agent="tune",
                   decision="BASELINE", verdict=verdict)
    assert row["judged_dtype"] == "float16"
    assert make_row(experiment=1, target="t", kernel_type="matmul", agent="tune", decision="REVERT",
                    verdict=None)["judged_dtype"] is None


@pytest.mark.parametrize("kernel_type, dims, judged", [
    ("rmsnorm", {"M": 128, "N": 384}, "bfloat16"),
    ("matmul", {"M": 64, "K": 96, "N": 128}, "bfloat16"),
])
def test_the_judge_runs_a_bf16_target_in_the_dtype_the_plan_names(kernel_type, dims, judged):
    """The interpreter really runs bf16 rmsnorm (loads, stores, fp32 statistics) within the bf16
    tolerance, and the matmul's bf16 dots as tensor cores compute them (operands widened to fp32,
    products summed in fp32)."""
    from harness.judge import judge
    verdict = judge(STARTERS / f"{kernel_type}.py", target=Case.make(kernel_type, dims, "bfloat16"), device="cpu")
    assert verdict["verdict"] == "PASS", verdict["stages"]
    assert verdict["judged_dtype"] == judged
    assert verdict["stand_in_for"] == (None if judged == "bfloat16" else "bfloat16")
    assert verdict["timing"]["shape"] == Case.make(kernel_type, dims, judged).label()
