"""Which cases each stage runs.

A stage plan is a list of `Check`s: one or more kernel calls whose outputs the judge compares
(with the reference, or with each other). Seeds differ per case so no two cases share inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness import registry
from harness.registry import Case

STAGES = ("compile", "smoke", "shape_sweep", "stability", "determinism", "edge_cases", "integrity")
CORRECTNESS_STAGES = ("smoke", "shape_sweep", "stability", "edge_cases")
# Largest target (in input elements) still checked for correctness under the Triton interpreter.
CPU_TARGET_CHECK_ELEMENTS = 4_000_000


@dataclass
class Capabilities:
    device: str  # "cpu" or "cuda"
    bf16: bool  # can the device run bf16 kernels (the Triton interpreter cannot)

    @property
    def dtypes(self) -> tuple[str, ...]:
        return ("float32", "float16", "bfloat16") if self.bf16 else ("float32", "float16")


@dataclass
class Plan:
    stages: dict[str, list[Case]] = field(default_factory=dict)
    skipped: dict[str, list[str]] = field(default_factory=dict)
    timing: Case | None = None


def _seed(stage: str, i: int) -> int:
    return 1000 * (STAGES.index(stage) + 1) + i


def timing_case(kernel_type: str, caps: Capabilities, target: Case | None) -> Case:
    kt = registry.get(kernel_type)
    if target is not None:
        dtype = target.dtype if target.dtype in caps.dtypes else "float32"
        return target.replace(dtype=dtype, seed=_seed("integrity", 900))
    if caps.device == "cpu":
        return Case.make(kernel_type, kt.cpu_bench_shape, "float32", seed=_seed("integrity", 900))
    return Case.make(kernel_type, kt.bench_shape, "float16", seed=_seed("integrity", 900))


def build_plan(kernel_type: str, caps: Capabilities, target: Case | None = None) -> Plan:
    kt = registry.get(kernel_type)
    plan = Plan()
    plan.stages["smoke"] = [Case.make(kernel_type, kt.smoke_shape, "float32", seed=_seed("smoke", 0))]
    sweep = [Case.make(kernel_type, dims, dtype, seed=_seed("shape_sweep", i * 3 + j), **kwargs)
             for i, (dims, kwargs) in enumerate(kt.sweep) for j, dtype in enumerate(caps.dtypes)]
    if target is not None and (caps.device != "cpu" or math.prod(target.dims.values()) <= CPU_TARGET_CHECK_ELEMENTS):
        if target.dtype in caps.dtypes:
            sweep.append(target.replace(seed=_seed("shape_sweep", 999), variant="plain"))
    plan.stages["shape_sweep"] = sweep
    if not caps.bf16:
        plan.skipped["shape_sweep"] = ["bfloat16: skip (the Triton interpreter cannot run bf16 dot products)"]
    plan.stages["stability"] = [Case.make(kernel_type, dims, dtype, seed=_seed("stability", i * 3 + j), variant=v)
                                for i, (v, dims, dtypes) in enumerate(kt.stability)
                                for j, dtype in enumerate(dtypes) if dtype in caps.dtypes]
    det_dims, det_kwargs = kt.sweep[0]
    plan.stages["determinism"] = [Case.make(kernel_type, det_dims, "float32", seed=_seed("determinism", 0), **det_kwargs)]
    plan.stages["edge_cases"] = [Case.make(kernel_type, dims, dtype, seed=_seed("edge_cases", i * 3 + j), variant=v, **kw)
                                 for i, (v, dims, kw) in enumerate(kt.edge_cases)
                                 for j, dtype in enumerate(("float32", "float16"))]
    integ_dims, integ_kwargs = kt.sweep[min(1, len(kt.sweep) - 1)]
    plan.stages["integrity"] = [Case.make(kernel_type, integ_dims, "float16", seed=_seed("integrity", k), **integ_kwargs)
                                for k in range(2)]
    plan.timing = timing_case(kernel_type, caps, target)
    return plan
