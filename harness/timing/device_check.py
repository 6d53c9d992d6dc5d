"""Every timed output compared on the device, right after its rep, by the judge's code in the worker.

The judging process compares only the saved sample of the timed outputs (harness/timing/timed_outputs.py);
the others never leave the device. So each one is compared there, outside the timed region, with
the reference rebuilt on the device from the rep's own inputs (the buffers as refilled before the
call, harness/timing/fresh_inputs.py): the type's reference in float64, or in float32 with a derived
bound where the device is slow at float64 (harness/kernel_types/references.py), under the same
tolerances as every comparison (harness/correctness/compare.py). The record carries the verdict and
the max scaled error (error / allowed, 1 at the limit); the judging process fails a timing on any
rep whose comparison failed, and on one that was skipped where it plans one.

Where it is affordable: a reference costs a fixed multiple of the case's FLOPs in float64 on the
device, once per rep. Up to CHECK_FLOPS per rep it runs (every starter's bench shape but the
4096x4096x11008 MLP on a data-centre GPU; every CPU timing shape); above it the rep is recorded as
not compared on the device and only the saved sample is compared, by the judging process.
"""
from __future__ import annotations

import torch

from harness.correctness.compare import compare
from harness.kernel_types import references, registry
from harness.kernel_types.registry import Case

# reference FLOPs per rep a device check may spend: about 20 ms of float64 on a data-centre GPU, a
# few ms of float64 on one CPU thread beside the interpreter's 25 to 100 ms reps
CHECK_FLOPS = {"cpu": 5e7, "cuda": 4e11}
SLOW_FLOAT64 = 32  # how much slower float64 runs on a GPU without full-rate float64


def unaffordable(case: Case, device: str, capability: tuple[int, int] | None = None) -> str | None:
    """Why the timed outputs of `case` are not compared on `device`, or None where they are."""
    flops = registry.get(case.kernel_type).flops(case.dims)
    limit = CHECK_FLOPS.get(device, CHECK_FLOPS["cuda"])
    if device == "cuda":
        capability = capability or torch.cuda.get_device_capability()
        if tuple(capability) not in references.FAST_FLOAT64 and references.precision_on(case, device, capability) == "float64":
            limit /= SLOW_FLOAT64
    if flops <= limit:
        return None
    return (f"its reference costs {flops:.3g} FLOP a rep, above the {limit:.3g} a device check may spend: "
            "only the saved outputs are compared")


def check_on_device(case: Case, out, args: list, kwargs: dict, device: str) -> dict:
    """The output of one timed call against the reference of its own inputs `args` (on `device`):
    {"ok", "worst_ratio", "detail", "how"}."""
    where = torch.device(device).type
    ref = references.compute_on(case, args, kwargs, where, references.precision_on(case, where))
    with torch.no_grad():
        cmp = compare(out, ref.value, case, args, ref_error=ref.error)
    return {"ok": cmp.ok, "worst_ratio": cmp.worst_ratio, "detail": cmp.detail, "how": ref.how}
