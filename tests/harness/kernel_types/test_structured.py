"""Each kernel type's structured case (chosen rows: ties, constant and zero rows, a row beside its
image under the type's invariance) and its model-views case (the type's inputs as views into the
wider buffers a model passes): what they hold, that the properties' pairs share one exact
reference, and that a wrong row is named by what it is."""
from __future__ import annotations

import pytest
import torch

from harness.correctness.cases import Capabilities, build_plan
from harness.correctness.compare import compare
from harness.kernel_types import model_views, registry, structured
from harness.kernel_types.registry import Case

CPU = Capabilities("cpu", bf16=False)


def _cases(kernel_type: str, variant: str) -> list[Case]:
    plan = build_plan(kernel_type, CPU)
    return [c for s in ("stability", "edge_cases") for c in plan.stages[s] if c.variant == variant]


@pytest.mark.parametrize("kernel_type", registry.names())
def test_every_type_has_a_structured_case_first_in_stability_in_fp32_and_fp16(kernel_type):
    plan = build_plan(kernel_type, CPU)
    assert [c.dtype for c in plan.stages["stability"][:2]] == ["float32", "float16"]
    assert all(c.variant == structured.VARIANT for c in plan.stages["stability"][:2])
    for case in _cases(kernel_type, structured.VARIANT):
        args, _ = registry.build_inputs(case)
        ref = registry.reference_output(case)
        assert torch.isfinite(ref).all(), case.label()
        assert all(a.is_contiguous() for a in args if isinstance(a, torch.Tensor))  # values, not layout


@pytest.mark.parametrize("kernel_type", ["softmax", "cross_entropy", "layernorm"])
def test_a_row_and_the_row_plus_a_constant_have_the_same_reference(kernel_type):
    kinds = structured.ROWS[kernel_type]
    case = _cases(kernel_type, structured.VARIANT)[1]  # fp16: the shift is exact there too
    x = registry.build_inputs(case)[0][0].double()
    random, shifted = kinds.index("random"), kinds.index("shifted")
    assert torch.equal(x[shifted] - x[random], torch.full_like(x[random], structured.SHIFT))
    if kernel_type != "cross_entropy":  # one loss for all rows: no row of its own
        ref = registry.reference_output(case)
        assert torch.allclose(ref[shifted], ref[random], rtol=0, atol=1e-12)
        assert torch.equal(ref[kinds.index("moved")], ref[random])


def test_a_row_times_four_has_the_norms_reference_up_to_eps():
    kinds = structured.ROWS["rmsnorm"]
    case = _cases("rmsnorm", structured.VARIANT)[0]
    x = registry.build_inputs(case)[0][0]
    assert torch.equal(x[kinds.index("scaled")], x[kinds.index("random")] * structured.SCALE)
    ref = registry.reference_output(case)
    assert torch.allclose(ref[kinds.index("scaled")], ref[kinds.index("random")], rtol=1e-6)


def test_the_rows_hold_what_their_names_say():
    kinds = structured.ROWS["softmax"]
    x = registry.build_inputs(_cases("softmax", structured.VARIANT)[0])[0][0]
    row = dict(zip(kinds, x))
    assert (row["constant"] == row["constant"][0]).all() and (row["zeros"] == 0).all()
    assert int((row["ties"] == row["ties"].max()).sum()) == 3
    assert torch.isinf(row["masked"]).any() and torch.isfinite(row["masked"]).any()
    assert int((row["one_hot"] != 0).sum()) == 1 and (row["integers"] == row["integers"].round()).all()
    assert row["offset"].min() > structured.OFFSET - 5


def test_a_wrong_row_is_named_by_what_it_is():
    case = _cases("softmax", structured.VARIANT)[0]
    args, _ = registry.build_inputs(case)
    ref = registry.reference_output(case)
    out = ref.clone().float()
    out[2] = 1.0 / out.shape[1]  # the tied row wrong, every other row right
    detail = compare(out, ref, case, args).detail
    assert "wrong on 1 of the case's 11 rows" in detail and "row 2: ties at the maximum" in detail
    assert "right on: a constant row" in detail
    plain = case.replace(variant="plain")
    assert "rows" not in compare(registry.reference_output(plain).float() + 1, registry.reference_output(plain),
                                 plain).detail.split(";")[-1]


@pytest.mark.parametrize("kernel_type", registry.names())
def test_the_model_views_case_passes_the_types_values_as_views_into_wider_buffers(kernel_type):
    cases = _cases(kernel_type, model_views.VARIANT)
    assert {c.dtype for c in cases} == {"float32", "float16"} and len(cases) % 2 == 0
    for case32 in [c for c in cases if c.dtype == "float32"]:
        _check_model_views(kernel_type, case32)


def test_a_row_types_4d_model_view_is_per_head_with_no_one_row_stride():
    """A QK-norm's q: [B, S, H, N] per head of a [B, S, 3, H, N] projection; rows of one position
    N apart, positions 3 * H * N apart, so no row stride reaches every row."""
    case = next(c for c in _cases("rmsnorm", model_views.VARIANT) if len(c.dims) == 4)
    x = registry.build_inputs(case)[0][0]
    b, s, h, n = x.shape
    assert x.stride() == (s * 3 * h * n, 3 * h * n, n, 1)
    with pytest.raises(RuntimeError):
        x.view(-1, n)  # not one stride: a reshape copies


def _check_model_views(kernel_type, case32):
    args, _ = registry.build_inputs(case32)
    plain, _ = registry.build_inputs(case32.replace(variant="plain"))
    assert all(torch.equal(a, p) for a, p in zip(args, plain))  # the same values, laid out otherwise
    floats = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    # the first input lives in a buffer wider than its own elements, as a slice of a model's does
    first = floats[0]
    assert first.untyped_storage().nbytes() > first.numel() * first.element_size()
    assert not first.is_contiguous() or first.storage_offset() > 0
    if kernel_type == "matmul":
        assert floats[1].stride() == (1, floats[1].shape[0])  # an nn.Linear weight, transposed
