"""The CUDA C++ starter kernels: their declared literals and contract, nvcc's verdict on each for
sm_90 and sm_80 (default and second CONFIG), the judge's COMPILE_ONLY verdict on a machine without a
GPU, the Python host side of each against its nvcc-built launch library (the launch left out), and,
on a GPU, every judged case through the launch library against the float64 references.

The nvcc compiles run once per module, two at a time across the CPU cores.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from autokernel.search.kernel_source import apply_config
from harness import cuda_build
from harness.kernel_types import registry
from harness.compiling.target_compile import compile_cuda
from starter_configs import CUDA as SECOND_CONFIGS
from starter_kernels import SINGLE_TYPES as KERNEL_TYPES, starter_path  # chains have Triton starters only
from toolchain import needs_nvcc

ARCHS = ("sm_90", "sm_80")
PARALLEL_JOBS = 2  # the CI machine has two cores; nvcc runs in a subprocess, so threads suffice



def _source(kernel_type: str) -> str:
    return starter_path(kernel_type, "cuda").read_text(encoding="utf-8")


def _module(kernel_type: str, config: dict | None = None) -> types.ModuleType:
    module = importlib.import_module(f"starter_kernels.cuda.{kernel_type}")
    if config is None:
        return module
    copy = types.ModuleType(f"{kernel_type}_second")
    copy.__dict__.update({k: v for k, v in vars(module).items() if k.isupper()}, CONFIG=config)
    return copy


# ------------------------------------------------------------------ the literals and the contract
@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_the_cuda_contract_holds(kernel_type):
    module = _module(kernel_type)
    kernels, text = module.CUDA_KERNELS, _source(kernel_type)
    assert not re.search(r"#include\s*<(torch|ATen|c10)/", kernels), "torch headers have no place in CUDA_KERNELS"
    # the host side is Python through the launch library: no torch extension to build
    assert not hasattr(module, "CUDA_HOST") and "load_cuda" not in text and "load_launcher(CUDA_KERNELS, CONFIG)" in text
    assert re.search(r"^void \w+_launch\(", kernels, re.M), "a plain C++ launch function"
    for flag in ("--use_fast_math", "__expf", "__logf", "__fdividef", "atomicAdd"):
        assert flag not in kernels, f"{flag}: approximate or order-dependent arithmetic in a starter"
    assert set(module.CONFIG) <= set(re.findall(r"\b[A-Z][A-Z_]+\b", kernels))  # every knob is used


def test_every_type_has_a_cuda_starter():
    assert {p.stem for p in Path(starter_path("softmax", "cuda")).parent.glob("*.py")} - {"__init__"} == \
        set(KERNEL_TYPES)


# ------------------------------------------------------------------ compiled for the target
def _compile_all() -> dict:
    jobs = {(t, arch, "default"): (t, None, arch) for t in KERNEL_TYPES for arch in ARCHS}
    jobs.update({(t, "sm_90", "second"): (t, SECOND_CONFIGS[t], "sm_90") for t in KERNEL_TYPES})
    with ThreadPoolExecutor(PARALLEL_JOBS) as pool:
        futures = {key: pool.submit(lambda t, c, a: compile_cuda(_module(t, c), a), *job)
                   for key, job in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


@pytest.fixture(scope="module")
def compiled() -> dict:
    return _compile_all()


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_starter_compiles_for_the_target_with_resources(compiled, kernel_type, arch):
    tc = compiled[(kernel_type, arch, "default")]
    assert tc.ok, tc.detail
    res = tc.resources
    assert res["arch"] == arch and res["registers"] > 0 and res["spills"] == 0
    assert 0 <= res["shared_bytes"] <= 48 * 1024  # static shared memory only, within its ceiling
    for kernel in res["kernels"]:
        assert kernel["registers"] > 0 and kernel["spills"] == 0, kernel
    # a kernel per dtype, each checked here: fp32 has its own (no fp16 round trip), so do fp16, bf16
    names = " ".join(k["name"] for k in res["kernels"])
    assert "<__half" in names and "<__nv_bfloat16" in names and re.search(r"<float|fp32", names), names


@needs_nvcc
@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_second_config_compiles_into_other_code(compiled, kernel_type):
    default, second = compiled[(kernel_type, "sm_90", "default")], compiled[(kernel_type, "sm_90", "second")]
    assert second.ok, second.detail
    assert second.resources["code_hash"] != default.resources["code_hash"]


@needs_nvcc
def test_the_judge_says_compile_only_without_a_gpu(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("with a GPU the judge runs the kernel instead")
    from harness.judge import judge
    verdict = judge(starter_path("softmax", "cuda"), device="cpu")
    assert verdict["verdict"] == "COMPILE_ONLY", verdict["stages"]
    assert verdict["resources"]["arch"] == "sm_90" and verdict["resources"]["registers"] > 0


# ------------------------------------------------------------------ the host side, without a GPU
@pytest.fixture(scope="module")
def launch_libraries() -> dict:
    """Every starter's launch library, built by nvcc for sm_90 (no GPU needed), two at a time."""
    from harness.cuda_launcher import build_library
    with ThreadPoolExecutor(PARALLEL_JOBS) as pool:
        futures = {t: pool.submit(build_library, _module(t).CUDA_KERNELS, _module(t).CONFIG, "sm_90")
                   for t in KERNEL_TYPES}
        return {t: f.result() for t, f in futures.items()}


@needs_nvcc
@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_the_python_host_side_calls_its_launch_function_correctly(launch_libraries, kernel_type, monkeypatch):
    """kernel_fn's Python runs on CPU tensors with the launch itself left out: every call must
    marshal against the parameter types nvcc's library really has, pass contiguous tensors of the
    pointer's element type, and hand the kernel the tensor it returns, shaped and typed as the
    reference is. The cases are the GPU judge's, in every dtype, layouts and edge cases included."""
    from harness import cuda_launcher
    from harness.correctness.cases import CORRECTNESS_STAGES, Capabilities, build_plan
    launches = []

    def dry_invoke(launcher, name, values):
        launches.append((name, values, cuda_launcher.marshal(launcher.signatures[name], values)))
    monkeypatch.setattr(cuda_launcher.Launcher, "invoke", dry_invoke)
    module, kt = _module(kernel_type), registry.get(kernel_type)
    plan = build_plan(kernel_type, Capabilities("cuda", True))
    cases = [case for stage in CORRECTNESS_STAGES for case in plan.stages[stage]]
    assert {case.dtype for case in cases} >= {"float32", "float16", "bfloat16"}
    for case in cases:
        args, kwargs = registry.build_inputs(case, "cpu")
        launches.clear()
        out = module.kernel_fn(*args, **kwargs)
        want = registry.reference_output(case)
        assert tuple(out.shape) == tuple(want.shape) and out.dtype == kt.out_dtype(case), case.label()
        if out.numel() == 0 or any(isinstance(a, torch.Tensor) and a.numel() == 0 for a in args):
            # nothing to compute (an empty or K = 0 problem): no launch needed, the answer must be exact
            assert launches or torch.equal(out, want.to(out.dtype)), case.label()
            continue
        assert len(launches) == 1, f"{case.label()}: {len(launches)} launches where there is work to do"
        name, values, _ = launches[0]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        assert all(t.is_contiguous() for t in tensors), f"{case.label()}: a strided tensor reached {name}"
        assert any(t.data_ptr() == out.data_ptr() for t in tensors), f"{case.label()}: {name} never sees the output"


# ------------------------------------------------------------------ on a GPU
def _gpu_cases(kernel_type: str):
    from harness.correctness.cases import CORRECTNESS_STAGES, Capabilities, build_plan
    plan = build_plan(kernel_type, Capabilities("cuda", torch.cuda.is_bf16_supported()))
    return [case for stage in CORRECTNESS_STAGES for case in plan.stages[stage]]


def _run_on_gpu(module, kernel_type: str) -> list[str]:
    from harness.correctness.compare import compare
    failures = []
    for case in _gpu_cases(kernel_type):
        args, kwargs = registry.build_inputs(case, "cuda")
        try:
            out = module.kernel_fn(*args, **kwargs)
            torch.cuda.synchronize()
            result = compare(out, registry.reference_output(case), case, [a.cpu() if hasattr(a, "cpu") else a
                                                                         for a in args])
            if not result.ok:
                failures.append(f"{case.label()}: {result.detail}")
        except Exception as e:  # a crash is a failure of that case, reported with the others
            failures.append(f"{case.label()}: {type(e).__name__}: {e}")
    return failures


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_starter_is_correct_on_every_judged_case_on_a_gpu(kernel_type):
    failures = _run_on_gpu(_module(kernel_type), kernel_type)
    assert failures == [], "\n".join(failures)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel_type", KERNEL_TYPES)
def test_second_config_is_correct_on_every_judged_case_on_a_gpu(kernel_type, tmp_path):
    path = tmp_path / f"{kernel_type}_second.py"
    path.write_text(apply_config(_source(kernel_type), SECOND_CONFIGS[kernel_type]), encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    failures = _run_on_gpu(module, kernel_type)
    assert failures == [], "\n".join(failures)


@pytest.mark.gpu
def test_beyond_the_contract_cases_match_pytorch_on_a_gpu():
    import torch.nn.functional as F
    gen = torch.Generator().manual_seed(7)
    ce, attn, mm = (_module(t) for t in ("cross_entropy", "flash_attention", "matmul"))
    logits = torch.randn(6, 50, generator=gen)
    targets = torch.tensor([3, -100, 49, 0, -100, 7])
    got = ce.kernel_fn(logits.cuda(), targets.cuda()).cpu().double()
    assert torch.allclose(got, F.cross_entropy(logits.double(), targets), atol=1e-5)
    q, k, v = (torch.randn(1, 2, s, 32, generator=gen) for s in (24, 40, 40))
    for causal in (False, True):
        want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        got = attn.kernel_fn(q.cuda(), k.cuda(), v.cuda(), causal).cpu().double()
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), causal
    a, b = torch.randn(2, 5, 24, generator=gen), torch.randn(24, 9, generator=gen)
    assert torch.allclose(mm.kernel_fn(a.cuda(), b.cuda()).cpu().double(), a.double() @ b.double(), atol=1e-5)


if __name__ == "__main__":  # figures for the report: PYTHONPATH=.:tests/support python tests/harness/test_starters_cuda.py
    for (kernel_type, arch, which), tc in sorted(_compile_all().items()):
        res = tc.resources or {}
        print(f"{kernel_type:17s} {arch} {which:7s} ok={tc.ok} registers={res.get('registers')} "
              f"shared={res.get('shared_bytes')} spills={res.get('spills')} :: {tc.detail[:80]}")
