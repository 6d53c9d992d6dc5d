"""What the parent decides from the children's records: output comparison, which trials count,
the integrity policy, and the flags a reviewer should look at.

Everything here is a pure function of loaded records and tensors; nothing runs a model.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import torch

# KernelBench's tolerances (atol = rtol), per precision: torchbench's fp32 value, and 1e-2 for
# half types.
TOLERANCES = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}
# Above this the speedup is reported but flagged: KernelBench's own tripwire.
REVIEW_SPEEDUP_X = 10.0
# aten ops that carry a model's arithmetic; one of them left to PyTorch is the main op, whatever
# small kernel the solution launches beside it.
HEAVY_OPS = frozenset(f"aten::{n}" for n in (
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution", "conv1d",
    "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "cudnn_convolution", "mkldnn_convolution", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "einsum", "_softmax", "softmax", "_log_softmax",
    "native_layer_norm", "native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
    "native_group_norm", "max_pool2d_with_indices", "avg_pool2d", "lstm", "gru", "_cdist_forward"))


@dataclass
class TrialCheck:
    index: int
    seed: int
    passed: bool
    counted: bool
    max_abs_err: float | None
    detail: str

    def to_json(self) -> dict:
        return asdict(self)


def compare(ref: list[torch.Tensor], out: list[torch.Tensor], tol: float) -> tuple[bool, float | None, str]:
    """torch.allclose(out, ref, atol=tol, rtol=tol) per output, NaN equal to NaN, after checking
    count, shape and dtype. Returns (passed, max abs error, detail)."""
    if len(out) != len(ref):
        return False, None, f"{len(out)} outputs, expected {len(ref)}"
    worst, details = 0.0, []
    for k, (r, o) in enumerate(zip(ref, out)):
        if tuple(o.shape) != tuple(r.shape):
            return False, None, f"output {k}: shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        if o.dtype != r.dtype:
            return False, None, f"output {k}: dtype {o.dtype}, expected {r.dtype}"
        r64, o64 = r.double(), o.double()
        both_nan = torch.isnan(r64) & torch.isnan(o64)
        err = torch.where(both_nan, torch.zeros_like(r64), (o64 - r64).abs())
        max_err = float(err.nan_to_num(nan=float("inf")).max()) if err.numel() else 0.0
        worst = max(worst, max_err)
        if not torch.allclose(o64, r64, atol=tol, rtol=tol, equal_nan=True):
            bad = int((~torch.isclose(o64, r64, atol=tol, rtol=tol, equal_nan=True)).sum())
            details.append(f"output {k}: {bad} of {r.numel()} elements outside atol=rtol={tol:g} "
                           f"(max abs error {max_err:.3g})")
    finite_worst = worst if worst != float("inf") else None  # JSON has no inf; the detail says it
    if details:
        return False, finite_worst, "; ".join(details)
    return True, finite_worst, f"max abs error {worst:.3g} within atol=rtol={tol:g}"


def trivial_output(ref: list[torch.Tensor], tol: float) -> str | None:
    """Name the input-independent output (zeros, a constant) that passes this trial, if any: such
    a trial proves nothing and is not counted."""
    names = []
    for r in ref:
        r64 = r.double()
        finite = r64[torch.isfinite(r64)]
        candidates = {"an all-zero output": torch.zeros_like(r64)}
        # one element is its own mean: a fill constant says nothing there (fixed_output_passes
        # covers a scalar that does not depend on the inputs)
        if finite.numel() > 1:
            candidates["a constant output (the mean)"] = torch.full_like(r64, float(finite.mean()))
            mid = (float(finite.max()) + float(finite.min())) / 2
            candidates["a constant output (the midrange)"] = torch.full_like(r64, mid)
        name = next((n for n, c in candidates.items() if torch.allclose(c, r64, atol=tol, rtol=tol, equal_nan=True)), None)
        if name is None:
            return None  # this output alone shows whether the solution computed anything
        names.append(name)
    return names[0]


def fixed_output_passes(refs: list[list[torch.Tensor]], tol: float) -> bool:
    """True when one fixed tensor per output (the mean over trials) passes every trial: a solution
    that returns a stored answer would be judged correct."""
    if len(refs) < 2:
        return False
    for k in range(len(refs[0])):
        stack = [t[k].double() for t in refs]
        if any(s.shape != stack[0].shape for s in stack):
            return False
        fixed = torch.stack(stack).mean(0)
        if not all(torch.allclose(fixed, s, atol=tol, rtol=tol, equal_nan=True) for s in stack):
            return False
    return True


def ops_policy(pytorch_ops: list[str], model_ops: list[str], launches: int) -> tuple[str | None, list[str]]:
    """(failure, flags) for the aten compute ops ModelNew ran outside its own kernels.

    KernelBench allows partial custom kernels, so PyTorch compute beside a custom kernel is a flag,
    not a failure; a solution that launches no kernel of its own fails."""
    ours, theirs = set(pytorch_ops), set(model_ops)
    listed = ", ".join(sorted(ours)) or "none"
    if launches == 0:
        # blocks a re-wiring of PyTorch ops (or a plain copy) passed off as a custom kernel
        return f"no custom Triton or CUDA kernel was launched; PyTorch compute ops run: {listed}", []
    if not ours:
        return None, []
    main = sorted((ours & theirs) & HEAVY_OPS)
    if main:
        return None, [f"main op in PyTorch: {', '.join(main)} still runs in PyTorch; the custom kernels do the rest"]
    if theirs and theirs <= ours:
        return None, [f"trivial custom kernel: every compute op of Model ({', '.join(sorted(theirs))}) "
                      "still runs in PyTorch"]
    return None, [f"partial custom kernels: PyTorch compute ops outside them: {listed}"]


def speed_flags(speedups: dict[str, float | None]) -> list[str]:
    return [f"speedup_vs_{name} {s:.1f}x exceeds {REVIEW_SPEEDUP_X:.0f}x: review for a hack before trusting it"
            for name, s in speedups.items() if s is not None and s > REVIEW_SPEEDUP_X]


def roofline(median_us: float, flops: float, nbytes: float, peaks: dict | None, precision: str) -> dict | None:
    """The least time the device's measured peaks allow for Model's FLOPs and minimal bytes (inputs
    read once, outputs written once); a solution below it is faster than the hardware can be."""
    if not peaks or median_us <= 0:
        return None
    dtype = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}[precision]
    gbps, tflops = peaks.get("copy_gbps"), (peaks.get("matmul_tflops") or {}).get(dtype)
    memory_us = nbytes / (gbps * 1e3) if gbps else 0.0
    compute_us = flops / (tflops * 1e6) if tflops and flops else 0.0
    bound_us = max(memory_us, compute_us)
    return {"bound_us": bound_us, "memory_us": memory_us, "compute_us": compute_us,
            "bound": "compute" if compute_us > memory_us else "memory", "peak_gbps": gbps,
            "peak_tflops": tflops, "below_bound": bound_us > 0 and median_us < bound_us}


def stream_flag(event_median_us: float, host_wall_median_us: float | None) -> list[str]:
    # blocks work launched on a side stream, which CUDA events on the current stream do not time
    if host_wall_median_us is None or host_wall_median_us <= 3 * event_median_us + 100:
        return []
    return [f"host wall clock to a device-wide sync ({host_wall_median_us:.0f} us) far exceeds the "
            f"CUDA-event time ({event_median_us:.0f} us): work on another stream escapes the timer?"]


SUSPICIOUS_SOURCE = (
    (r"\ballclose\s*=|setattr\(\s*torch\s*,", "reassigns a torch function (the comparison?)"),
    (r"\bgc\.get_objects|\bsys\._getframe|\binspect\.(stack|currentframe)", "inspects the judge's frames or objects"),
    (r"^\s*(import|from)\s+(harness|autokernel)\b", "imports the judge"),
    (r"torch\.cuda\.(Stream|stream)\b", "uses a side CUDA stream: the timer covers the current stream"),
    (r"\bthreading\b|\bmultiprocessing\b", "starts threads or processes"),
    (r"\btorch\.compile\b", "calls torch.compile: PyTorch's compiler, not a kernel of its own"),
)


def source_flags(source: str) -> list[str]:
    """Static hints for a reviewer; never a verdict on their own."""
    return [f"solution source {what}" for pattern, what in SUSPICIOUS_SOURCE
            if re.search(pattern, source, flags=re.MULTILINE)]
