"""The device's own peaks, measured by probes, never read from a datasheet.

`measured_peaks(device)` times a large copy (read + write bytes over time: the memory roof) and a
square matmul per float dtype (the compute roof), keeps the best of several reps, and caches the
result per device name and torch version as JSON under AUTOKERNEL_CACHE_DIR (default
~/.cache/autokernel), so a plan, a verdict's roofline and the judge use the same figures. A cached
figure that a profiled op beats is probed again, and the higher figure kept: a probe taken while the
machine was busy must not cap every later plan.

On a CPU the probes are sized to finish in about two seconds; their figures are this CPU's. On a
GPU fp32 is measured with TF32 off, because fp32 here means IEEE fp32 (DESIGN: strict precision).
Nothing in this module runs at import.
"""
from __future__ import annotations

import json
import os
import platform
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

PROBE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Per-probe wall budgets: the whole CPU measurement must stay near 2 s.
CPU_BUDGET_S = {"copy": 0.25, "matmul": 0.35}
GPU_BUDGET_S = {"copy": 1.0, "matmul": 2.0}


def cache_dir() -> Path:
    return Path(os.environ.get("AUTOKERNEL_CACHE_DIR") or Path.home() / ".cache" / "autokernel")


def device_name(device: str = "cpu") -> str:
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev.index if dev.index is not None else torch.cuda.current_device())
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    # the thread count is part of the name: peaks of the same chip differ with the cores we may use
    return f"{model} ({torch.get_num_threads()} threads)"


def cache_path(device: str = "cpu") -> Path:
    key = f"{device_name(device)}-torch{torch.__version__}"
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key).strip("_")
    return cache_dir() / "peaks" / f"{slug}.json"


def measured_peaks(device: str = "cpu", refresh: bool = False, at_least: dict[str, float] | None = None) -> dict:
    """Copy bandwidth (GB/s) and matmul throughput (TFLOP/s per dtype that runs) of `device`,
    from the cache unless `refresh` or none is there yet. `at_least` holds the TFLOP/s per dtype
    that ops were seen to reach (a profile's): a cached roof below one of them was probed while the
    machine was busy, so the device is probed again and each figure keeps the highest of the cache,
    the new probe and what was seen; the cache then holds those."""
    path = cache_path(device)
    cached = None if refresh else _read(path)
    if cached is None:
        peaks = probe(device)
    else:
        beaten = {d: v for d, v in (at_least or {}).items() if v > cached["matmul_tflops"].get(d, float("inf"))}
        if not beaten:
            return cached
        peaks = _higher(cached, probe(device), beaten)
    _write(path, peaks)
    return peaks


def _read(path: Path) -> dict | None:
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # none yet, or a torn or hand-edited cache file: measure again
    return cached if {"copy_gbps", "matmul_tflops", "device"} <= set(cached) else None


def _write(path: Path, peaks: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(peaks, indent=2))
    os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one


def _higher(cached: dict, fresh: dict, seen: dict[str, float]) -> dict:
    """Each figure at the highest of the cache, a new probe and what ops were seen to reach: a
    busy machine only ever makes a probe read low."""
    old, new = cached["matmul_tflops"], fresh["matmul_tflops"]
    tflops = {d: max(old[d], new.get(d, 0.0), seen.get(d, 0.0)) for d in old}
    return {**cached, "copy_gbps": max(cached["copy_gbps"], fresh["copy_gbps"]), "matmul_tflops": tflops,
            "measured_at": fresh["measured_at"], "torch": fresh["torch"],
            "raised": {d: {"cached": old[d], "probed": new.get(d), "seen": v} for d, v in seen.items()}}


def probe(device: str = "cpu") -> dict:
    """Measure now, without the cache."""
    dev = torch.device(device)
    budgets = GPU_BUDGET_S if dev.type == "cuda" else CPU_BUDGET_S
    copy_gbps = _copy_gbps(dev, budgets["copy"])
    tflops = {}
    for name, dtype in PROBE_DTYPES.items():
        value = _matmul_tflops(dev, dtype, budgets["matmul"])
        if value is not None:
            tflops[name] = value
    return {
        "device": device_name(device),
        "device_type": dev.type,
        "copy_gbps": copy_gbps,
        "matmul_tflops": tflops,
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "method": ("best of several reps: dst.copy_(src) on a buffer far larger than the caches "
                   "(gbps = read+write bytes / time); square a @ b per dtype (tflops = 2 n^3 / time)"
                   + ("; fp32 with TF32 off" if dev.type == "cuda" else "; CPU figures")),
    }


class _Clock:
    """Wall time of a callable on the device: CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, dev: torch.device):
        self.dev = dev

    def seconds(self, fn) -> float:
        if self.dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def _best_of(clock: _Clock, fn, budget_s: float, min_reps: int = 3, max_reps: int = 50) -> float:
    fn()  # warm-up: first touch of the pages, kernel selection
    best, spent, reps = float("inf"), 0.0, 0
    while reps < min_reps or (spent < budget_s and reps < max_reps):
        t = clock.seconds(fn)
        best, spent, reps = min(best, t), spent + t, reps + 1
    return best


def _copy_gbps(dev: torch.device, budget_s: float) -> float:
    # 64 MiB per buffer on a CPU (past any L3), 1 GiB on a GPU (past any L2)
    numel = (256 if dev.type == "cuda" else 16) * 2**20
    src = torch.ones(numel, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    seconds = _best_of(_Clock(dev), lambda: dst.copy_(src), budget_s)
    return 2 * numel * src.element_size() / seconds / 1e9


def _matmul_tflops(dev: torch.device, dtype: torch.dtype, budget_s: float) -> float | None:
    clock = _Clock(dev)
    # 512 on a CPU: many short reps, so that the best of them misses the stalls a busy machine
    # inflicts on a thread pool, and the probe stays within its budget
    max_n = 8192 if dev.type == "cuda" else 512
    n = 256
    try:
        with _strict_fp32():
            a = torch.randn(n, n, device=dev).to(dtype)
            seconds = _best_of(clock, lambda: a @ a, budget_s / 4, min_reps=1, max_reps=3)
            # grow the problem until one product takes ~1/10 of the budget: small ones are overhead
            target_s = budget_s / 10
            grown = int(min(max_n, max(256, n * (target_s / max(seconds, 1e-9)) ** (1 / 3))) // 128 * 128)
            if grown == n:  # slow already (fp16 on a CPU): the first reps are the measurement
                return 2 * n**3 / seconds / 1e12
            n = grown
            a = torch.randn(n, n, device=dev).to(dtype)
            seconds = _best_of(clock, lambda: a @ a, budget_s * 3 / 4, min_reps=2)
    except RuntimeError:
        return None  # this dtype has no matmul on this device
    return 2 * n**3 / seconds / 1e12


class _strict_fp32:
    """TF32 off while probing, restored after: the fp32 roof must be IEEE fp32's."""

    def __enter__(self):
        self.saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.saved
