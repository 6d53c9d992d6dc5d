"""The backward's plan: which cases each backward stage checks. The accumulation stage is where a
weight gradient is a sum over the most rows, so it holds the judge's largest row count; a plan
that put its smallest there would check the sums where they are shortest."""
from __future__ import annotations

import math

import pytest

from harness.correctness import backward
from harness.correctness.cases import Capabilities, build_plan
from harness.kernel_types import registry
from harness.kernel_types.registry import Case


def rows(case: Case) -> int:
    """Rows of the case's first input: the terms a gradient summed over rows adds up."""
    return math.prod(list(case.dims.values())[:-1] or [1])


@pytest.mark.parametrize("kernel_type", registry.names())
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_accumulation_stage_sums_over_the_most_rows_the_sweep_has(kernel_type, device):
    kt = registry.get(kernel_type)
    for target in (None, Case.make(kernel_type, kt.cpu_bench_shape if device == "cpu" else kt.bench_shape,
                                   "float32", seed=7)):
        bp = backward.build(build_plan(kernel_type, Capabilities(device, device == "cuda"), target))
        accumulation = bp.stages["accumulation"]
        assert accumulation, "no accumulation case"
        sweep = bp.stages["shape_sweep"]
        assert max(map(rows, accumulation)) >= max(map(rows, sweep)), [c.label() for c in accumulation]
