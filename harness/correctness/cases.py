"""Which cases each stage runs.

A stage plan is a list of `Check`s: one or more kernel calls whose outputs the judge compares
(with the reference, or with each other). Seeds differ per case so no two cases share inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from harness.kernel_types import registry
from harness.kernel_types.registry import Case

STAGES = ("compile", "smoke", "shape_sweep", "stability", "determinism", "edge_cases", "integrity")
CORRECTNESS_STAGES = ("smoke", "shape_sweep", "stability", "edge_cases")
AROUND_STAGE = "around"  # the worker's stage names for the shapes around a target: around:0, around:1, ...
# On the CPU the interpreter's times say nothing about a GPU: a few timed calls prove the shape and
# label its figure (five, so that one or two reps a busy machine preempts outside the timed call
# cannot outvote the witness's clock); on a GPU the shapes are timed as the target is.
AROUND_CPU_BUDGET = dict(budget_ms=0.0, warmup=0, min_reps=5, max_reps=5)


def around_limits(device: str) -> dict | None:
    return AROUND_CPU_BUDGET if device == "cpu" else None


DETERMINISM_CALLS = 3  # calls per determinism case: the worker makes them, the judge holds it to them
# Largest target (in input elements) still checked for correctness under the Triton interpreter.
CPU_TARGET_CHECK_ELEMENTS = 4_000_000


# What stands in for a dtype a GPU cannot run (bf16 before sm_80): fp16 has bf16's storage size and
# runs everywhere; its numerics are checked, labelled as standing in, never passed off as bf16's,
# and a winner whose verdict says so is not served in the dtype that was not run.
STAND_IN = {"bfloat16": "float16"}


@dataclass
class Capabilities:
    device: str  # "cpu" or "cuda"
    bf16: bool  # can a GPU run bf16 (the CPU always can: harness/correctness/interpreter_numerics.py)

    def runs(self, kernel_type: str, dtype: str) -> bool:
        """Whether kernels of this type can be judged in `dtype` here. The Triton interpreter runs
        bf16 loads, stores, elementwise maths and reductions itself, and bf16 dot products as the
        judge emulates them (operands widened to fp32, products summed in fp32, as tensor cores do)."""
        return dtype != "bfloat16" or self.bf16 or self.device == "cpu"

    def dtypes(self, kernel_type: str) -> tuple[str, ...]:
        return tuple(d for d in ("float32", "float16", "bfloat16") if self.runs(kernel_type, d))

    def judged_dtype(self, kernel_type: str, dtype: str) -> str:
        """The target's own dtype where it runs here, else the dtype that stands in for it."""
        return dtype if self.runs(kernel_type, dtype) else STAND_IN.get(dtype, "float32")


def _tail_heavy(sweep: list) -> int:
    """The sweep shape with the most dims that are not a multiple of 16 (the first of equals): where
    a kernel's tail handling (a K % 16 remainder, a partial block) shows."""
    return max(range(len(sweep)), key=lambda i: (sum(v % 16 != 0 for v in sweep[i][0].values()), -i))


@dataclass
class Plan:
    stages: dict[str, list[Case]] = field(default_factory=dict)
    skipped: dict[str, list[str]] = field(default_factory=dict)
    timing: Case | None = None
    judged_dtype: str | None = None  # the dtype the target was judged and timed in
    stand_in_for: str | None = None  # the target's own dtype, when another one stood in for it

    def dtype_record(self) -> dict:
        """What the verdict says about the dtype the target was judged in."""
        if self.judged_dtype is None:
            return {}
        return {"judged_dtype": self.judged_dtype, "stand_in_for": self.stand_in_for}


def _seed(stage: str, i: int) -> int:
    return 1000 * (STAGES.index(stage) + 1) + i


def timing_case(kernel_type: str, caps: Capabilities, target: Case | None) -> Case:
    kt = registry.get(kernel_type)
    if target is not None:
        return target.replace(dtype=caps.judged_dtype(kernel_type, target.dtype), seed=_seed("integrity", 900))
    if caps.device == "cpu":
        return Case.make(kernel_type, kt.cpu_bench_shape, "float32", seed=_seed("integrity", 900))
    return Case.make(kernel_type, kt.bench_shape, "float16", seed=_seed("integrity", 900))


def build_plan(kernel_type: str, caps: Capabilities, target: Case | None = None) -> Plan:
    kt = registry.get(kernel_type)
    plan = Plan()
    plan.stages["smoke"] = [Case.make(kernel_type, kt.smoke_shape, "float32", seed=_seed("smoke", 0))]
    runnable = caps.dtypes(kernel_type)
    # the interpreter is slow: on a CPU the first shape and the one with the most dims off a multiple
    # of 16 check a kernel's bf16 path (and a bf16 target its own shape), so that judging in bf16
    # costs a verdict a case or two more, not a sweep more
    bf16_shapes = {0, _tail_heavy(kt.sweep)}
    sweep = [Case.make(kernel_type, dims, dtype, seed=_seed("shape_sweep", i * 3 + j), **kwargs)
             for i, (dims, kwargs) in enumerate(kt.sweep) for j, dtype in enumerate(runnable)
             if dtype != "bfloat16" or caps.device != "cpu" or i in bf16_shapes]
    if target is not None:
        plan.judged_dtype = caps.judged_dtype(kernel_type, target.dtype)
        plan.stand_in_for = target.dtype if plan.judged_dtype != target.dtype else None
        if caps.device != "cpu" or math.prod(target.dims.values()) <= CPU_TARGET_CHECK_ELEMENTS:
            sweep.append(target.replace(dtype=plan.judged_dtype, seed=_seed("shape_sweep", 999), variant="plain"))
    plan.stages["shape_sweep"] = sweep
    if "bfloat16" not in runnable:
        stand = f"; {plan.judged_dtype} stands in for the bfloat16 target" if plan.stand_in_for else ""
        plan.skipped["shape_sweep"] = [f"bfloat16: skip (this GPU cannot run bf16){stand}"]
    plan.stages["stability"] = [Case.make(kernel_type, dims, dtype, seed=_seed("stability", i * 3 + j), variant=v)
                                for i, (v, dims, dtypes) in enumerate(kt.stability)
                                for j, dtype in enumerate(dtypes) if caps.runs(kernel_type, dtype)]
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
