"""CUDA C++ text in a kernel file, held to the kernel allow-list's idea: the host side only launches.

A CUDA C++ kernel's host code receives device pointers and sizes; all it needs is to pick a
configuration and launch (`<<<...>>>`, AUTOKERNEL_DISPATCH, cudaFuncSetAttribute). It never needs
to copy device data to the host, map host memory, open files or run torch's compute on the host.
So, in every C++ string of the file (CUDA_KERNELS, CUDA_HOST, a ModelNew's load_inline sources):
- an `#include` names a header in INCLUDES;
- a CUDA runtime name (`cuda...`) is in CUDA_RUNTIME;
- a qualified name of torch, ATen, c10 or std is in QUALIFIED;
- in host code (outside __global__ and __device__ functions) a tensor method called is in
  HOST_METHODS.
The lists live here, beside the Python surface (harness/isolation/kernel_surface.py).
"""
from __future__ import annotations

import ast
import re

INCLUDES = frozenset({
    "autokernel_cuda.cuh", "autokernel_torch.h", "cuda_runtime.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h",
    "mma.h", "cuda_pipeline.h", "cuda/pipeline", "cuda/barrier", "cooperative_groups.h",
    "cooperative_groups/reduce.h", "cooperative_groups/memcpy_async.h", "cstdint", "stdint.h", "cfloat", "float.h",
    "cmath", "math.h", "climits", "limits.h", "limits", "type_traits", "algorithm", "utility", "cstddef",
    "torch/extension.h", "torch/types.h", "ATen/cuda/CUDAContext.h", "c10/cuda/CUDAGuard.h",
    "c10/cuda/CUDAStream.h", "c10/cuda/CUDAException.h"})
# launch configuration, the launch check and device facts; never memory copies, host or managed
# allocations, IPC, graphs or events
CUDA_RUNTIME = frozenset({
    "cudaStream_t", "cudaError_t", "cudaSuccess", "cudaGetLastError", "cudaPeekAtLastError", "cudaGetErrorString",
    "cudaFuncSetAttribute", "cudaFuncAttributeMaxDynamicSharedMemorySize", "cudaFuncAttributePreferredSharedMemoryCarveout",
    "cudaFuncGetAttributes", "cudaFuncAttributes", "cudaGetDevice", "cudaDeviceGetAttribute", "cudaDevAttrMultiProcessorCount",
    "cudaDevAttrMaxSharedMemoryPerBlockOptin", "cudaDevAttrComputeCapabilityMajor", "cudaDevAttrComputeCapabilityMinor",
    "cudaOccupancyMaxActiveBlocksPerMultiprocessor", "cudaOccupancyMaxPotentialBlockSize"})
QUALIFIED = frozenset({
    "torch::Tensor", "torch::empty", "torch::empty_like", "torch::zeros", "torch::zeros_like", "torch::TensorOptions",
    "torch::dtype", "torch::kFloat", "torch::kFloat32", "torch::kHalf", "torch::kFloat16", "torch::kBFloat16",
    "torch::kInt32", "torch::kInt64", "torch::kCUDA", "torch::ScalarType", "at::Tensor", "at::ScalarType",
    "at::cuda::getCurrentCUDAStream", "at::Half", "at::BFloat16", "at::kFloat", "at::kHalf", "at::kBFloat16",
    "c10::Half", "c10::BFloat16", "c10::cuda::CUDAGuard", "at::cuda::CUDAGuard",
    "std::min", "std::max", "std::numeric_limits", "std::is_same", "std::is_same_v", "std::conditional",
    "std::conditional_t", "std::enable_if_t", "std::size_t", "std::int64_t", "std::int32_t", "std::uint32_t",
    "std::abs", "std::sqrt", "std::exp", "std::swap", "std::vector", "std::string", "std::to_string"})
HOST_METHODS = frozenset({"data_ptr", "numel", "size", "sizes", "stride", "strides", "dim", "contiguous", "options",
                          "scalar_type", "dtype", "device", "is_cuda", "is_contiguous", "stream", "view", "reshape",
                          "empty_like", "element_size"})
_KEYWORDS = frozenset({"if", "for", "while", "switch", "return", "sizeof", "catch", "alignof", "decltype"})
_DEFINITION = re.compile(r"\b([A-Za-z_]\w*)\s*\(([^;{}()]|\([^()]*\))*\)\s*(?:const\s*)?\{")
_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')


def looks_like_cpp(text: str) -> bool:
    return "#include" in text or "__global__" in text or "torch::" in text or "<<<" in text


def functions_defined(text: str) -> set[str]:
    """Names of the C++ functions a string defines (a launcher's or an extension's methods)."""
    if not looks_like_cpp(text):
        return set()
    return {m.group(1) for m in _DEFINITION.finditer(_blank(text))} - _KEYWORDS


def _blank(text: str) -> str:
    """Comments and string literals blanked, newlines kept (line numbers stay)."""
    def keep_lines(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))
    return _STRING.sub(keep_lines, _COMMENT.sub(keep_lines, text))


def host_spans(code: str) -> list[tuple[int, int]]:
    """(start, end) of each top-level brace block that is not a __global__ or __device__ function."""
    spans, depth, start, head = [], 0, 0, 0
    for i, ch in enumerate(code):
        if ch == "{":
            if depth == 0:
                start = i
                declaration = code[head:i]
                device = ("__global__" in declaration or "__device__" in declaration) and "__host__" not in declaration
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                if not device:
                    spans.append((start, i))
                head = i + 1
        elif ch == ";" and depth == 0:
            head = i + 1
    return spans


def check_text(text: str) -> list[tuple[int, str]]:
    """(line within text, why) for each thing the host side may not do."""
    found = []
    for m in re.finditer(r"^\s*#\s*include\s*[<\"]([^>\"]+)[>\"]", text, re.M):
        if m.group(1) not in INCLUDES:
            found.append((text.count("\n", 0, m.start()) + 1, f"#include <{m.group(1)}> is not a header a kernel uses "
                                                                f"(allowed: {', '.join(sorted(INCLUDES))})"))
    code = _blank(text)
    for m in re.finditer(r"\bcuda[A-Z]\w*", code):
        if m.group(0) not in CUDA_RUNTIME:
            found.append((code.count("\n", 0, m.start()) + 1, f"{m.group(0)}: the host side only launches (no copies, "
                                                                "host or managed memory, streams or events of its own)"))
    for m in re.finditer(r"\b(?:torch|at|c10|std)(?:::\w+)+", code):
        if m.group(0) not in QUALIFIED:
            found.append((code.count("\n", 0, m.start()) + 1, f"{m.group(0)} is not among what a CUDA kernel's host "
                                                                "side uses (allocation, sizes, the stream)"))
    for start, end in host_spans(code):
        for m in re.finditer(r"(?:\.|->)\s*([A-Za-z_]\w*)\s*(?:<[^<>;]*>\s*)?\(", code[start:end]):
            if m.group(1) not in HOST_METHODS:
                line = code.count("\n", 0, start + m.start()) + 1
                found.append((line, f".{m.group(1)}() on the host side: it may only launch (no reads of a tensor's "
                                    "values, no torch compute)"))
        for m in re.finditer(r"\basm\b", code[start:end]):
            found.append((code.count("\n", 0, start + m.start()) + 1, "inline asm on the host side"))
    return found


def check_file(tree: ast.Module, backend: str, model: bool) -> list[tuple[int, str]]:
    """(line in the file, why) for the C++ strings of a CUDA kernel file or a ModelNew."""
    if backend != "cuda" and not model:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and looks_like_cpp(node.value):
            found += [(node.lineno + line - 1, why) for line, why in check_text(node.value)]
    return found
