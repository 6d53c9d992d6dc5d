"""Compile for the target GPU without one: registers, spills and shared memory per kernel.

The judge's `compile` stage calls `compile_triton` with the launches it recorded while running the
candidate once (under the Triton interpreter on a CPU machine), or `compile_cuda` with the imported
CUDA C++ kernel file. Either way every kernel is compiled ahead of time for the target architecture
(`sm_90` by default), and the cubin says what the kernel would cost on that GPU: registers per
thread, spill traffic, shared memory per block. A kernel that does not compile for the target fails
with the compiler's own message; one that needs more shared memory than the target allows per block
fails with the limit named, since it would fail to launch there.

Triton's launch-time specialization, and the switch from the interpreter to the compiler, are in
harness/compiling/triton_specialization.py.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import cuda_build
from harness.cuda_build import parse_arch
from harness.compiling import ir_rules
from harness.compiling.triton_specialization import compiled_mode, is_autotuned, specialize

# Opt-in maximum shared memory per thread block, in bytes, by compute capability: the row "Maximum
# amount of shared memory per thread block" of the CUDA C++ Programming Guide's table "Technical
# Specifications per Compute Capability". A kernel gets more than 48 KiB only as dynamic shared
# memory after cudaFuncSetAttribute(MaxDynamicSharedMemorySize), which Triton's launcher does itself.
MAX_SHARED_BYTES = {70: 96 * 1024, 72: 96 * 1024, 75: 64 * 1024, 80: 163 * 1024, 86: 99 * 1024,
                    87: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024,
                    103: 227 * 1024, 120: 99 * 1024, 121: 99 * 1024}
# Statically declared __shared__ arrays: 48 KiB per block on every architecture; at most 1024
# threads per block and 64 Ki 32-bit registers per block from compute capability 5.0 on (same table).
MAX_STATIC_SHARED_BYTES = 48 * 1024
MAX_THREADS_PER_BLOCK = 1024
MAX_REGISTERS_PER_BLOCK = 64 * 1024
# Spill stores + loads (bytes per thread, as ptxas counts them) above which a kernel is reported as
# spilling heavily: 64 fp32 values' worth. A few spilled bytes sit in L1 and cost little; beyond
# this the local-memory traffic competes with the kernel's own loads, and the fix (smaller tiles,
# fewer values held per thread) is usually worth trying.
HEAVY_SPILL_BYTES = 256
_DETAIL_TAIL_CHARS = 4000
_NVCC_TIMEOUT_S = 180.0
_CACHE: dict[tuple, Any] = {}  # per process: (what was compiled, options, arch) -> result


@dataclass
class KernelResources:
    name: str
    registers: int
    spills: int  # bytes of spill stores + spill loads per thread
    shared_bytes: int  # per block: static + dynamic as far as the compiler knows
    hash: str = ""  # sha256 of the kernel's compiled code (a prefix): "different compiled code"
    config: str = ""  # what was specialized: constexprs and launch options
    threads: int = 0  # per block when the compiler fixes it (Triton: 32 * num_warps); 0 unknown
    # why it would compute wrong or not launch on a GPU while the interpreter runs it right
    # (harness/compiling/ir_rules.py): never pruned as an autotune config, whatever else compiles
    gpu_problems: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return {k: v for k, v in out.items() if v or k in ("registers", "spills", "shared_bytes")}


@dataclass
class TargetCompile:
    ok: bool
    detail: str  # on failure the compiler's message (tail); on success a one-line summary
    resources: dict | None = None
    kernels: list[KernelResources] = field(default_factory=list)



def shared_limit(cc: int) -> int | None:
    """The per-block shared-memory ceiling of a compute capability; for one the table lacks, that of
    the closest earlier one in the same major version (None when there is none)."""
    known = [k for k in MAX_SHARED_BYTES if k <= cc and k // 10 == cc // 10]
    return MAX_SHARED_BYTES[max(known)] if known else None


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _DETAIL_TAIL_CHARS else "..." + text[-_DETAIL_TAIL_CHARS:]


def _kib(n: int) -> str:
    return f"{n / 1024:g} KiB"


def _launch_problem(k: KernelResources, cc: int) -> str | None:
    """Why this kernel would fail to launch on sm_`cc`, in words; None when it would launch."""
    label = f"{k.name}{f' [{k.config}]' if k.config else ''}"
    limit = shared_limit(cc)
    if limit is not None and k.shared_bytes > limit:
        return (f"{label} needs {k.shared_bytes} B ({_kib(k.shared_bytes)}) of shared memory per block; "
                f"sm_{cc} allows at most {limit} B ({_kib(limit)}) per block, so it would fail to launch "
                "there: use smaller blocks or fewer pipeline stages")
    if k.threads > MAX_THREADS_PER_BLOCK:
        return (f"{label} runs {k.threads} threads per block; CUDA allows at most {MAX_THREADS_PER_BLOCK} "
                "(num_warps <= 32)")
    if k.threads and k.registers * k.threads > MAX_REGISTERS_PER_BLOCK:
        return (f"{label} needs {k.registers} registers x {k.threads} threads per block, more than the "
                f"{MAX_REGISTERS_PER_BLOCK} a block may hold: use fewer warps or smaller blocks")
    return None


def summarize(kernels: list[KernelResources], cc: int, seconds: float, what: str) -> TargetCompile:
    """Check the per-block launch limits and turn per-kernel figures into the stage result."""
    arch = f"sm_{cc}"
    limit = shared_limit(cc)
    for k in kernels:
        problem = _launch_problem(k, cc)
        if problem:
            return TargetCompile(False, problem, None, kernels)
    resources = {"arch": arch, "registers": max((k.registers for k in kernels), default=0),
                 "spills": sum(k.spills for k in kernels),
                 "shared_bytes": max((k.shared_bytes for k in kernels), default=0),
                 "kernels": [k.to_json() for k in kernels]}
    spilling = [k for k in kernels if k.spills]
    spill_note = "no spills"
    if spilling:
        worst = max(spilling, key=lambda k: k.spills)
        heavy = "heavy spills" if worst.spills > HEAVY_SPILL_BYTES else "spills"
        spill_note = (f"{heavy}: {worst.name} spills {worst.spills} B (stores + loads)"
                      f"{f' (over {HEAVY_SPILL_BYTES} B)' if worst.spills > HEAVY_SPILL_BYTES else ''}")
    limit_note = f" of {limit} B" if limit else ""
    detail = (f"{len(kernels)} {what} compiled for {arch} in {seconds:.1f} s: up to "
              f"{resources['registers']} registers, {resources['shared_bytes']} B shared{limit_note}, "
              f"{spill_note}")
    return TargetCompile(True, detail, resources, kernels)


# ------------------------------------------------------------------ CUDA C++
def _cuda_failure(log: str, cc: int) -> str:
    hints = []
    if "too much shared data" in log:
        hints.append(f"statically declared __shared__ arrays are limited to {MAX_STATIC_SHARED_BYTES} B "
                     f"({_kib(MAX_STATIC_SHARED_BYTES)}) per block on every GPU; larger tiles need "
                     "dynamic shared memory (extern __shared__ and cudaFuncSetAttribute in the "
                     f"launcher), up to {shared_limit(cc)} B on sm_{cc}")
    if re.search(r"(torch|ATen|c10)/\S+\.h", log) and re.search(r"cannot open source file|No such file", log):
        hints.append("CUDA_KERNELS must not include torch headers: host code that uses torch "
                     "belongs in kernel_fn's Python (harness.cuda_launcher) or in CUDA_HOST")
    hint = "".join(f"\nhint: {h}" for h in hints)
    return f"nvcc could not compile CUDA_KERNELS for sm_{cc}:\n{_tail(log)}{hint}"


def compile_cuda(module, arch: str = "sm_90") -> TargetCompile:
    """Compile a CUDA C++ kernel file's CUDA_KERNELS (with its CONFIG macros) for `arch` with nvcc,
    exactly the text load_cuda builds, and report ptxas's figures per kernel."""
    cc = parse_arch(arch)
    kernels_text = getattr(module, "CUDA_KERNELS", None)
    if not isinstance(kernels_text, str) or not kernels_text.strip():
        return TargetCompile(False, "a CUDA kernel file needs CUDA_KERNELS, a string of CUDA C++ "
                                    "source (see harness/cuda_build.py for the contract)")
    try:
        source = cuda_build.kernels_source(kernels_text, getattr(module, "CONFIG", None))
    except ValueError as e:
        return TargetCompile(False, str(e))
    nvcc = cuda_build.nvcc_path()
    if nvcc is None:
        return TargetCompile(False, "nvcc not found: install the CUDA toolkit or put its bin folder "
                                    "on PATH (or set CUDA_HOME)")
    key = ("cuda", hashlib.sha256(source.encode()).hexdigest(), nvcc, cc)
    if key not in _CACHE:
        _CACHE[key] = _compile_cuda_source(nvcc, source, cc)
    return copy.deepcopy(_CACHE[key])  # a caller may annotate its resources: the cache stays as compiled


def _compile_cuda_source(nvcc: str, source: str, cc: int) -> TargetCompile:
    started = time.perf_counter()
    try:
        log, cubin = cuda_build.run_nvcc(nvcc, source, cc, _NVCC_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return TargetCompile(False, f"nvcc did not finish compiling for sm_{cc} within {_NVCC_TIMEOUT_S:.0f} s")
    if cubin is None:
        return TargetCompile(False, _cuda_failure(log, cc))
    figures = cuda_build.parse_ptxas_log(log)
    if not figures:
        return TargetCompile(False, f"CUDA_KERNELS compiled for sm_{cc} but defines no __global__ "
                                    "kernel: nothing would run on the GPU")
    names = cuda_build.demangle(sorted(figures))
    kernels = [KernelResources(names[n], f["registers"], f["spills"], f["shared_bytes"])
               for n, f in sorted(figures.items())]
    result = summarize(kernels, cc, time.perf_counter() - started, "CUDA kernel(s)")
    if result.resources is not None:
        result.resources["code_hash"] = cuda_build.code_hash(cubin)
    return result


# ------------------------------------------------------------------ Triton
def compile_triton(records: list, arch: str = "sm_90") -> TargetCompile:
    """Compile every distinct specialization among the recorded Triton launches (LaunchRecord) for
    `arch`: the argument dtypes, alignments, integer specializations and constexprs Triton would see
    on the GPU, with the launch's num_warps / num_stages."""
    cc = parse_arch(arch)
    started = time.perf_counter()
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
    except ImportError as e:
        return TargetCompile(False, f"Triton cannot compile for a GPU target here: {e}")
    target = GPUTarget("cuda", cc, 32)
    backend = make_backend(target)
    compiled: dict[tuple, tuple[Any, KernelResources | str]] = {}  # specialization -> (fn, result)
    with compiled_mode(records), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Triton's deprecation notices are not the candidate's
        for record in records:
            try:
                src, options = specialize(record, backend)
            except Exception as e:  # an argument Triton cannot type, or Triton internals moved
                return TargetCompile(False, f"cannot specialize the launch of {record.name} for "
                                            f"sm_{cc}: {type(e).__name__}: {e}")
            try:
                key = ("triton", src.hash(), repr(sorted(options.__dict__.items())), cc)
            except Exception as e:
                if not rejected_source(e):
                    raise  # ours: the caller reports it as a fault of the compile-for-target support
                return TargetCompile(False, f"{record.name} does not compile for sm_{cc}: Triton rejects its "
                                            f"source: {type(e).__name__}: {e}")
            if key not in _CACHE:
                _CACHE[key] = _compile_specialization(src, options, target, _config_label(record, options))
            compiled[key] = (record.fn, _CACHE[key])
    wrong = [p for _, r in compiled.values() if isinstance(r, KernelResources) for p in r.gpu_problems]
    if wrong:
        return TargetCompile(False, _gpu_problems_detail(wrong, cc))
    kernels, pruned = _prune_autotune_configs(list(compiled.values()), cc)
    failed = next((r for _, r in compiled.values() if isinstance(r, str) and r not in pruned), None)
    if failed:
        return TargetCompile(False, failed)
    result = summarize(kernels, cc, time.perf_counter() - started, "Triton kernel(s)")
    if result.ok and pruned:
        result.detail += (f"; {len(pruned)} autotune config(s) would not run on sm_{cc} and are left out, "
                          "as Triton's autotuner does")
    return result


def lower_triton(records: list, arch: str = "sm_90") -> TargetCompile:
    """Take every distinct specialization among `records` through Triton's compiler for `arch` as
    far as its GPU passes (the front end, TTIR, TTGIR), where a construct only the interpreter
    accepts is refused: a tenth of a second each, where the full compile (LLVM, ptxas) of one
    64K-wide block takes most of a minute on a CPU. No resources: the first call's launches are the
    ones compiled in full (compile_triton); each specialization is lowered once per process."""
    cc = parse_arch(arch)
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    target = GPUTarget("cuda", cc, 32)
    backend = make_backend(target)
    with compiled_mode(records), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for record in records:
            label = record.name
            try:
                src, options = specialize(record, backend)
                label = f"{record.name} [{_config_label(record, options)}]"
                key = ("lowered", src.hash(), repr(sorted(options.__dict__.items())), cc)
                if key not in _CACHE:
                    context = ir.context()
                    ir.load_dialects(context)
                    backend.load_dialects(context)
                    stages: dict = {}
                    backend.add_stages(stages, options, src.language)
                    module = src.make_ir(target, options, backend.get_codegen_implementation(options),
                                         backend.get_module_map(), context)
                    metadata = {"hash": src.hash(), "target": target, **options.__dict__}
                    with _captured_stderr():
                        module = stages["ttir"](module, metadata)
                        wrong = ir_rules.problems(str(module), label)
                        if not wrong:
                            module = stages["ttgir"](module, metadata)
                    _CACHE[key] = _gpu_problems_detail(wrong, cc) if wrong else None
                if _CACHE[key] is not None:
                    return TargetCompile(False, _CACHE[key])
            except Exception as e:
                if not rejected_source(e) and type(e).__name__ not in ("UnsupportedLanguageConstruct", "RuntimeError"):
                    raise  # ours: the caller reports it as a fault of the compile-for-target support
                return TargetCompile(False, f"{label} does not compile for sm_{cc}:\n{_tail(f'{type(e).__name__}: {e}')}")
    return TargetCompile(True, f"{len(records)} Triton specialization(s) lowered for sm_{cc}")


def _gpu_problems_detail(problems: list[str], cc: int) -> str:
    return (f"compiled for sm_{cc}, it would not run as the interpreter ran it:\n"
            + "\n".join(f"- {p}" for p in dict.fromkeys(problems)))


def rejected_source(e: BaseException) -> bool:
    """Whether Triton's front end rejected the kernel's source (the candidate's fault), told from a
    fault of this module's use of Triton by where it was raised: a CompilationError, or an error
    raised inside triton/runtime/jit.py's analysis of the source (its DependenciesFinder walking
    the kernel's code: "Unsupported function referenced" for a plain Python helper, a global it
    cannot hash), the innermost frame being Triton's own, not this module's or Python's."""
    try:
        from triton.compiler.errors import CompilationError
    except ImportError:
        CompilationError = ()  # noqa: N806
    if CompilationError and isinstance(e, CompilationError):
        return True
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return False
    code = tb.tb_frame.f_code
    qualname = getattr(code, "co_qualname", code.co_name)
    return (code.co_filename.replace(os.sep, "/").endswith("triton/runtime/jit.py")
            and qualname.startswith("DependenciesFinder."))


def _prune_autotune_configs(results: list[tuple[Any, KernelResources | str]], cc: int):
    """(kernels, pruned): an @triton.autotune kernel's configs that do not compile or would not
    launch on the target are dropped, as the autotuner drops them on the GPU, as long as one of
    its configs remains; any other kernel keeps every specialization (and fails on any)."""
    kernels, pruned = [], []
    for fn in dict.fromkeys(fn for fn, _ in results):
        mine = [r for f, r in results if f is fn]
        usable = [r for r in mine if isinstance(r, KernelResources) and _launch_problem(r, cc) is None]
        if usable and is_autotuned(fn):
            kernels += usable
            pruned += [r if isinstance(r, str) else _launch_problem(r, cc) for r in mine if r not in usable]
        else:
            kernels += [r for r in mine if isinstance(r, KernelResources)]
    return kernels, pruned


def _config_label(record, options) -> str:
    parts = [f"{k}={record.args[k]!r}" for k in record.constexprs if k in record.args]
    parts += [f"num_warps={options.num_warps}", f"num_stages={options.num_stages}"]
    return ", ".join(parts)


@contextmanager
def _captured_stderr():
    """The process's fd 2 into a buffer: MLIR and ptxas diagnostics are printed there, not raised."""
    captured = {"text": ""}
    with tempfile.TemporaryFile() as buffer:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(buffer.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            buffer.seek(0)
            captured["text"] = buffer.read().decode(errors="replace")


def _compile_specialization(src, options, target, config: str) -> KernelResources | str:
    """The compiled kernel's resources, or the compiler's message when it does not compile."""
    import triton
    error = None
    with _captured_stderr() as stderr:
        try:
            kernel = triton.compile(src, target=target, options=options.__dict__)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
    if error is not None:
        return (f"{src.name} [{config}] does not compile for sm_{target.arch}:\n"
                f"{_tail(error + chr(10) + stderr['text'])}")
    resources = _triton_resources(kernel, target.arch, config)
    resources.gpu_problems = tuple(ir_rules.problems(kernel.asm.get("ttir", ""), f"{src.name} [{config}]",
                                                     int(getattr(kernel.metadata, "global_scratch_size", 0) or 0)))
    return resources


def _triton_resources(kernel, cc: int, config: str) -> KernelResources:
    """Registers and static shared memory from cuobjdump; Triton's dynamic shared memory from its
    metadata; spill bytes from ptxas -v on the PTX, run only when the kernel has a stack frame or
    local memory at all (spills live there: none, no spills)."""
    import triton
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    cubin = kernel.asm["cubin"]
    name = kernel.metadata.name
    with tempfile.TemporaryDirectory(prefix="autokernel_triton_") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        dump = subprocess.run([triton.knobs.nvidia.cuobjdump.path, "--dump-resource-usage", str(path)],
                              capture_output=True, text=True, timeout=60).stdout
        usage = cuda_build.parse_resource_usage(dump)
        u = usage.get(name) or next(iter(usage.values()), {"registers": 0, "stack": 0, "shared": 0, "local": 0})
        spills = 0
        if u["stack"] or u["local"]:
            ptx = Path(tmp) / "kernel.ptx"
            ptx.write_text(kernel.asm["ptx"])
            done = subprocess.run([get_ptxas(cc).path, "-v", f"--gpu-name={sm_arch_from_capability(cc)}",
                                   str(ptx), "-o", str(Path(tmp) / "again.cubin")],
                                  capture_output=True, text=True, timeout=_NVCC_TIMEOUT_S)
            spills = sum(f["spills"] for f in cuda_build.parse_ptxas_log(done.stdout + done.stderr).values())
    shared = max(int(kernel.metadata.shared or 0), u["shared"])
    threads = 32 * int(kernel.metadata.num_warps)
    return KernelResources(name, u["registers"], spills, shared, cuda_build.code_hash(cubin), config, threads)
