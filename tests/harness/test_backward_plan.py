"""The backward's plan: which cases each backward stage checks. The accumulation stage is where a
gradient is a sum over the most terms: it holds the forward sweep's largest problem and, for a type
whose weight gradients are sums over rows, more rows than any other backward case; a plan that put
the smallest there would check the sums where they are shortest."""
from __future__ import annotations

import math

import pytest

from harness.correctness import backward
from harness.correctness.cases import Capabilities, build_plan
from harness.kernel_types import registry
from harness.kernel_types.registry import Case


def rows(case: Case) -> int:
    """The terms a weight gradient sums: a matmul's or an MLP's M, else the rows of the first input."""
    if "M" in case.dims and case.kernel_type in ("matmul", "fused_mlp"):
        return case.dims["M"]
    if case.kernel_type == "linear_cross_entropy":  # dweight sums over the N rows of x
        return case.dims["N"]
    return math.prod(list(case.dims.values())[:-1] or [1])


def elements(case: Case) -> int:
    return math.prod(case.dims.values())


@pytest.mark.parametrize("kernel_type", registry.names())
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_accumulation_stage_sums_over_the_most_rows_the_sweep_has(kernel_type, device):
    kt = registry.get(kernel_type)
    for target in (None, Case.make(kernel_type, kt.cpu_bench_shape if device == "cpu" else kt.bench_shape,
                                   "float32", seed=7)):
        caps = Capabilities(device, device == "cuda")
        plan = build_plan(kernel_type, caps, target)
        bp = backward.build(plan, caps)
        accumulation = bp.stages["accumulation"]
        assert accumulation, "no accumulation case"
        labels = [c.label() for c in accumulation]
        assert max(map(elements, accumulation)) >= max(map(elements, plan.stages["shape_sweep"])), labels
        if kt.summed_grads:  # a weight gradient sums over rows: the most rows of any backward case
            others = [c for stage, cases in bp.stages.items() if stage != "accumulation" for c in cases]
            assert max(map(rows, accumulation)) >= max(map(rows, others)), labels
