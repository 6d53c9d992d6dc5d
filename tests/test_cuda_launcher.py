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
from harness.cuda_build import nvcc_path
from harness.cuda_launcher import Signature, build_library, exported, marshal, parse_signature

ROOT = Path(__file__).resolve().parent.parent
NEEDS_NVCC = pytest.mark.skipif(nvcc_path() is None, reason="needs nvcc")
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


@NEEDS_NVCC
def test_a_starter_builds_without_torch_headers_and_is_cached(softmax_library):
    path, starter = softmax_library
    assert path.is_file() and path.suffix == ".so"
    again = build_library(starter.CUDA_KERNELS, starter.CONFIG, "sm_90")
    assert again == path  # the cached file: nvcc is not run twice for the same source
    other = build_library(starter.CUDA_KERNELS, {**starter.CONFIG, "THREADS": 128}, "sm_90")
    assert other != path  # another CONFIG is another build


@NEEDS_NVCC
def test_the_launch_function_and_its_parameter_types_are_read_from_the_library(softmax_library):
    path, _ = softmax_library
    found = exported(path)
    assert found["softmax_launch"].params == SOFTMAX_PARAMS and found["softmax_launch"].callable_here
    assert not found["block_merge"].callable_here  # a struct by value: not a launch function
    assert set(cuda_launcher.Launcher(path).signatures) == {"softmax_launch"}


@NEEDS_NVCC
def test_a_build_error_names_the_line_of_cuda_kernels(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOKERNEL_CACHE_DIR", str(tmp_path))
    with pytest.raises(cuda_launcher.LaunchBuildError, match="CUDA_KERNELS"):
        build_library("__global__ void k(float* x) { x[0] = undefined_name; }\n", None, "sm_90")


def test_signatures_are_parsed_and_templates_skipped():
    sig = parse_signature("_Z1fPKvl", "rmsnorm_launch(void const*, void*, long, float, int, CUstream_st*)")
    assert sig.name == "rmsnorm_launch" and sig.params[3] == "float"
    assert parse_signature("_Z1g", "launch<float>(void const*)") is None
    assert parse_signature("_Z1h", "void f<float>(std::vector<int, std::allocator<int> >)") is None
    assert parse_signature("_Z1i", "noargs()").params == []


def test_tensors_go_in_as_pointers_sizes_as_int64_and_the_stream_as_given():
    sig = Signature("softmax_launch", "sym", SOFTMAX_PARAMS)
    x, y = torch.randn(4, 8), torch.empty(4, 8)
    args = marshal(sig, (x, y, 4, 8, 0, 0))
    assert [type(a) for a in args] == [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                      ctypes.c_int, ctypes.c_void_p]
    assert args[0].value == x.data_ptr() and args[1].value == y.data_ptr() and args[3].value == 8
    assert args[5].value in (None, 0)  # the default stream


@pytest.mark.parametrize("bad, why", [((1.5,), "expected an integer"), ((True,), "got a bool"),
                                      (("8",), "expected an integer")])
def test_wrong_arguments_are_refused_before_any_launch(bad, why):
    sig = Signature("softmax_launch", "sym", SOFTMAX_PARAMS)
    x = torch.randn(2, 2)
    with pytest.raises(TypeError, match=why):
        marshal(sig, (x, x, 2) + bad + (0, 0))
    with pytest.raises(TypeError, match="takes 6 arguments"):
        marshal(sig, (x, x, 2, 2, 0))
    with pytest.raises(TypeError, match="expected a tensor"):
        marshal(sig, ("x", x, 2, 2, 0, 0))


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
