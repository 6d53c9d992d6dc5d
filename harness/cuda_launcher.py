"""CUDA C++ kernels without a torch extension: CUDA_KERNELS built by nvcc alone into a small shared
library, its host launch functions called through ctypes.

A torch extension (harness/cuda_build.py, load_inline) compiles the torch headers and pybind11 for
every candidate: 96-103 s each on a 16-core GPU machine. CUDA_KERNELS needs neither: it includes only
autokernel_cuda.cuh, and its `*_launch` functions take raw pointers, sizes, a dtype code and a
stream. nvcc builds it in a few seconds (5.8 s for the softmax starter on a busy 2-core machine), and
the host layer here is compiled once: ctypes, with each function's parameter types read from the
library's own symbols (nm, c++filt), so a tensor goes in as its data pointer, a size as int64, the
stream as the current torch stream (a struct passed by value, as flash attention's Shape, is not
marshalled yet). What CUDA_HOST did in torch C++ (checks, the output's
allocation, rows and columns) is then the caller's Python.

    lib = load_launcher(CUDA_KERNELS, CONFIG, arch="sm_90")
    lib.softmax_launch(x, y, rows, cols, dtype_code(x), None)   # None: torch's current stream
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.cuda_build import NVCC_FLAGS, TORCH_NVCC_FLAGS, cache_root, kernels_source, nvcc_path, write_headers

SHARED_FLAGS = ("-shared", "-Xcompiler", "-fPIC")
POINTER = re.compile(r"^[\w\s:]+\*$")
SCALARS = {"long": ctypes.c_int64, "long long": ctypes.c_int64, "unsigned long": ctypes.c_uint64,
           "int": ctypes.c_int, "unsigned int": ctypes.c_uint, "float": ctypes.c_float,
           "double": ctypes.c_double, "bool": ctypes.c_bool}
STREAM = "CUstream_st*"  # what cudaStream_t demangles to
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}  # DTYPE_F32 / F16 / BF16 of autokernel_cuda.cuh
_LOADED: dict[str, "Launcher"] = {}
_LOCK = threading.Lock()


class LaunchBuildError(RuntimeError):
    """nvcc refused CUDA_KERNELS; the message holds its output."""


def dtype_code(tensor) -> int:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPE_CODES:
        raise TypeError(f"no CUDA kernel dtype code for {tensor.dtype}: float32, float16 or bfloat16")
    return DTYPE_CODES[name]


def library_name(source: str, arch: str) -> str:
    flags = " ".join((*SHARED_FLAGS, *NVCC_FLAGS, *TORCH_NVCC_FLAGS, arch))
    return hashlib.sha256(f"{flags}\n{source}".encode()).hexdigest()[:24] + ".so"


def build_library(cuda_kernels: str, config: dict | None, arch: str = "sm_90", timeout_s: float = 300.0) -> Path:
    """The shared library of CUDA_KERNELS (with CONFIG's macros) for `arch`, built once and cached."""
    source = kernels_source(cuda_kernels, config)
    folder = cache_root() / "launch"
    target = folder / library_name(source, arch)
    if target.is_file():
        return target
    nvcc = nvcc_path()
    if nvcc is None:
        raise LaunchBuildError("nvcc was not found: install the CUDA toolkit or set CUDA_HOME")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="autokernel_launch_") as tmp:
        src, out = Path(tmp, "kernels.cu"), Path(tmp, "kernels.so")
        src.write_text(source)
        include = write_headers(Path(tmp, "include"))
        cmd = [nvcc, f"-arch={arch}", *SHARED_FLAGS, *NVCC_FLAGS, *TORCH_NVCC_FLAGS, f"-I{include}", "-o", str(out), str(src)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
        if done.returncode != 0 or not out.is_file():
            raise LaunchBuildError((done.stdout + done.stderr).replace(str(src), "kernels.cu")[-4000:])
        shutil.move(str(out), target.with_suffix(".tmp"))  # a rename: readers never see half a file
        target.with_suffix(".tmp").replace(target)
    return target


@dataclass
class Signature:
    name: str
    symbol: str  # the mangled name in the library
    params: list[str]  # parameter types as c++filt writes them

    @property
    def callable_here(self) -> bool:
        return all(p == STREAM or p in SCALARS or POINTER.match(p) for p in self.params)


def parse_signature(symbol: str, demangled: str) -> Signature | None:
    """`softmax_launch(void const*, void*, long, long, int, CUstream_st*)` -> Signature; None for a
    template, a method or an operator (not a launch function)."""
    match = re.fullmatch(r"([A-Za-z_]\w*)\((.*)\)", demangled.strip())
    if not match or "<" in match.group(2):
        return None
    params = [p.strip() for p in match.group(2).split(",")] if match.group(2).strip() else []
    return Signature(match.group(1), symbol, params)


def exported(library: Path) -> dict[str, Signature]:
    """Every free function the library defines, by name."""
    listing = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True,
                             check=True).stdout
    symbols = [line.split()[-1] for line in listing.splitlines() if line.split()[1:2] == ["T"]]
    filt = shutil.which("c++filt")
    readable = subprocess.run([filt], input="\n".join(symbols), capture_output=True, text=True).stdout.splitlines() \
        if filt and symbols else symbols
    found = {}
    for symbol, text in zip(symbols, readable):
        sig = parse_signature(symbol, text)
        if sig is not None:
            found[sig.name] = sig
    return found


def marshal(sig: Signature, values: tuple) -> list:
    """The ctypes arguments for one call: a tensor as its data pointer, sizes checked as integers."""
    if len(values) != len(sig.params):
        raise TypeError(f"{sig.name} takes {len(sig.params)} arguments ({', '.join(sig.params)}), got {len(values)}")
    out = []
    for i, (kind, value) in enumerate(zip(sig.params, values)):
        where = f"{sig.name} argument {i + 1} ({kind})"
        if kind == STREAM:
            out.append(ctypes.c_void_p(_stream_handle(value)))
        elif POINTER.match(kind):
            out.append(ctypes.c_void_p(_pointer(value, where)))
        elif kind in SCALARS:
            out.append(SCALARS[kind](_scalar(value, kind, where)))
        else:
            raise TypeError(f"{where}: no ctypes conversion for this parameter type")
    return out


def _pointer(value: Any, where: str) -> int:
    if hasattr(value, "data_ptr"):
        return int(value.data_ptr())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"{where}: expected a tensor or an address, got {type(value).__name__}")


def _scalar(value: Any, kind: str, where: str):
    floating = kind in ("float", "double")
    if isinstance(value, bool) and kind != "bool":
        raise TypeError(f"{where}: got a bool")
    if isinstance(value, int) or (floating and isinstance(value, float)):
        return value
    raise TypeError(f"{where}: expected {'a number' if floating else 'an integer'}, got {type(value).__name__}")


def _stream_handle(value: Any) -> int:
    """None: torch's current CUDA stream (what at::cuda::getCurrentCUDAStream gave CUDA_HOST)."""
    if value is None:
        import torch
        return int(torch.cuda.current_stream().cuda_stream)
    if hasattr(value, "cuda_stream"):
        return int(value.cuda_stream)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"stream: expected None, a torch.cuda.Stream or a handle, got {type(value).__name__}")


class Launcher:
    """The library's launch functions as Python callables."""

    def __init__(self, library: Path):
        self.library = library
        # the `*_launch` convention of CUDA_KERNELS: other host symbols (stubs of __device__
        # helpers) are not entry points
        self.signatures = {n: s for n, s in exported(library).items() if s.callable_here and n.endswith("_launch")}
        self._dll = ctypes.CDLL(str(library), mode=ctypes.RTLD_LOCAL)

    def __getattr__(self, name: str):
        sigs = self.__dict__.get("signatures", {})
        if name not in sigs:
            raise AttributeError(f"{name}: not a launch function of {self.library.name} "
                                 f"(it has: {', '.join(sorted(sigs)) or 'none'})")
        sig = sigs[name]
        fn = getattr(self._dll, sig.symbol)
        fn.restype = None

        def call(*values):
            fn(*marshal(sig, values))
        call.__name__ = name
        return call


def load_launcher(cuda_kernels: str, config: dict | None = None, arch: str = "sm_90") -> Launcher:
    """Build (once, cached on disk) and load (once per process) CUDA_KERNELS's launch library."""
    path = build_library(cuda_kernels, config, arch)
    with _LOCK:
        if str(path) not in _LOADED:
            _LOADED[str(path)] = Launcher(path)
        return _LOADED[str(path)]
