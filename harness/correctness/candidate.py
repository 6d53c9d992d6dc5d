"""Loading a candidate kernel file and calling its kernel_fn under observation (child side)."""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from harness.kernel_types import registry
from harness.isolation import syntax
from harness.correctness import as_passed
from harness.correctness.guards import Allocations, Placed
from harness.correctness.integrity import ComputeRecorder
from harness.correctness.launches import LaunchMonitor

BACKENDS = ("triton", "cuda")


class ContractError(Exception):
    """The file does not follow the kernel-file contract (a usage error, exit status 2)."""


def read_header(path: Path) -> dict[str, Any]:
    """KERNEL_TYPE, BACKEND, MUTATES_GRAD_OUT and whether kernel_fn and backward_fn exist, read
    without running the file: the judge decides from the text, never from what the import left."""
    try:
        tree = syntax.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise SyntaxError(f"{path.name}:{e.lineno}: {e.msg}") from None
    found: dict[str, Any] = {"has_kernel_fn": False, "has_backward_fn": False}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("KERNEL_TYPE", "BACKEND", "MUTATES_GRAD_OUT"):
                try:
                    found[name] = ast.literal_eval(node.value)
                except ValueError:
                    found[name] = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in ("kernel_fn", "backward_fn"):
            found[f"has_{node.name}"] = True
    return found


def check_header(header: dict[str, Any]) -> None:
    kernel_type = header.get("KERNEL_TYPE")
    if kernel_type is None:
        raise ContractError("no KERNEL_TYPE: add a line such as KERNEL_TYPE = \"softmax\" "
                            f"(known types: {', '.join(registry.names())})")
    if kernel_type not in registry.names():
        raise ContractError(f"unknown KERNEL_TYPE {kernel_type!r}: use one of {', '.join(registry.names())}")
    if header.get("BACKEND", "triton") not in BACKENDS:
        raise ContractError(f"unknown BACKEND {header.get('BACKEND')!r}: use \"triton\" or \"cuda\"")
    if not header["has_kernel_fn"]:
        kt = registry.get(kernel_type)
        raise ContractError(f"no kernel_fn: define def {kt.signature_text()}")
    if header.get("MUTATES_GRAD_OUT", False) not in (True, False):
        raise ContractError("MUTATES_GRAD_OUT must be the literal True or False")


def import_candidate(path: Path):
    from harness.isolation import audit_hook
    name = f"ak_candidate_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    audit_hook.register(module)  # frames running with its globals are the candidate's from now on
    spec.loader.exec_module(module)
    return module


def check_signature(fn, kt: registry.KernelType) -> str | None:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return "kernel_fn has no inspectable signature"
    names = tuple(p.name for p in params)
    if names != kt.params:
        return f"kernel_fn{tuple(names)} does not match the {kt.name} contract: def {kt.signature_text()}"
    return None


SANDBOX_REFUSAL = ("refused by the judge's OS sandbox: a candidate may write only in its own scratch folder, "
                   "and may not open network connections")
sandbox_active = False  # set by the worker once Landlock is in force: only the wording depends on it


def error_text(exc: BaseException, limit: int = 12) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    tail = "".join(lines[-limit:]).rstrip()[-3000:]
    # EACCES under Landlock (a write outside scratch, a connect), however the library words it
    if sandbox_active and (isinstance(exc, PermissionError) or "Permission denied" in str(exc)):
        tail += f"\n{SANDBOX_REFUSAL}"
    return tail


@dataclass
class CallResult:
    output: Any = None
    error: str | None = None
    launches: int = 0
    forbidden: list[str] = field(default_factory=list)
    device_to_host: int = 0
    host_reads: list[str] = field(default_factory=list)
    mutated: list[int] = field(default_factory=list)
    # guarded calls (harness/correctness/guards.py): each changed input's bytes, where, and the
    # digest of every input's whole buffer after the call; stores past what kernel_fn allocated
    writes: list[dict] | None = None
    digests: list | None = None
    strays: list[dict] | None = None
    aliased: bool = False
    borrowed: str = ""  # how the output fails to own its storage (a view of a larger buffer), or ""
    plain: bool = True
    device: str = ""
    seconds: float = 0.0
    program_order: list[str] = field(default_factory=list)  # launches whose programs depend on each other
    tf32_dots: int = 0  # tl.dot calls whose fp32 operands ran as TF32, as on a GPU
    # what a GPU leaves unspecified, and how often the call used it (harness/correctness/unspecified.py)
    unspecified: dict = field(default_factory=dict)

    def observations(self) -> dict:
        return {"launches": self.launches, "forbidden": sorted(set(self.forbidden)),
                "device_to_host": self.device_to_host, "host_reads": sorted(set(self.host_reads)),
                "mutated": self.mutated,
                "aliased": self.aliased, "borrowed": self.borrowed, "plain": self.plain, "device": self.device,
                "program_order": self.program_order, "tf32_dots": self.tf32_dots,
                **({"unspecified": self.unspecified} if self.unspecified else {}),
                **({"writes": self.writes, "digests": self.digests} if self.digests is not None else {}),
                **({"strays": self.strays} if self.strays is not None else {})}


def _device_fault(exc: BaseException) -> bool:
    accelerator_error = getattr(torch, "AcceleratorError", ())
    return (accelerator_error and isinstance(exc, accelerator_error)) or "CUDA error" in str(exc)


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # sparse, meta or exotic tensors have no plain storage
        return -1


def observed_call(fn, args: list, kwargs: dict, monitor: LaunchMonitor, placed: Placed | None = None,
                  mode: str | None = None) -> CallResult:
    """Call kernel_fn once, watching launches, PyTorch compute, input mutation and aliasing.
    `placed`: the inputs in guarded buffers (`args` the tensors passed, sharing their storage):
    the whole of every buffer is compared after the call, and every buffer kernel_fn allocates is
    guarded too (harness/correctness/guards.py); `mode`: the grad mode the call runs in
    (harness/correctness/as_passed.py)."""
    import time
    snapshots = placed.snapshot() if placed is not None else \
        [a.clone() if isinstance(a, torch.Tensor) else None for a in args]
    result = CallResult()
    launches_before, tf32_before = monitor.launches, getattr(monitor, "tf32_dots", 0)
    secret = getattr(monitor, "unspecified", None)
    unspecified_before = dict(secret.counts) if secret is not None else {}
    allocations = Allocations() if placed is not None else None
    recorder = ComputeRecorder(monitor, allocations)
    # the judge's worker: each launch in its secret program order, and again in id order where its
    # programs share memory, the two compared (program_order.py)
    orders = getattr(monitor, "orders", None)
    start = time.perf_counter()
    try:
        with recorder, (orders.compared() if orders is not None else contextlib.nullcontext()), \
                (as_passed.calling(mode) if mode else contextlib.nullcontext()):
            out = fn(*args, **kwargs)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    except Exception as exc:  # the candidate's bug, reported as its failure, not ours
        if _device_fault(exc):
            # a CUDA error poisons the context for every later call: the worker ends here, and the
            # judge reports a CRASH with this traceback as the tail of stderr
            traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)
        result.error = error_text(exc)
        return result
    finally:
        if orders is not None:
            result.program_order = orders.take_findings()
        result.tf32_dots = getattr(monitor, "tf32_dots", 0) - tf32_before
        if secret is not None:
            result.unspecified = {k: n - unspecified_before.get(k, 0) for k, n in secret.counts.items()
                                  if n > unspecified_before.get(k, 0)}
    if getattr(monitor, "refused", None):  # a refused launch the candidate caught still fails the call
        result.error = f"AutotuneNotJudged (caught by the candidate; it stands): {monitor.refused}"
        return result
    result.seconds = time.perf_counter() - start
    if allocations is not None:  # a store past the output, or past scratch kernel_fn allocated
        result.strays = allocations.strays(out)
    return observe(result, out, args, snapshots, recorder, monitor.launches - launches_before, placed)


def observe(result: CallResult, out, args: list, snapshots: list, recorder: ComputeRecorder,
            launches: int, placed: Placed | None = None) -> CallResult:
    """What one call did, read after it returned: a checked call and a timed call are read alike.
    With `placed`, `snapshots` are its whole buffers (Placed.snapshot)."""
    result.output = out
    result.launches = launches
    result.forbidden = recorder.forbidden
    result.device_to_host = recorder.device_to_host
    result.host_reads = recorder.host_reads
    # writes into an input (in place) corrupt the caller's tensors; so does a store outside its
    # elements, into the wider buffer it is a view of or past its storage
    if placed is not None:
        result.writes = placed.writes(snapshots)
        result.digests = placed.digests()
        result.mutated = [w["input"] for w in result.writes if w["inside"]]
    else:
        result.mutated = [i for i, (a, s) in enumerate(zip(args, snapshots))
                          if s is not None and not _same_bits(a, s)]
    if isinstance(out, torch.Tensor):
        # exactly torch.Tensor and strided: a subclass or lazy object could fake its values later
        result.plain = type(out) is torch.Tensor and out.layout == torch.strided
        result.device = str(out.device)
        # an output that shares storage with an input changes when the caller reuses that input
        ptr = _storage_ptr(out)
        result.aliased = any(isinstance(a, torch.Tensor) and _storage_ptr(a) == ptr for a in args)
        result.borrowed = borrowed_storage(out)
    else:
        result.plain = False
    return result


def borrowed_storage(t: torch.Tensor) -> str:
    """How `t` fails to own its storage, in words, or "": its elements must span the whole storage
    from its first byte. A view of a larger buffer carries bytes no reference checks (per-row
    statistics stashed past the output for a backward to read back), which a served call does not
    keep: autograd, torch.compile or a caller's .contiguous() hand the backward a tensor of the
    output's own size."""
    if t.numel() == 0 or t.layout != torch.strided:
        return ""
    try:
        nbytes = t.untyped_storage().nbytes()
    except Exception:
        return ""
    span = (1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride()))) * t.element_size()
    if t.storage_offset() == 0 and span == nbytes:
        return ""
    return (f"a {str(t.dtype).replace('torch.', '')} {list(t.shape)} view at element offset {t.storage_offset()} "
            f"spanning {span} of its storage's {nbytes} bytes")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    from harness.correctness.compare import bitwise_equal
    return bitwise_equal(a, b)
