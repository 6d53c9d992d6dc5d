"""Compile-for-target without a GPU: Triton launches recorded under the interpreter, and CUDA C++
kernel files, compiled for sm_90 / sm_80 with registers, spills and shared memory read back."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from harness import cuda_build
from harness.compiling import target_compile
from harness.correctness import launches
from harness.correctness.launches import LaunchMonitor
from harness.compiling.target_compile import KernelResources, compile_cuda, parse_arch, shared_limit, summarize
from paths import ROOT
from toolchain import needs_nvcc


# Run in a subprocess with TRITON_INTERPRET=1 set before triton is imported: the kernels run on the
# CPU under the installed launch monitor, recording, then every scenario is compiled for a GPU target.
TRITON_SCRIPT = r'''
import json, os, sys
os.environ["TRITON_INTERPRET"] = "1"
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
import torch, triton, triton.language as tl
from harness.correctness import launches
from harness.correctness.launches import LaunchRecord
from harness.compiling.target_compile import compile_triton, lower_triton


@triton.jit
def member_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    v = tl.load(x_ptr + tl.arange(0, BLOCK))
    tl.store(y_ptr + tl.arange(0, BLOCK), v - v.max(axis=0) + v.sum(axis=0))  # tensor member functions


@triton.jit
def _twice(v):
    return v * 2.0


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, DOUBLE: tl.constexpr = True):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    if DOUBLE:
        v = _twice(v)  # a device-function call: the interpreter leaves triton.language patched
    tl.store(y_ptr + offs, v + tl.sum(v, axis=0) * 0.0 + tl.max(v, 0) * 0.0, mask=mask)


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * K + (k + rk)[None, :],
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * N + rn[None, :],
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16), mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 128}, num_warps=64)],
                 key=["n"])
@triton.jit
def tuned_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2.0, mask=offs < n)


def config_records(raw):
    # the launches an autotuner makes while benchmarking its configs on a GPU (it cannot run here)
    return [LaunchRecord(raw.__name__, raw, {"x_ptr": x, "y_ptr": y, "n": 1000, "BLOCK": block}, ("BLOCK",), None,
                         {"num_warps": warps}) for block, warps in ((64, 2), (128, 64))]


monitor = launches.install()


def record(launch):
    monitor.recording = True
    launch()
    monitor.recording = False
    return monitor.take_records()  # each distinct specialization once


def summary(tc):
    return {"ok": tc.ok, "detail": tc.detail, "resources": tc.resources}


x = torch.randn(1000)
y = torch.empty(1000)
a = torch.randn(64, 64).half()
c = torch.empty(64, 64, dtype=torch.float16)
out = {}
two_configs = record(lambda: (scale_kernel[(4,)](x, y, 1000, BLOCK=256, num_warps=4),
                              scale_kernel[(4,)](x, y, 1000, BLOCK=256, num_warps=4),
                              scale_kernel[(8,)](x, y, 1000, BLOCK=128, num_warps=2)))
out["launches"] = len(two_configs)
out["sm90"] = summary(compile_triton(two_configs, "sm_90"))
out["sm80"] = summary(compile_triton(two_configs, "sm_80"))
out["dot"] = summary(compile_triton(record(lambda: dot_kernel[(1, 1)](a, a, c, 64, 64, 64, BM=64, BN=64, BK=32,
                                                                       num_warps=4, num_stages=2)), "sm_90"))
out["too_much_shared"] = summary(compile_triton(record(lambda: dot_kernel[(1, 1)](
    a, a, c, 64, 64, 64, BM=256, BN=256, BK=128, num_warps=8, num_stages=4)), "sm_90"))
out["too_many_threads"] = summary(compile_triton(record(lambda: scale_kernel[(4,)](
    x, y, 1000, BLOCK=256, num_warps=64)), "sm_90"))
out["spills"] = summary(compile_triton(record(lambda: scale_kernel[(1,)](
    x, y, 1000, BLOCK=1024, num_warps=1, maxnreg=24)), "sm_90"))
out["autotuned"] = summary(compile_triton(config_records(tuned_kernel.fn.fn), "sm_90"))
out["not_autotuned"] = summary(compile_triton(config_records(scale_kernel.fn), "sm_90"))
# the interpreter still works after compiling: the language patches were put back
scale_kernel[(4,)](x, y, 1000, BLOCK=256)
out["interpreter_after"] = bool(torch.allclose(y, 2 * x))
# Triton's standard library (tl.sum, tl.max above) converted once for every compile, and put back
from triton.runtime.interpreter import InterpretedFunction
from harness.compiling import triton_specialization
own = dict(triton_specialization._TRITONS_OWN)
compile_triton(record(lambda: scale_kernel[(4,)](x, y, 1000, BLOCK=64)), "sm_90")
out["stdlib_converted_once"] = bool(own) and all(triton_specialization._TRITONS_OWN[k][1] is v[1] for k, v in own.items())
out["stdlib_put_back"] = all(isinstance(getattr(tl.standard, name), InterpretedFunction) for name in ("sum", "max"))
# a tensor's member functions (x.max(), x.sum()) lowered as a GPU compiles them, and put back
member_before = tl.core.tensor.max
member = record(lambda: member_kernel[(1,)](x, y, BLOCK=64))
out["member_runs"] = bool(torch.allclose(y[:64], x[:64] - x[:64].max() + x[:64].sum(), atol=1e-4))
out["member_lowered"] = lower_triton(member, "sm_90").detail
out["member_compiled"] = compile_triton(member, "sm_90").ok
out["member_put_back"] = tl.core.tensor.max is member_before
# one of them re-pointed at other code: what is lowered is that code, not the conversion kept


def _other_sum(input, axis=None, keep_dims=False, dtype=None):
    return input


kept_fn, tl.standard.sum.fn = tl.standard.sum.fn, _other_sum
with triton_specialization.compiled_mode([]):
    out["repointed_lowered_as_it_is"] = tl.standard.sum.fn is _other_sum
tl.standard.sum.fn = kept_fn
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def triton_results(tmp_path_factory):
    script = tmp_path_factory.mktemp("triton_target") / "scenarios.py"
    script.write_text(TRITON_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRITON_CACHE_DIR": str(script.parent / "triton_cache")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


# ---------------------------------------------------------------- arch names and limits
@pytest.mark.parametrize("text,cc", [("sm_90", 90), ("sm90", 90), ("90", 90), ("sm_90a", 90),
                                     ("SM_80", 80), ("sm_100", 100), (86, 86)])
def test_parse_arch_accepts_the_usual_spellings(text, cc):
    assert parse_arch(text) == cc


@pytest.mark.parametrize("text", ["hopper", "sm_", "compute_90x", "9.0", ""])
def test_parse_arch_rejects_others_with_a_clear_message(text):
    with pytest.raises(ValueError, match="sm_90"):
        parse_arch(text)


def test_shared_limits_follow_the_programming_guide_table():
    assert shared_limit(80) == 166912 and shared_limit(86) == 101376 and shared_limit(89) == 101376
    assert shared_limit(90) == 232448 and shared_limit(100) == 232448
    assert shared_limit(91) == 232448  # unknown minor: the closest earlier one of the same major


def test_summary_names_heavy_spills_and_the_shared_limit():
    light = KernelResources("k", 40, 16, 1024)
    heavy = KernelResources("big", 255, target_compile.HEAVY_SPILL_BYTES + 4, 2048)
    tc = summarize([light, heavy], 90, 0.5, "kernel(s)")
    assert tc.ok and "heavy spills" in tc.detail and "big" in tc.detail
    assert tc.resources == {"arch": "sm_90", "registers": 255, "spills": 16 + heavy.spills, "shared_bytes": 2048,
                            "kernels": [light.to_json(), heavy.to_json()]}
    over = summarize([KernelResources("huge", 32, 0, 200_000)], 86, 0.1, "kernel(s)")
    assert not over.ok and "101376" in over.detail and over.resources is None


# ---------------------------------------------------------------- Triton
def test_triton_launches_compile_for_sm90_with_resources(triton_results):
    tc = triton_results["sm90"]
    assert tc["ok"], tc["detail"]
    res = tc["resources"]
    assert res["arch"] == "sm_90" and res["registers"] > 0 and res["spills"] == 0
    # tl.sum across 4 warps goes through shared memory: read from the compiled kernel's metadata
    assert all(k["shared_bytes"] > 0 for k in res["kernels"]), res["kernels"]  # each config reduces across warps
    assert res["shared_bytes"] == max(k["shared_bytes"] for k in res["kernels"])  # the most any launch needs
    assert "compiled for sm_90" in tc["detail"]


def test_repeated_launches_compile_once_and_configs_give_different_code(triton_results):
    kernels = triton_results["sm90"]["resources"]["kernels"]
    assert triton_results["launches"] == 2 and len(kernels) == 2  # the repeated launch is kept once
    assert {k["config"].split(",")[0] for k in kernels} == {"BLOCK=256", "BLOCK=128"}
    assert kernels[0]["hash"] != kernels[1]["hash"]
    assert {k["threads"] for k in kernels} == {128, 64}


def test_the_same_launches_compile_for_sm80_into_other_code(triton_results):
    sm80, sm90 = triton_results["sm80"], triton_results["sm90"]
    assert sm80["ok"] and sm80["resources"]["arch"] == "sm_80"
    assert {k["hash"] for k in sm80["resources"]["kernels"]}.isdisjoint(
        k["hash"] for k in sm90["resources"]["kernels"])


def test_a_dot_kernel_reports_its_pipeline_shared_memory(triton_results):
    tc = triton_results["dot"]
    assert tc["ok"], tc["detail"]
    assert tc["resources"]["shared_bytes"] >= 2 * 64 * 32 * 2  # one stage of the a and b tiles in fp16


def test_too_much_shared_memory_fails_naming_the_limit(triton_results):
    tc = triton_results["too_much_shared"]
    assert not tc["ok"]
    assert "232448" in tc["detail"] and "shared memory" in tc["detail"] and "BM=256" in tc["detail"]


def test_more_than_1024_threads_fails(triton_results):
    tc = triton_results["too_many_threads"]
    assert not tc["ok"] and "2048 threads" in tc["detail"]


def test_spills_are_counted_and_called_heavy(triton_results):
    tc = triton_results["spills"]
    assert tc["ok"], tc["detail"]
    assert tc["resources"]["spills"] > target_compile.HEAVY_SPILL_BYTES and "heavy spills" in tc["detail"]


def test_autotune_configs_that_cannot_run_are_pruned_as_the_autotuner_does(triton_results):
    tuned, plain = triton_results["autotuned"], triton_results["not_autotuned"]
    assert tuned["ok"], tuned["detail"]
    assert [k["config"] for k in tuned["resources"]["kernels"]] == ["BLOCK=64, num_warps=2, num_stages=3"]
    assert "1 autotune config(s) would not run on sm_90" in tuned["detail"]
    assert not plain["ok"] and "2048 threads" in plain["detail"]  # the same launches, not autotuned


def test_the_interpreter_still_runs_after_compiling(triton_results):
    assert triton_results["interpreter_after"]
    assert triton_results["stdlib_put_back"]  # tl.sum and tl.max are the interpreter's again


def test_a_tensors_member_functions_compile_for_the_target_and_run_in_the_interpreter_after(triton_results):
    # x.max(axis=0) is tl.max's JITFunction on a GPU; under the interpreter a wrapper of its
    # InterpretedFunction, which code generation ran on IR values: an honest kernel refused at compile
    assert triton_results["member_runs"] and triton_results["member_compiled"]
    assert triton_results["member_lowered"] == "1 Triton specialization(s) lowered for sm_90"
    assert triton_results["member_put_back"]


def test_tritons_own_functions_are_converted_for_the_compiler_once_per_process(triton_results):
    assert triton_results["stdlib_converted_once"]
    assert triton_results["repointed_lowered_as_it_is"]  # a function re-pointed since is converted anew


# ---------------------------------------------------------------- CUDA C++
def kernel_file(kernels: str, config: dict | None = None) -> types.ModuleType:
    module = types.ModuleType("candidate")
    module.KERNEL_TYPE, module.BACKEND, module.CUDA_KERNELS = "softmax", "cuda", textwrap.dedent(kernels)
    if config is not None:
        module.CONFIG = config
    return module


SCALE = r'''
#include <cuda_fp16.h>
__global__ void scale_kernel(const float* x, float* y, int n) {
  __shared__ float tile[THREADS];
  int i = blockIdx.x * THREADS + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.f;
  __syncthreads();
  if (i < n) y[i] = tile[THREADS - 1 - threadIdx.x] * FACTOR;
}
void scale_launch(const float* x, float* y, int n, cudaStream_t s) {
  scale_kernel<<<(n + THREADS - 1) / THREADS, THREADS, 0, s>>>(x, y, n);
}
'''


@needs_nvcc
def test_a_cuda_file_compiles_with_its_config_macros():
    tc = compile_cuda(kernel_file(SCALE, {"THREADS": 256, "FACTOR": 2.5}), "sm_90")
    assert tc.ok, tc.detail
    assert tc.resources["kernels"] == [{"name": "scale_kernel", "registers": tc.resources["registers"],
                                        "spills": 0, "shared_bytes": 1024}]
    assert tc.resources["registers"] > 0
    other = compile_cuda(kernel_file(SCALE, {"THREADS": 128, "FACTOR": 2.5}), "sm_90")
    assert other.ok and other.resources["shared_bytes"] == 512
    assert other.resources["code_hash"] != tc.resources["code_hash"]


@needs_nvcc
def test_a_broken_cuda_file_fails_with_nvccs_message_and_line():
    broken = SCALE.replace("y[i] = tile", "y[i] = undefined_value + tile")
    tc = compile_cuda(kernel_file(broken, {"THREADS": 256, "FACTOR": 1.0}), "sm_80")
    assert not tc.ok
    assert 'identifier "undefined_value" is undefined' in tc.detail
    assert "CUDA_KERNELS(8)" in tc.detail  # the line in CUDA_KERNELS itself, after the CONFIG macros


@needs_nvcc
def test_an_oversized_static_shared_array_fails_the_shared_memory_limit():
    huge = SCALE.replace("tile[THREADS]", "tile[THREADS * 64]")
    tc = compile_cuda(kernel_file(huge, {"THREADS": 256, "FACTOR": 1.0}), "sm_90")
    assert not tc.ok
    assert "too much shared data" in tc.detail and str(target_compile.MAX_STATIC_SHARED_BYTES) in tc.detail


@needs_nvcc
def test_spills_in_cuda_code_are_reported():
    # 32 registers at most (1024 threads, 2 blocks per SM) for 64 live values: ptxas must spill
    spilling = r'''
    __global__ void __launch_bounds__(1024, 2) busy(const float* x, float* y) {
      float v[64];
      #pragma unroll
      for (int i = 0; i < 64; ++i) v[i] = x[threadIdx.x + i * 1024];
      float s = 0.f;
      #pragma unroll
      for (int i = 0; i < 64; ++i) s += v[i] * v[63 - i] + v[(i * 7) % 64];
      #pragma unroll
      for (int i = 0; i < 64; ++i) y[threadIdx.x + i * 1024] = v[i] * s;
    }
    '''
    tc = compile_cuda(kernel_file(spilling), "sm_90")
    assert tc.ok, tc.detail
    assert tc.resources["spills"] > 0 and "spill" in tc.detail


@needs_nvcc
def test_torch_headers_in_cuda_kernels_get_a_hint():
    tc = compile_cuda(kernel_file("#include <torch/extension.h>\n" + SCALE, {"THREADS": 32, "FACTOR": 1}))
    assert not tc.ok and "CUDA_HOST" in tc.detail and "torch/extension.h" in tc.detail


def test_a_cuda_file_without_kernels_or_with_a_bad_config_fails_clearly():
    assert "CUDA_KERNELS" in compile_cuda(types.ModuleType("empty")).detail
    tc = compile_cuda(kernel_file(SCALE, {"THREADS": "256"}))
    assert not tc.ok and "only int, float and bool" in tc.detail


def test_missing_nvcc_is_reported(monkeypatch):
    monkeypatch.setattr(cuda_build, "nvcc_path", lambda: None)
    tc = compile_cuda(kernel_file(SCALE, {"THREADS": 64, "FACTOR": 3.0}), "sm_90")
    assert not tc.ok and tc.detail.startswith("nvcc not found")


def test_ptxas_log_is_read_per_kernel():
    log = textwrap.dedent("""\
        ptxas info    : 0 bytes gmem
        ptxas info    : Compiling entry function '_Z1av' for 'sm_90'
        ptxas info    : Function properties for _Z1av
            8 bytes stack frame, 12 bytes spill stores, 20 bytes spill loads
        ptxas info    : Used 255 registers, used 1 barriers, 4096 bytes smem, 372 bytes cmem[0]
        ptxas info    : Function properties for helper
            0 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
        ptxas info    : Compiling entry function '_Z1bv' for 'sm_90'
        ptxas info    : Function properties for _Z1bv
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 8 registers, 372 bytes cmem[0]
        """)
    assert cuda_build.parse_ptxas_log(log) == {
        "_Z1av": {"registers": 255, "spills": 32, "shared_bytes": 4096},
        "_Z1bv": {"registers": 8, "spills": 0, "shared_bytes": 0}}


# ---------------------------------------------------------------- the CUDA build contract
def test_what_is_checked_is_what_is_built():
    config = {"THREADS": 128, "FACTOR": 0.5, "FAST": False}
    checked = cuda_build.kernels_source(SCALE, config)
    built = cuda_build.extension_source(SCALE, "torch::Tensor f(torch::Tensor x) { return x; }", ["f"], config)
    assert built.startswith(checked)
    assert "#define THREADS 128\n" in checked and "#define FAST 0\n" in checked
    assert 'm.def("f", &f' in built and "PYBIND11_MODULE(TORCH_EXTENSION_NAME" in built


def test_torch_nvcc_flags_match_torchs_own():
    from torch.utils import cpp_extension
    assert list(cuda_build.TORCH_NVCC_FLAGS) == list(cpp_extension.COMMON_NVCC_FLAGS)


def test_load_cuda_builds_once_into_the_cache_and_counts_calls_under_a_monitor(tmp_path, monkeypatch):
    from torch.utils import cpp_extension
    built = []

    def fake_load_inline(**kwargs):  # stands in for the nvcc + ninja build a GPU machine does
        Path(kwargs["build_directory"], "cuda.cu").write_text(kwargs["cuda_sources"][0])
        if not built:
            built.append(types.SimpleNamespace(f=lambda x: x + 1))
        return built[0]

    monkeypatch.setenv("AUTOKERNEL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load_inline", fake_load_inline)
    monkeypatch.setattr(cuda_build, "_BUILT", {})

    def load(threads: int):
        return cuda_build.load_cuda("scale", SCALE, "int f(int x) { return x + 1; }", ["f"], {"THREADS": threads})

    module = load(64)
    assert module.f(1) == 2 and load(64) is module
    (build_dir,) = [p for p in (tmp_path / "cuda").iterdir() if p.is_dir()]
    assert build_dir.name.startswith("scale_") and "#define THREADS 64" in (build_dir / "cuda.cu").read_text()
    assert (build_dir / "include" / cuda_build.DEVICE_HEADER_NAME).read_text() == cuda_build.DEVICE_HEADER
    monitor = LaunchMonitor()
    launches._wrap_loader(monitor, cpp_extension, "load_inline")  # as install() does, once per process
    for x in (2, 3):
        assert load(64).f(x) == x + 1
    assert monitor.cuda_calls == 2
    assert load(64) is load(64)  # handed out once through the wrapping loader, then reused
    load(128).f(0)
    assert monitor.cuda_calls == 3 and len([p for p in (tmp_path / "cuda").iterdir() if p.is_dir()]) == 2
