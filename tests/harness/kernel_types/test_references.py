"""The judge's references: float64 on the CPU for the small stage shapes; at large shapes on a GPU,
float64 on the GPU, or float32 with a derived error bound where the GPU's float64 is slow. The
float32 path runs here on CPU tensors: its bound holds against float64, it accepts a correct output
and rejects a wrong one."""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.kernel_types import references, registry
from harness.correctness.compare import compare
from harness.kernel_types.references import choose, compute
from harness.kernel_types.registry import Case

BIG = references.SMALL_ELEMENTS + 1


def _matmul(dtype: str = "float16") -> Case:
    return Case.make("matmul", {"M": 96, "K": 2048, "N": 80}, dtype, seed=3)


def test_small_cases_and_the_cpu_keep_float64_on_the_cpu():
    case = _matmul()
    assert choose(case, "cpu", BIG) == ("cpu", "float64")
    assert choose(case, "cuda", 1000, capability=(8, 6)) == ("cpu", "float64")


def test_large_cases_on_a_gpu_go_to_the_gpu():
    assert choose(_matmul(), "cuda", BIG, capability=(9, 0)) == ("cuda", "float64")  # H100/H200: fast fp64
    assert choose(_matmul(), "cuda", BIG, capability=(8, 9)) == ("cuda", "float32")  # L4/4090: slow fp64
    # no derived bound, or a tolerance the bound would eat into: float64 even where it is slow
    assert choose(_matmul("float32"), "cuda", BIG, capability=(8, 9)) == ("cuda", "float64")
    softmax = Case.make("softmax", {"M": 4096, "N": 4096}, "float16", seed=1)
    assert choose(softmax, "cuda", BIG, capability=(8, 9)) == ("cuda", "float64")


def test_compute_in_float64_is_the_registry_reference_and_says_where_it_ran():
    # the device side of the same path (inputs moved to the GPU, computed there) is the gpu-marked
    # test at the end of this file
    case = _matmul()
    args, kwargs = registry.build_inputs(case, "cpu")
    ref = compute(case, args, kwargs, "cpu", "float64")
    assert ref.how == "float64 on cpu" and ref.value.dtype == torch.float64
    assert ref.error is None and torch.equal(ref.value, registry.reference_output(case))


def test_the_float32_bound_holds_and_is_far_inside_the_tolerance():
    case = _matmul()
    args, kwargs = registry.build_inputs(case, "cpu")
    truth = registry.reference_output(case)
    ref = compute(case, args, kwargs, "cpu", "float32")
    assert ref.value.dtype == torch.float64 and ref.error.shape == truth.shape
    assert bool(((ref.value - truth).abs() <= ref.error).all())
    rtol, atol = registry.get("matmul").tolerances["float16"]
    assert float(ref.error.max()) < 0.1 * atol * float(registry.row_rms(truth).min())


def test_the_float32_reference_accepts_a_correct_output_and_rejects_a_wrong_one():
    case = _matmul()
    args, kwargs = registry.build_inputs(case, "cpu")
    ref = compute(case, args, kwargs, "cpu", "float32")
    truth = registry.reference_output(case)
    assert compare(truth.half(), ref.value, case, args, ref_error=ref.error).ok
    wrong = truth.half().clone()
    wrong[7, 11] += 0.05 * float(registry.row_rms(truth)[7, 11])
    assert not compare(wrong, ref.value, case, args, ref_error=ref.error).ok
    # an error just inside / just outside the fp16 tolerance gets the float64 reference's verdict
    rtol, atol = registry.get("matmul").tolerances["float16"]
    tolerance = atol * registry.row_rms(truth) + rtol * truth.abs()
    for factor, ok in ((0.8, True), (1.2, False)):
        off = (truth + factor * tolerance).half()
        # fp16 rounding of `off` moves it by up to half an ulp: judge it against what it really is
        assert compare(off, truth, case, args).ok is ok
        assert compare(off, ref.value, case, args, ref_error=ref.error).ok is ok


def test_the_reference_entry_point_matches_registry_on_the_cpu():
    case = Case.make("softmax", {"M": 8, "N": 64}, "float32", seed=2)
    ref = references.reference(case, "cpu")
    assert ref.how == "float64 on cpu" and torch.equal(ref.value, registry.reference_output(case))


class _Devices(TorchDispatchMode):
    """The devices of the tensors each aten op was given: where a reference really ran."""

    def __init__(self):
        super().__init__()
        self.ops: dict[str, set] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        devices = {a.device.type for a in args if isinstance(a, torch.Tensor)}
        self.ops.setdefault(str(func.overloadpacket), set()).update(devices)
        return func(*args, **(kwargs or {}))

    def of(self, op: str) -> set:
        return self.ops.get(op, set())


@pytest.mark.gpu
def test_on_the_gpu_a_large_reference_is_computed_there_and_agrees_with_the_cpu():
    case = Case.make("matmul", {"M": 1024, "K": 1024, "N": 1024}, "float16", seed=5)
    args, kwargs = registry.build_inputs(case, "cpu")
    where, precision = choose(case, "cuda", references.elements_of(args))
    assert where == "cuda"
    with _Devices() as seen:
        ref = compute(case, args, kwargs, where, precision)
    assert seen.of("aten.mm") == {"cuda"} and ref.how.startswith(f"{precision} on cuda"), (seen.ops, ref.how)
    truth = registry.reference_output(case)
    if ref.error is None:
        assert torch.allclose(ref.value, truth, rtol=1e-12, atol=1e-12)
    else:
        assert bool(((ref.value - truth).abs() <= ref.error).all())
    bounded = compute(case, args, kwargs, "cuda", "float32")  # the fp32 path on a real GPU: TF32 off
    assert bool(((bounded.value - truth).abs() <= bounded.error).all())
