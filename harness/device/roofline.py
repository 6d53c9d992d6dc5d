"""Turning a measured time into throughput and a position against the device's measured peaks."""
from __future__ import annotations

from typing import Any

from harness.kernel_types import registry
from harness.kernel_types.registry import Case


def timing_summary(end: dict) -> dict[str, Any]:
    kernel, eager = end["kernel"], end.get("eager") or {}  # none where the clean worker failed to time it
    speedup = eager["median_us"] / kernel["median_us"] if eager and kernel["median_us"] > 0 else None
    return {"median_us": kernel["median_us"], "iqr_us": kernel["iqr_us"], "reps": kernel["reps"],
            "baseline_median_us": eager.get("median_us"), "baseline_iqr_us": eager.get("iqr_us"),
            "speedup_vs_eager": speedup, "method": kernel["method"],
            "representative_of_gpu": kernel["representative_of_gpu"],
            "shape": Case.from_json(end["case"]).label(),
            "samples_us": kernel["samples_us"], "baseline_samples_us": eager.get("samples_us"),
            **({"witness": end["witness"]} if "witness" in end else {}), **_compiled(end, kernel)}


def _compiled(end: dict, kernel: dict) -> dict[str, Any]:
    compiled = end.get("compiled")
    if not compiled:
        return {"compile_median_us": None, "speedup_vs_compile": None,
                "compile_note": end.get("compiled_error")}
    return {"compile_median_us": compiled["median_us"],
            "speedup_vs_compile": compiled["median_us"] / kernel["median_us"] if kernel["median_us"] > 0 else None}


def work(case: Case) -> tuple[float, float]:
    """(flops, bytes) of one call; causal attention does half the score work."""
    kt = registry.get(case.kernel_type)
    flops = kt.flops(case.dims)
    if case.options.get("causal"):
        flops /= 2
    return flops, kt.bytes(case.dims, case.torch_dtype.itemsize)


def roofline_for(case: Case, end: dict, device: str) -> dict[str, Any] | None:
    median_s = end["kernel"]["median_us"] * 1e-6
    if median_s <= 0:
        return None
    flops, nbytes = work(case)
    gbps, tflops = nbytes / median_s / 1e9, flops / median_s / 1e12
    result: dict[str, Any] = {"gbps": gbps, "tflops": tflops, "pct_of_peak": None, "bound": None,
                              "cpu_figures": device == "cpu"}
    peaks = _peaks(device)
    if not peaks:
        return result
    peak_gbps = peaks.get("copy_gbps")
    peak_tflops = (peaks.get("matmul_tflops") or {}).get(case.dtype) or \
        (peaks.get("matmul_tflops") or {}).get("float32")
    if not peak_gbps or not peak_tflops:
        return result
    ridge = peak_tflops * 1e12 / (peak_gbps * 1e9)  # flops per byte where the roofs meet
    bound = "compute" if flops / max(nbytes, 1.0) >= ridge else "memory"
    pct = tflops / peak_tflops if bound == "compute" else gbps / peak_gbps
    result.update(bound=bound, pct_of_peak=pct, peak_gbps=peak_gbps, peak_tflops=peak_tflops)
    return result


# The floor is divided by this before a time is refused: a good kernel may beat the probes' copy and
# matmul (which measure what torch reaches, not the datasheet) by some margin, never by 2x. On the
# CPU the peaks are measured on a shared machine and the interpreter is far slower than any roof, so
# the margin is wide: only a clock that hides most of the time falls below it.
FLOOR_MARGIN = {"cuda": 0.5, "cpu": 0.1}


def physical_floor_us(case: Case, device: str, peaks: dict | None = None) -> dict | None:
    """The least time one call can take at the device's measured peaks: its bytes at the copy
    bandwidth or its FLOPs at the matmul rate, whichever is longer; None without peaks."""
    peaks = peaks if peaks is not None else _peaks(device)
    if not peaks or not peaks.get("copy_gbps"):
        return None
    flops, nbytes = work(case)
    rates = peaks.get("matmul_tflops") or {}
    peak_tflops = max([v for v in rates.values() if v] or [0.0])  # the fastest dtype: a floor, not a target
    floor_s = max(nbytes / (peaks["copy_gbps"] * 1e9), flops / (peak_tflops * 1e12) if peak_tflops else 0.0)
    margin = FLOOR_MARGIN.get(device, 0.5)
    return {"floor_us": floor_s * 1e6, "margin": margin, "limit_us": floor_s * 1e6 * margin,
            "copy_gbps": peaks["copy_gbps"], "matmul_tflops": peak_tflops}


def below_floor(case: Case, median_us: float, device: str, peaks: dict | None = None) -> str | None:
    """Why `median_us` is impossible on this device, or None."""
    floor = physical_floor_us(case, device, peaks)
    if floor is None or median_us >= floor["limit_us"]:
        return None
    # a faked clock: no kernel moves its bytes or does its FLOPs faster than the hardware allows
    return (f"faster than the hardware allows: median {median_us:.3g} us for {case.label()}, but its bytes and "
            f"FLOPs need at least {floor['floor_us']:.3g} us at the measured peaks ({floor['copy_gbps']:.4g} GB/s, "
            f"{floor['matmul_tflops']:.4g} TFLOP/s); refused below {floor['margin']:g}x that (was the clock faked?)")


def _peaks(device: str) -> dict | None:
    try:
        from harness.device.peaks import measured_peaks
    except ImportError:
        return None
    try:
        return measured_peaks(device)
    except Exception:  # a failed probe costs the roofline figures, never the verdict
        return None
