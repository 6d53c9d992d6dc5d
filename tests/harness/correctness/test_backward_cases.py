"""The backward's own cases and values: the shapes, values and layouts a training step gives a
backward, built alike in every process, and the accumulation stage's bound, which an fp32 sum
rounded once meets and a sum kept in bf16 does not."""
from __future__ import annotations

import math

import pytest
import torch

from harness.correctness import backward, backward_cases, backward_values
from harness.correctness.cases import Capabilities, build_plan
from harness.kernel_types import registry
from harness.kernel_types.registry import Case

CPU, GPU = Capabilities("cpu", False), Capabilities("cuda", True)


def _plan(kernel_type: str, caps: Capabilities = CPU, target: Case | None = None):
    return backward.build(build_plan(kernel_type, caps, target), caps)


def _rows(case: Case) -> int:
    return math.prod(list(case.dims.values())[:-1])


@pytest.mark.parametrize("kernel_type", sorted(backward_cases.ROWS_DIM))
def test_every_type_is_judged_past_the_sm_counts_at_the_timing_shape_and_five_times_over(kernel_type):
    bp = _plan(kernel_type)
    rows = backward_cases.ROWS_DIM[kernel_type]
    assert any(c.dims.get(rows, 0) > max(backward_cases.SM_COUNTS) for c in bp.stages["shape_sweep"])
    timing = bp.timing
    assert any(backward_cases.same_problem(timing, c) for c in bp.stages["shape_sweep"])
    assert len(bp.stages["determinism"]) == 1 and backward.DETERMINISM_CALLS >= 5
    gpu = _plan(kernel_type, GPU)
    assert {c.dims.get(rows) for c in gpu.stages["shape_sweep"]} >= set(backward_cases.GPU_PAST_SMS)


def test_the_row_types_get_four_leading_dims_and_the_norms_zero_weights():
    for kernel_type in backward_cases.FOUR_D_TYPES:
        assert any(len(c.dims) == 4 for c in _plan(kernel_type).stages["shape_sweep"]), kernel_type
    for kernel_type in backward_cases.NORMS:
        assert any(c.variant == "bwd:weight_zeros" for c in _plan(kernel_type).stages["values"])


def test_the_values_a_training_step_gives_are_all_judged():
    variants = {(c.variant, c.dtype) for c in _plan("cross_entropy").stages["values"]}
    assert {("bwd:grad_ones", "float32"), ("bwd:grad_scale:1e-08", "bfloat16"), ("bwd:grad_scale:10000.0", "float32"),
            ("bwd:ignore_index", "float32"), ("bwd:ignore_index", "float16")} <= variants
    # where bf16 cannot run (the interpreter's dot products), no fp16 stands in for 1e-8: it would underflow
    assert ("bwd:grad_scale:1e-08", "float16") not in {(c.variant, c.dtype) for c in _plan("matmul").stages["values"]}


def test_accumulation_is_judged_in_every_dtype_the_target_serves_under_a_correlated_gradient():
    bench = _plan("rmsnorm").stages["accumulation"]
    assert {c.dtype for c in bench} == {"float16", "bfloat16"}
    assert all(c.variant == "bwd:grad_correlated" for c in bench)
    assert max(_rows(c) for c in bench) == backward_cases.ACCUMULATION_ROWS["cpu"]
    target = Case.make("rmsnorm", {"M": 64, "N": 32}, "bfloat16")
    assert {c.dtype for c in _plan("rmsnorm", CPU, target).stages["accumulation"]} == {"bfloat16"}
    assert max(_rows(c) for c in _plan("rmsnorm", GPU).stages["accumulation"]) == backward_cases.ACCUMULATION_ROWS["cuda"]


def test_a_laid_out_grad_out_is_strided_as_named_and_reads_nan_past_its_view():
    case = Case.make("rmsnorm", {"M": 4, "N": 8}, "float32", seed=3)
    args, kwargs = backward_values.inputs(case)
    plain = backward_values.upstream(case, args, kwargs)
    column = backward_values.upstream(case.replace(variant="bwd:grad_transposed"), args, kwargs)
    assert column.stride() == (1, 4) and torch.equal(column, plain)
    broadcast = backward_values.upstream(case.replace(variant="bwd:grad_broadcast"), args, kwargs)
    assert broadcast.stride() == (0, 1) and torch.equal(broadcast[3], plain[0])
    # a backward that walks it as a dense tensor reads NaN, inside the buffer
    dense_walk = torch.as_strided(broadcast, (4, 8), (8, 1))
    assert torch.isnan(dense_walk[1:]).all()
    assert torch.equal(backward_values.upstream(case.replace(variant="bwd:grad_broadcast"), args, kwargs), broadcast)


def test_the_values_variants_hold_what_they_name():
    ones = Case.make("cross_entropy", {"N": 4, "V": 16}, "float32", variant="bwd:grad_ones")
    args, kwargs = backward_values.inputs(ones)
    assert backward_values.upstream(ones, args, kwargs).item() == 1.0  # a mean loss's own gradient
    ignored = ones.replace(variant="bwd:ignore_index")
    targets = backward_values.inputs(ignored)[0][1]
    assert (targets == -100).any() and (targets != -100).any()
    zeros = Case.make("rmsnorm", {"M": 4, "N": 16}, "float16", variant="bwd:weight_zeros")
    weight = backward_values.inputs(zeros)[0][1]
    assert (weight == 0).sum() == 4 and (weight != 0).all() == False  # noqa: E712
    tiny = Case.make("rmsnorm", {"M": 4, "N": 16}, "bfloat16", variant="bwd:grad_scale:1e-08")
    args, kwargs = backward_values.inputs(tiny)
    g = backward_values.upstream(tiny, args, kwargs)
    assert g.dtype == torch.bfloat16 and 0 < float(g.float().abs().max()) < 1e-7
    assert float(g.to(torch.float16).float().abs().max()) < float(g.float().abs().max())  # fp16 loses it


def _dweight(case: Case, summed_in) -> str | None:
    """The accumulation stage's verdict on an rmsnorm backward whose dweight is summed row by row
    in `summed_in` (dx exact), as an interpreter's kernel would store it (bf16: truncated)."""
    args, kwargs = backward.inputs(case)
    g = backward_values.upstream(case, args, kwargs)
    refs = backward.gradients.reference_grads(case, (args, kwargs), g)
    x = args[0].float()
    xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    acc = torch.zeros(x.shape[-1], dtype=summed_in)
    for term in g.float() * xhat:
        acc = (acc.float() + term).to(summed_in)
    dweight = acc.float()
    if case.dtype == "bfloat16":  # the interpreter's cast truncates: the honest kernel's worst store
        dweight = (dweight.view(torch.int32) & ~0xFFFF).view(torch.float32)
    return backward.values_problem(case, [refs[0].to(args[0].dtype), dweight.to(args[1].dtype)], (args, kwargs), g)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_accumulation_bound_holds_an_fp32_sum_and_refuses_one_kept_in_the_dtype(dtype):
    case = backward_cases.narrow("rmsnorm", backward_cases.ACCUMULATION_ROWS["cpu"], dtype, "bwd:grad_correlated")
    assert _dweight(case, torch.float32) is None
    why = _dweight(case, registry.dtype_of(dtype))
    assert why is not None and "gradient of weight" in why
    # under a plain random gradient the same bf16 sum passes: the correlated one is what finds it
    assert dtype != "bfloat16" or _dweight(case.replace(variant="plain"), torch.bfloat16) is None
