"""Judged kernels for one model, bound into the unmodified model while `patch(model)` lasts.

Written by `autokernel export` (this file is its package's __init__.py, copied verbatim; inside
autokernel itself it has no manifest and so no kernels). Needs torch and triton only:

    import torch
    import autokernel_kernels

    with torch.inference_mode(), autokernel_kernels.patch(model) as router:
        out = model(x)                   # calls inside a kernel's serving range run the kernel
        compiled = torch.compile(model, dynamic=True)  # after one eager forward: the kernels stay,
                                                       # as custom ops, across sequence lengths
    router.tally.to_json()               # per kernel: calls served, fallbacks and why
    with autokernel_kernels.patch(model):
        loss_fn(model(x)).backward()     # training: a kernel whose backward the judge passed
                                         # ("backward" in KERNELS) serves as a differentiable custom
                                         # op; a forward-only kernel's calls fall back, counted
    autokernel_kernels.KERNELS           # target, kernel type, backend, dims, dtype, source file of each
    autokernel_kernels.selftest()        # each kernel against PyTorch at its target shape
    autokernel_kernels.UNAVAILABLE       # target -> why this machine cannot run it (after loading)

`patch` replaces only what the kernels serve (the recorded modules' forwards, the functions they
call, the torch functions of a kernel's type while a recorded module runs), each behind a cheap
check that falls back to the original; on exit everything is put back. A kernel serves every call
inside its serving range (manifest.json's "serving", decided by routing/serving.py): the rows,
batch and sequence lengths the judge proved it at, and on a GPU only where it was measured not
slower; any other call falls back and is counted with the reason. Without a GPU, set
TRITON_INTERPRET=1 before importing it (the kernels then run in the Triton interpreter: correct,
and slow). The routing package is the one `autokernel verify` used, copied file for file, so the
calls served here are the calls that were verified.

A CUDA C++ kernel (backend "cuda") also needs, where it runs, a CUDA GPU, nvcc (the CUDA toolkit)
and nm: its launch library is built with nvcc when the kernels are loaded (a few seconds, cached
in ~/.cache/autokernel, or $AUTOKERNEL_CACHE_DIR) by vendor/harness/, the judge's own launcher.
Where one of them is missing the kernel is left out with a warning that names what is missing,
UNAVAILABLE says why, and the calls it would serve run in PyTorch. `build_cuda(arch)` builds the
libraries ahead of time, without a GPU.

The kernels are LLM-written code judged in a sandbox; here they run in your process. So each
kernel file is first held again to the judge's static check (vendor/harness/isolation/, the closed
list of what a kernel may name) and one that fails it is refused with its file, line and name;
and before the first kernel file is imported, the package installs the judge's audit hook (guard/, a PEP 578 hook
that cannot be removed) watching only the code of kernels/: a kernel that starts a process, opens
a socket, unpickles, compiles Python code, walks frames, imports beyond what a kernel needs, or
writes outside the compiler caches and the temporary folder gets the event refused, and the call
raises `routing.KernelRefused` (never a quiet fallback). Everything else in the process, your own
code, torch and Triton working for you, is untouched. Cost: the hook runs on each audit event in
the process (most return at once; see docs/judge-vs-kernelbench.md for the figure per served
call). AUTOKERNEL_KERNEL_AUDIT=off, set before the first kernel loads, leaves it out. The judge's
launch monitor is installed at the same point whatever the switch (guard/launches.py: a kernel
sees the same launch wrappers served as judged), and every served call runs under the judge's op
recorder: PyTorch compute inside a kernel raises `routing.KernelRefused` too.

In a Hugging Face kernel repository (`export --format hf-kernels`) the package also has `layers`
(layers.py), which `kernels.kernelize` binds onto a transformers model's kernel-aware layers;
PATCH_ONLY names the kernels no layer carries: `patch(model, targets=PATCH_ONLY)` serves those.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Iterable, Iterator, Optional

import torch

from . import routing

MANIFEST = "manifest.json"
HERE = Path(__file__).resolve().parent


def _manifest() -> dict:
    path = HERE / MANIFEST
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"kernels": [], "left_out": []}


_MANIFEST = _manifest()
KERNELS: list[dict] = _MANIFEST["kernels"]
# the kernels no layer of a Hugging Face kernel repository carries (in a plain package: all of them)
PATCH_ONLY: list[str] = _MANIFEST.get("patch_only", [k["target"] for k in KERNELS])
UNAVAILABLE: dict[str, str] = {}  # target -> why this machine cannot run it, filled as kernels load
_loaded: dict[str, "routing.Winner"] = {}  # target -> winner, imported on first use


def __getattr__(name: str):
    if name == "layers":  # a Hugging Face kernel repository's forward-only layers (`kernels` reads them)
        if not (HERE / "layers.py").is_file():
            raise AttributeError(f"{__name__} has no layers: export with --format hf-kernels")
        return importlib.import_module(f"{__name__}.layers")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def winners(targets: Optional[Iterable[str]] = None) -> list:
    """The kernels as the router's winners; a kernel file is imported (its @triton.jit runs) once."""
    wanted = None if targets is None else set(targets)
    unknown = (wanted or set()) - {k["target"] for k in KERNELS}
    if unknown:
        raise KeyError(f"no kernel for {', '.join(sorted(unknown))}: known targets are "
                       f"{', '.join(k['target'] for k in KERNELS) or 'none'}")
    found = []
    for k in KERNELS:
        if (wanted is not None and k["target"] not in wanted) or k["target"] in UNAVAILABLE:
            continue
        if k["target"] not in _loaded:
            # a module target's winner is a ModelNew, bound in place of its module instances' forward
            entry = "ModelNew" if k["kernel_type"] == "module" else "kernel_fn"
            module = _load_cuda(k) if k.get("backend") == "cuda" else _load(k, entry)
            if module is None:
                continue
            serving = k.get("serving")  # absent from a package exported before serving ranges: its target alone
            # a backward serves only where the judge passed it (manifest "backward"; absent: forward only)
            backward_fn = getattr(module, "backward_fn", None) if k.get("backward") else None
            # where it serves calls that need gradients (absent: exported before training ranges, its target alone)
            training = k.get("training_serving")
            _loaded[k["target"]] = routing.Winner(
                target=k["target"], kernel_type=k["kernel_type"], dims=k["dims"], dtype=k["dtype"],
                kernel_fn=getattr(module, entry), kwargs=k.get("kwargs", {}), route=k.get("route", "op"),
                modules=k.get("modules", []), serving=routing.ServingRange.from_json(serving) if serving else None,
                backward_fn=backward_fn, inference_only=k.get("inference_only", ""),
                training_serving=routing.ServingRange.from_json(training) if training else None,
                mutates_grad_out=getattr(module, "MUTATES_GRAD_OUT", False) is True,
                judged_layouts=bool(k.get("judged_layouts")))
        found.append(_loaded[k["target"]])
    return found


GUARD_SWITCH = "AUTOKERNEL_KERNEL_AUDIT"
_guarded: list[str] = []  # "on" or "off", once decided


def _guard() -> None:
    """The launch monitor and the audit hook over kernels/, installed once, before the first kernel
    file is imported."""
    if _guarded:
        return
    if any(k.get("backend") == "cuda" for k in KERNELS):  # the launcher the monitor counts through
        _vendor()
    from .guard import served
    from .routing import refusals
    # the judge's launch monitor and op recorder, whatever the switch: a kernel sees served what it
    # saw judged, and a served call that computes in PyTorch raises KernelRefused
    refusals.observe_with(served.watch(refusals.report))
    if os.environ.get(GUARD_SWITCH, "on").strip().lower() in ("off", "0", "false", "no"):
        _guarded.append("off")
        return
    judges = sys.modules.get("harness.isolation.audit_hook")
    if judges is not None and judges.installed():
        # `export --selftest`: the judge's own hook watches kernels/ already; a second hook would
        # see the first one's frame reads as the kernels' own
        _guarded.append("the judge's")
        return
    import tempfile
    from .guard import audit_hook, audit_policy
    launcher = None
    if any(k.get("backend") == "cuda" for k in KERNELS):  # its loader runs nvcc and ctypes for the kernel
        try:
            launcher = importlib.util.find_spec("harness.cuda_launcher")
        except ImportError:
            launcher = None
    triton_cache = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    ours = os.environ.get("AUTOKERNEL_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "autokernel")
    policy = audit_policy.standard_policy(
        untrusted=[str(HERE / "kernels")], reads=["/"], writes=[tempfile.gettempdir(), triton_cache, ours],
        allowed_imports=tuple(_MANIFEST.get("kernel_imports", ("torch", "triton", "triton.language", "math"))),
        allowed_prefixes=tuple(_MANIFEST.get("kernel_import_prefixes", ("triton.language.",))),
        report=refusals.report, builders=[os.path.dirname(launcher.origin)] if launcher and launcher.origin else [])
    audit_hook.install(policy)
    _guarded.append("on")


def _load(k: dict, entry: str = "kernel_fn"):
    _guard()
    _vendor()  # the judge's static check, which routing.load_kernel holds each winner to again
    return routing.load_kernel(HERE / k["source"], f"{__name__}.kernels.{Path(k['source']).stem}", entry)


def _load_cuda(k: dict):
    """A CUDA C++ kernel's module with its launch library built and loaded, or None (UNAVAILABLE
    and a warning say why) where this machine cannot run it."""
    missing = ""
    try:
        missing = "; ".join(why for why, gone in (
            ("no CUDA GPU is visible", not torch.cuda.is_available()),
            ("nvcc (the CUDA toolkit) is not on PATH, in $CUDA_HOME or /usr/local/cuda", not _nvcc()),
            ("nm (binutils), which reads the launch functions' parameter types, is not on PATH",
             shutil.which("nm") is None)) if gone)
        if missing:
            raise RuntimeError(missing)
        module = _load(k)
        from harness.cuda_launcher import load_launcher
        load_launcher(module.CUDA_KERNELS, getattr(module, "CONFIG", None))  # nvcc builds it here, once
        return module
    except Exception as e:  # the model still runs: the calls it would serve stay in PyTorch
        UNAVAILABLE[k["target"]] = missing or f"{type(e).__name__}: {e}"
        warnings.warn(f"{__name__}: {k['target']} is a CUDA C++ kernel and cannot run here: "
                      f"{UNAVAILABLE[k['target']]}. It needs a CUDA GPU, nvcc and nm where it runs; until "
                      "then the calls it would serve run in PyTorch.", RuntimeWarning, stacklevel=3)
        return None


def _nvcc() -> Optional[str]:
    _vendor()
    from harness.cuda_build import nvcc_path
    return nvcc_path()


def _vendor() -> None:
    """Winners are checked by harness.isolation.static_check and CUDA C++ kernels import
    harness.cuda_launcher: autokernel's own where it is installed, else the copies in vendor/
    (appended to sys.path, so they never shadow an installed one)."""
    try:
        installed = importlib.util.find_spec("harness.isolation.static_check") is not None
    except ImportError:
        installed = False
    vendor = str(HERE / "vendor")
    if not installed and vendor not in sys.path:
        sys.path.append(vendor)


def build_cuda(arch: Optional[str] = None) -> dict[str, Path]:
    """Build every CUDA C++ kernel's launch library for `arch` (default: this GPU's, else sm_90)
    with nvcc, without running anything: needs nvcc, no GPU. Returns target -> library file."""
    _vendor()
    from harness.cuda_launcher import build_library, default_arch
    built = {}
    for k in KERNELS:
        if k.get("backend") == "cuda":
            module = sys.modules.get(f"{__name__}.kernels.{Path(k['source']).stem}") or _load(k)
            built[k["target"]] = build_library(module.CUDA_KERNELS, getattr(module, "CONFIG", None),
                                               arch or default_arch())
    return built


@contextlib.contextmanager
def patch(model: torch.nn.Module, targets: Optional[Iterable[str]] = None) -> Iterator:
    """Bind the kernels (all, or those of `targets`) into `model` while inside; everything replaced
    is put back on exit. Yields the router; its tally says what was served and what fell back."""
    router = routing.Router(winners(targets))
    with router.patched(model):
        yield router


def selftest(device: Optional[str] = None, seed: int = 0) -> dict[str, float]:
    """Each kernel against the PyTorch reference (in float64) at its target shape: the error
    relative to the reference's rms per target. Raises AssertionError naming any beyond tolerance."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    errors, bad = {}, []
    for w in winners():
        if w.kernel_type == "module":  # no reference at a bare shape: verify judged it in the model
            continue
        gen = torch.Generator().manual_seed(seed)
        args, kwargs = _inputs(w, gen)
        args = [a.to(device) for a in args]
        with torch.no_grad():
            out = w.kernel_fn(*args, **kwargs)
            ref = routing.REFERENCES[w.kernel_type](*[a.double() if a.is_floating_point() else a for a in args],
                                                    **kwargs)
        errors[w.target] = routing.error_vs(out, ref)[1]
        if errors[w.target] > routing.TOLERANCE.get(w.dtype, routing.TOLERANCE["float32"]):
            bad.append(f"{w.target}: error {errors[w.target]:.3g} of the reference's rms")
    assert not bad, "kernels that differ from PyTorch: " + "; ".join(bad)
    return errors


def _inputs(w, gen: torch.Generator) -> tuple[list, dict]:
    """Seeded inputs at a kernel's target dims, in its dtype, scaled so outputs stay O(1)."""
    d, dtype = w.dims, getattr(torch, w.dtype)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)
    t = w.kernel_type
    if t == "matmul":
        return [randn(d["M"], d["K"]), randn(d["K"], d["N"], scale=d["K"] ** -0.5)], {}
    if t in ("softmax", "reduce"):
        return [randn(d["M"], d["N"])], {}
    if t == "layernorm":
        return [randn(d["M"], d["N"]), randn(d["N"]), randn(d["N"])], {}
    if t == "rmsnorm":
        return [randn(d["M"], d["N"]), randn(d["N"])], {}
    if t == "cross_entropy":
        return [randn(d["N"], d["V"]), torch.randint(0, d["V"], (d["N"],), generator=gen)], {}
    if t == "fused_mlp":
        return [randn(d["M"], d["D"]), randn(d["F"], d["D"], scale=d["D"] ** -0.5),
                randn(d["F"], d["D"], scale=d["D"] ** -0.5), randn(d["D"], d["F"], scale=d["F"] ** -0.5)], {}
    if t in CHAIN_INPUTS:
        return CHAIN_INPUTS[t](d, randn, gen), {k: v for k, v in w.kwargs.items() if k in ("eps", "ignore_index",
                                                                                            "reduction")}
    shape = (d["B"], d["H"], d["S"], d["D"])
    if t == "flash_attention":
        return [randn(*shape), randn(*shape), randn(*shape)], {"causal": bool(w.kwargs.get("causal", False))}
    angles = torch.randn(d["S"], d["D"] // 2, generator=gen).repeat(1, 2)  # rotate-half tables
    return [randn(*shape), angles.cos().to(dtype), angles.sin().to(dtype)], {}


def _rotary_tables(d: dict, gen: torch.Generator) -> list:
    angles = torch.randn(d["S"], d["D"] // 2, generator=gen).repeat(1, 2)  # rotate-half tables
    return [angles.cos(), angles.sin()]


# the chain types' inputs (harness/kernel_types/types/chains.py), as the selftest needs them
CHAIN_INPUTS = {
    "add_rmsnorm": lambda d, randn, gen: [randn(d["M"], d["N"]), randn(d["M"], d["N"]), randn(d["N"])],
    "silu_mul": lambda d, randn, gen: [randn(d["M"], d["N"]), randn(d["M"], d["N"])],
    "rotary_qk": lambda d, randn, gen: [randn(d["B"], d["HQ"], d["S"], d["D"]), randn(d["B"], d["HK"], d["S"], d["D"]),
                                        *(t.to(randn(1).dtype) for t in _rotary_tables(d, gen))],
    "linear_cross_entropy": lambda d, randn, gen: [randn(d["N"], d["D"]), randn(d["V"], d["D"], scale=d["D"] ** -0.5),
                                                   torch.randint(0, d["V"], (d["N"],), generator=gen)],
}
