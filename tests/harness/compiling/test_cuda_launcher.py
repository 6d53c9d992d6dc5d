"""CUDA_KERNELS built by nvcc alone into a launch library, called through ctypes: the build and its
cache, the parameter types read from the library, and the marshalling of tensors, sizes and streams
are checked here without a GPU; the launch itself is a GPU test."""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import pytest
import torch

from harness import cuda_launcher
from harness.cuda_launcher import LaunchError, Signature, build_library, exported, marshal, parse_signature
from paths import ROOT
from toolchain import needs_nvcc

SOFTMAX_PARAMS = ["void const*", "void*", "long", "long", "int", "CUstream_st*"]


def _starter(name: str):
    spec = importlib.util.spec_from_file_location(f"starter_cuda_{name}", ROOT / "starter_kernels" / "cuda" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def softmax_library(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOKERNEL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        starter = _starter("softmax")
        yield build_library(starter.CUDA_KERNELS, starter.CONFIG, "sm_90"), starter


@needs_nvcc
def test_a_starter_builds_without_torch_headers_and_is_cached(softmax_library):
    path, starter = softmax_library
    assert path.is_file() and path.suffix == ".so"
    again = build_library(starter.CUDA_KERNELS, starter.CONFIG, "sm_90")
    assert again == path  # the cached file: nvcc is not run twice for the same source
    other = build_library(starter.CUDA_KERNELS, {**starter.CONFIG, "THREADS": 128}, "sm_90")
    assert other != path  # another CONFIG is another build


@needs_nvcc
def test_the_launch_function_and_its_parameter_types_are_read_from_the_library(softmax_library):
    path, _ = softmax_library
    found = exported(path)
    assert found["softmax_launch"].params == SOFTMAX_PARAMS and found["softmax_launch"].callable_here
    assert not found["block_merge"].callable_here  # a struct by value: not a launch function
    launcher = cuda_launcher.Launcher(path)  # loads without a GPU: the CUDA runtime starts on first use
    assert set(launcher.signatures) == {"softmax_launch"}
    assert launcher._last_error.restype is ctypes.c_int  # the launch check each call makes is in the library
    with pytest.raises(AttributeError, match="softmax_launch"):
        launcher.softmax_fwd  # a wrong name lists the launch functions there are


@needs_nvcc
def test_a_build_error_names_the_line_of_cuda_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOKERNEL_CACHE_DIR", str(tmp_path))
    with pytest.raises(cuda_launcher.LaunchBuildError, match="CUDA_KERNELS"):
        build_library("__global__ void k(float* x) { x[0] = undefined_name; }\n", None, "sm_90")


HOST_ONLY = r"""
#include <cuda_runtime.h>
__global__ void unused(float* x) { x[0] = 1.f; }
// host code only: it runs without a GPU, so the ctypes call itself is checked here
void fill_launch(float* out, long n, float value, int scale, cudaStream_t stream) {
  for (long i = 0; i < n; ++i) out[i] = value * scale + i;
}
"""


@needs_nvcc
def test_a_call_goes_through_the_real_abi_and_the_launch_check(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOKERNEL_CACHE_DIR", str(tmp_path))
    lib = cuda_launcher.load_launcher(HOST_ONLY, None, "sm_90")
    assert cuda_launcher.load_launcher(HOST_ONLY, None, "sm_90") is lib  # once per process
    out = torch.zeros(5)
    try:
        lib.fill_launch(out.data_ptr(), 5, 2.5, 2, 0)  # an address, an int64, a float, an int, a stream
        launch_error = None
    except LaunchError as e:
        launch_error = str(e)
    assert out.tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
    if torch.cuda.is_available():
        assert launch_error is None
    else:  # CUDA's own message, from the library's runtime, names why nothing could launch here
        assert launch_error and launch_error.startswith("fill_launch: the launch failed: ")


def test_signatures_are_parsed_and_templates_skipped():
    sig = parse_signature("_Z1fPKvl", "rmsnorm_launch(void const*, void*, long, float, int, CUstream_st*)")
    assert sig.name == "rmsnorm_launch" and sig.params[3] == "float"
    assert parse_signature("_Z1g", "launch<float>(void const*)") is None
    assert parse_signature("_Z1h", "void f<float>(std::vector<int, std::allocator<int> >)") is None
    assert parse_signature("_Z1i", "noargs()").params == []


def test_tensors_go_in_as_pointers_sizes_as_int64_and_the_stream_as_given():
    sig = Signature("softmax_launch", "sym", SOFTMAX_PARAMS)
    x, y = torch.randn(4, 8), torch.empty(4, 8)
    assert sig.argtypes == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                            ctypes.c_void_p]
    assert marshal(sig, (x, y, 4, 8, 0, 0)) == [x.data_ptr(), y.data_ptr(), 4, 8, 0, 0]  # 0: the default stream
    assert marshal(sig, (x, y, 4, 8, 0, None), stream=lambda: 1234)[5] == 1234  # None: the current stream


@pytest.mark.parametrize("bad, why", [((1.5,), "expected an integer"), ((True,), "got a bool"),
                                      (("8",), "expected an integer")])
def test_wrong_arguments_are_refused_before_any_launch(bad, why):
    sig = Signature("softmax_launch", "sym", SOFTMAX_PARAMS)
    x = torch.randn(2, 2)
    with pytest.raises(LaunchError, match=why):
        marshal(sig, (x, x, 2) + bad + (0, 0))
    with pytest.raises(LaunchError, match="takes 6 arguments"):
        marshal(sig, (x, x, 2, 2, 0))
    with pytest.raises(LaunchError, match="expected a tensor"):
        marshal(sig, ("x", x, 2, 2, 0, 0))


def test_a_typed_pointer_takes_only_its_element_type():
    sig = Signature("ce_launch", "sym", ["void const*", "long const*", "float*", "int", "CUstream_st*"])
    logits, targets, losses = torch.randn(4, 8, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int64), torch.empty(4)
    assert len(marshal(sig, (logits, targets, losses, 2, None))) == 5  # void* takes any dtype
    with pytest.raises(LaunchError, match=r"argument 3 \(float\*\): expects torch.float32 data, got a torch.bfloat16"):
        marshal(sig, (logits, targets, losses.bfloat16(), 2, None))
    with pytest.raises(LaunchError, match="expects torch.int64 data"):
        marshal(sig, (logits, targets.int(), losses, 2, None))


def test_a_struct_by_value_is_named_and_refused():
    sig = Signature("attention_launch", "sym", ["void const*", "Shape", "int", "CUstream_st*"])
    assert not sig.callable_here
    with pytest.raises(LaunchError, match="pass a struct's fields"):
        marshal(sig, (torch.empty(1), object(), 0, None))


def test_a_call_with_a_cpu_tensor_is_refused_before_the_launch():
    with pytest.raises(LaunchError, match="argument 2 is a cpu tensor: a CUDA kernel needs tensors on a CUDA device"):
        cuda_launcher.launch_device("softmax_launch", (7, torch.empty(1)))
    assert cuda_launcher.launch_device("k_launch", (1, 2.0)) is None  # no tensor: nothing to check


def test_the_launch_monitor_counts_every_launch_library_call(monkeypatch):
    from harness.correctness import launches
    seen = []

    def dry_invoke(launcher, name, values):
        seen.append((name, monitor.paused))
    monkeypatch.setattr(cuda_launcher.Launcher, "invoke", dry_invoke)
    launcher = object.__new__(cuda_launcher.Launcher)
    launcher.__dict__.update(library=Path("x.so"), signatures={"softmax_launch": None})
    monitor = launches.LaunchMonitor()
    launches._wrap_invoke(monitor, cuda_launcher.Launcher)  # as install() does, once per process
    launcher.softmax_launch(1, 2)
    launcher.softmax_launch(3, 4)
    assert monitor.cuda_calls == 2 and seen == [("softmax_launch", True)] * 2  # paused: not the candidate's compute


def test_replacing_the_launch_check_is_seen_by_the_identity_guard(monkeypatch):
    from harness.isolation.tamper import IdentityGuard
    guard = IdentityGuard()
    monkeypatch.setattr(cuda_launcher.Launcher, "invoke", lambda *a: None)
    monkeypatch.setattr(cuda_launcher, "launch_device", lambda *a: None)
    assert {"harness.cuda_launcher.Launcher.invoke", "harness.cuda_launcher.launch_device"} <= set(guard.replaced())


def test_dtype_codes_match_the_device_header():
    assert [cuda_launcher.dtype_code(torch.empty(1, dtype=d)) for d in (torch.float32, torch.float16, torch.bfloat16)] \
        == [0, 1, 2]
    with pytest.raises(TypeError):
        cuda_launcher.dtype_code(torch.empty(1, dtype=torch.int32))


@pytest.mark.gpu
def test_the_softmax_starter_runs_through_the_launcher():
    starter = _starter("softmax")
    major, minor = torch.cuda.get_device_capability()
    lib = cuda_launcher.load_launcher(starter.CUDA_KERNELS, starter.CONFIG, f"sm_{major}{minor}")
    x = torch.randn(64, 1000, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    lib.softmax_launch(x, y, 64, 1000, cuda_launcher.dtype_code(x), None)
    torch.cuda.synchronize()
    assert torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=2e-3, rtol=2e-3)


@pytest.mark.gpu
def test_a_failed_launch_raises_with_cuda_s_message():
    starter = _starter("softmax")
    lib = cuda_launcher.load_launcher(starter.CUDA_KERNELS, {**starter.CONFIG, "THREADS": 2048})  # > 1024 per block
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(LaunchError, match="softmax_launch: the launch failed: .*configuration"):
        lib.softmax_launch(x, torch.empty_like(x), 4, 64, cuda_launcher.dtype_code(x), None)


@pytest.mark.gpu
def test_attention_s_scalar_parameters_reach_the_kernel_on_a_gpu():
    q = torch.randn(1, 2, 24, 32, device="cuda", dtype=torch.float16)
    got = _starter("flash_attention").kernel_fn(q, q, q, True)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), q.float(), q.float(), is_causal=True)
    assert torch.allclose(got.float(), want, atol=2e-3, rtol=2e-3)
