"""CUDA C++ kernels without a torch extension: CUDA_KERNELS built by nvcc alone into a small shared
library, its `*_launch` functions called through ctypes.

A torch extension (harness/cuda_build.py, load_inline) compiles the torch headers and pybind11 for
every candidate: 96-103 s each on a 16-core GPU machine. CUDA_KERNELS needs neither: it includes only
CUDA headers, and its launch functions take raw pointers, sizes, a dtype code and a stream. nvcc builds
it in about three seconds, and the host layer here is compiled once: ctypes, with each function's
parameter types read from the library's own symbols (nm, c++filt). A tensor goes in as its data
pointer, a size as int64, the stream as torch's current stream of the tensors' device. What a
CUDA_HOST did in torch C++ (checks, `.contiguous()`, the output's allocation) is the kernel file's
Python:

    from harness.cuda_launcher import dtype_code, load_launcher

    def kernel_fn(x):
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.numel() // x.shape[-1], x.shape[-1]
        load_launcher(CUDA_KERNELS, CONFIG).softmax_launch(x, y, rows, cols, dtype_code(x), None)
        return y

Each call checks that every tensor is a CUDA tensor on one device, launches on that device, and
raises `LaunchError` with CUDA's own message when the launch failed (cudaGetLastError, as
C10_CUDA_KERNEL_LAUNCH_CHECK does). A launch function must take only pointers, integers, floats,
bools and a cudaStream_t: a struct passed by value cannot be marshalled, so pass its fields.
"""
from __future__ import annotations

import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.cuda_build import (DEVICE_HEADER, NVCC_FLAGS, TORCH_NVCC_FLAGS, cache_root, kernels_source, nvcc_path,
                                write_headers)

SHARED_FLAGS = ("-shared", "-Xcompiler", "-fPIC")
POINTER = re.compile(r"^[\w\s:]+\*$")
SCALARS = {"long": ctypes.c_int64, "long long": ctypes.c_int64, "unsigned long": ctypes.c_uint64,
           "int": ctypes.c_int, "unsigned int": ctypes.c_uint, "float": ctypes.c_float,
           "double": ctypes.c_double, "bool": ctypes.c_bool}
STREAM = "CUstream_st*"  # what cudaStream_t demangles to
# A typed pointer parameter takes tensors of its element type only (`void*` takes any).
POINTEE_DTYPES = {"float": "torch.float32", "double": "torch.float64", "__half": "torch.float16",
                  "__nv_bfloat16": "torch.bfloat16", "long": "torch.int64", "int": "torch.int32",
                  "short": "torch.int16", "signed char": "torch.int8", "unsigned char": "torch.uint8",
                  "bool": "torch.bool"}
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}  # DTYPE_F32 / F16 / BF16 of autokernel_cuda.cuh
# Appended to every library: the launch check each call makes, in the library's own CUDA runtime
# (the one its launches went through).
ERROR_QUERY = r"""
#line 1 "autokernel_launch_check"
#include <cuda_runtime.h>
extern "C" int autokernel_last_error(void) { return (int)cudaGetLastError(); }
extern "C" const char* autokernel_error_string(int code) { return cudaGetErrorString((cudaError_t)code); }
"""
_LOADED: dict[tuple, "Launcher"] = {}
_LOCK = threading.Lock()


class LaunchBuildError(RuntimeError):
    """nvcc refused CUDA_KERNELS; the message holds its output."""


class LaunchError(RuntimeError):
    """A launch function was called wrongly, or CUDA reported the launch failed."""


def dtype_code(tensor) -> int:
    """The DTYPE_* code of autokernel_cuda.cuh for a tensor's dtype."""
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in DTYPE_CODES:
        raise TypeError(f"no CUDA kernel dtype code for {tensor.dtype}: float32, float16 or bfloat16")
    return DTYPE_CODES[name]


def library_name(source: str, arch: str, nvcc: str) -> str:
    flags = " ".join((*SHARED_FLAGS, *NVCC_FLAGS, *TORCH_NVCC_FLAGS, arch, nvcc))
    return hashlib.sha256(f"{flags}\n{DEVICE_HEADER}\n{source}".encode()).hexdigest()[:24] + ".so"


def build_library(cuda_kernels: str, config: dict | None, arch: str = "sm_90", timeout_s: float = 300.0) -> Path:
    """The shared library of CUDA_KERNELS (with CONFIG's macros) for `arch`, built once and cached.
    Concurrent builders of one library wait for each other: nvcc runs once."""
    from filelock import FileLock
    source = kernels_source(cuda_kernels, config) + ERROR_QUERY
    nvcc = nvcc_path()
    if nvcc is None:
        raise LaunchBuildError("nvcc was not found: install the CUDA toolkit or set CUDA_HOME")
    folder = cache_root() / "launch"
    target = folder / library_name(source, arch, nvcc)
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if target.is_file():
            return target
        with tempfile.TemporaryDirectory(prefix="autokernel_launch_") as tmp:
            src, out = Path(tmp, "kernels.cu"), Path(tmp, "kernels.so")
            src.write_text(source)
            include = write_headers(Path(tmp, "include"))
            cmd = [nvcc, f"-arch={arch}", *SHARED_FLAGS, *NVCC_FLAGS, *TORCH_NVCC_FLAGS, f"-I{include}", "-o", str(out),
                   str(src)]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, cwd=tmp)
            except subprocess.TimeoutExpired:
                raise LaunchBuildError(f"nvcc did not finish within {timeout_s:.0f} s") from None
            if done.returncode != 0 or not out.is_file():
                raise LaunchBuildError((done.stdout + done.stderr).replace(str(src), "kernels.cu")[-4000:])
            shutil.move(str(out), target.with_suffix(".tmp"))  # then a rename: readers never see half a file
            target.with_suffix(".tmp").replace(target)
    return target


@dataclass
class Signature:
    name: str
    symbol: str  # the mangled name in the library
    params: list[str]  # parameter types as c++filt writes them
    converters: list[Callable] = field(init=False, repr=False, compare=False)
    argtypes: list = field(init=False, repr=False, compare=False)  # what ctypes converts the values to

    def __post_init__(self):
        self.converters = [_converter(self.name, i, p) for i, p in enumerate(self.params)]
        self.argtypes = [SCALARS.get(p, ctypes.c_void_p) for p in self.params]

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
    """Every free C++ function the library defines, by name."""
    nm = shutil.which("nm")
    if nm is None:
        raise LaunchBuildError("nm was not found: install binutils (it reads the launch functions' types)")
    listing = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True,
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


def marshal(sig: Signature, values: tuple, stream: Callable[[], int] = lambda: 0) -> list:
    """The arguments of one call, checked, as ctypes takes them under `sig.argtypes`: a tensor as
    its data pointer, sizes as integers, a stream of None as `stream()`."""
    if len(values) != len(sig.params):
        raise LaunchError(f"{sig.name} takes {len(sig.params)} arguments ({', '.join(sig.params)}), "
                          f"got {len(values)}")
    return [convert(value, stream) for convert, value in zip(sig.converters, values)]


def _converter(name: str, index: int, kind: str) -> Callable:
    where = f"{name} argument {index + 1} ({kind})"
    if kind == STREAM:
        return lambda value, stream: stream() if value is None else _stream_handle(value, where)
    if POINTER.match(kind):
        expected = POINTEE_DTYPES.get(re.sub(r"\bconst\b|\*", "", kind).strip())
        return lambda value, stream: _pointer(value, where, expected)
    if kind in SCALARS:
        return lambda value, stream: _scalar(value, kind, where)

    def refuse(value, stream):
        raise LaunchError(f"{where}: no ctypes conversion for this parameter type; a launch function takes "
                          "pointers, integers, floats, bools and a cudaStream_t (pass a struct's fields)")
    return refuse


def _pointer(value: Any, where: str, expected: str | None = None) -> int:
    if hasattr(value, "data_ptr"):
        if expected is not None and str(value.dtype) != expected:
            raise LaunchError(f"{where}: expects {expected} data, got a {value.dtype} tensor")
        return int(value.data_ptr())
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise LaunchError(f"{where}: expected a tensor or an address, got {type(value).__name__}")


def _scalar(value: Any, kind: str, where: str):
    floating = kind in ("float", "double")
    if isinstance(value, bool) and kind != "bool":
        raise LaunchError(f"{where}: got a bool")
    if isinstance(value, int) or (floating and isinstance(value, float)):
        return value
    raise LaunchError(f"{where}: expected {'a number' if floating else 'an integer'}, got {type(value).__name__}")


def _stream_handle(value: Any, where: str) -> int:
    if hasattr(value, "cuda_stream"):
        return int(value.cuda_stream)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise LaunchError(f"{where}: expected None (torch's current stream), a torch.cuda.Stream or a handle, "
                      f"got {type(value).__name__}")


def launch_device(name: str, values: tuple):
    """The one CUDA device of a call's tensors; a CPU tensor or a second device is an error."""
    device = None
    for i, value in enumerate(values):
        if not hasattr(value, "data_ptr"):
            continue
        if value.device.type != "cuda":
            raise LaunchError(f"{name} argument {i + 1} is a {value.device.type} tensor: a CUDA kernel needs "
                              "tensors on a CUDA device")
        if device is not None and value.device != device:
            raise LaunchError(f"{name} argument {i + 1} is on {value.device}, an earlier one on {device}: "
                              "one launch runs on one device")
        device = value.device
    return device


class Launcher:
    """The library's launch functions as Python callables: `launcher.softmax_launch(...)`. Every call
    goes through `invoke`, where the judge's LaunchMonitor counts it."""

    def __init__(self, library: Path):
        self.library = library
        found = exported(library)
        # the `*_launch` convention of CUDA_KERNELS: other host symbols (stubs of __device__
        # helpers) are not entry points
        self.signatures = {n: s for n, s in found.items() if n.endswith("_launch")}
        self._dll = ctypes.CDLL(str(library), mode=ctypes.RTLD_LOCAL)
        self._functions: dict[str, Any] = {}
        self._last_error = self._dll.autokernel_last_error
        self._last_error.restype = ctypes.c_int
        self._error_string = self._dll.autokernel_error_string
        self._error_string.argtypes, self._error_string.restype = [ctypes.c_int], ctypes.c_char_p

    def __getattr__(self, name: str):
        sigs = self.__dict__.get("signatures", {})
        if name not in sigs:
            raise AttributeError(f"{name}: not a launch function of {self.library.name} (it has: "
                                 f"{', '.join(sorted(sigs)) or 'none'}; a launch function's name ends in _launch)")

        def call(*values):
            return self.invoke(name, values)
        call.__name__ = name
        self.__dict__[name] = call  # later lookups skip __getattr__
        return call

    def invoke(self, name: str, values: tuple) -> None:
        """Check, marshal and launch one call of `name`, then ask CUDA whether the launch failed."""
        import torch
        sig = self.signatures[name]
        device = launch_device(name, values)
        args = marshal(sig, values, lambda: int(torch.cuda.current_stream(device).cuda_stream))
        fn = self._functions.get(name)
        if fn is None:
            fn = self._functions[name] = getattr(self._dll, sig.symbol)
            fn.argtypes, fn.restype = sig.argtypes, None
        if device is not None and device.index is not None and device.index != torch.cuda.current_device():
            with torch.cuda.device(device):
                fn(*args)
        else:
            fn(*args)
        code = self._last_error()
        if code:
            raise LaunchError(f"{name}: the launch failed: {self._error_string(code).decode(errors='replace')}")


def default_arch() -> str:
    """The current GPU's architecture (sm_90 on an H100 or H200), else sm_90."""
    import torch
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return "sm_90"


def load_launcher(cuda_kernels: str, config: dict | None = None, arch: str | None = None) -> Launcher:
    """Build (once, cached on disk) and load (once per process) CUDA_KERNELS's launch library. A
    repeat call costs a dictionary lookup."""
    key = (cuda_kernels, tuple(sorted((config or {}).items())), arch)
    launcher = _LOADED.get(key)
    if launcher is None:
        path = build_library(cuda_kernels, config, arch or default_arch())
        with _LOCK:
            launcher = _LOADED.setdefault(key, Launcher(path))
    return launcher
