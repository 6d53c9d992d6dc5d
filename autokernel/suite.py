"""`autokernel bench --suite starters`: every starter kernel judged at its bench shapes.

On a GPU: the LLaMA-7B-like bench shapes in fp16, one judge at a time (timings must not share the
device). Without one: the small CPU bench shapes under the Triton interpreter, two judges at a time,
every timing labelled as interpreter time; CUDA C++ starters compile for the target only.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console
from rich.table import Table

from autokernel.errors import UsageError

SUITES = ("starters",)


def suite_targets(device: str, dtype: str | None = None):
    from harness import registry
    from harness.registry import Case
    for name in registry.names():
        kt = registry.get(name)
        dims = kt.bench_shape if device == "cuda" else kt.cpu_bench_shape
        yield Case.make(name, dims, dtype or ("float16" if device == "cuda" else "float32"), seed=7)


def judge_suite(device: str, arch: str, timeout_s: float | None, types: list[str] | None = None,
                backends: tuple[str, ...] = ("triton", "cuda"), dtype: str | None = None) -> list[dict]:
    from harness.judge import judge
    from harness.judge_session import judge_session
    from starter_kernels import starter_path
    jobs = [(case, backend) for case in suite_targets(device, dtype) for backend in backends
            if types is None or case.kernel_type in types]

    def one(job):
        case, backend = job
        verdict = judge(starter_path(case.kernel_type, backend), target=case, device=device, arch=arch,
                        timeout_s=timeout_s, compile_baseline=True)
        verdict["target"] = case.label()
        return verdict

    with judge_session(), ThreadPoolExecutor(1 if device == "cuda" else 2) as pool:
        return list(pool.map(one, jobs))


def run_suite(suite: str, *, json_out: bool, timeout_s: float | None, device: str | None, arch: str,
              types: list[str] | None = None) -> int:
    from harness.judge import JudgeUsageError, resolve_device
    if suite not in SUITES:
        raise UsageError(f"unknown suite {suite!r}", f"use one of: {', '.join(SUITES)}")
    try:
        device = resolve_device(device)
    except JudgeUsageError as e:
        raise UsageError(str(e)) from None
    verdicts = judge_suite(device, arch, timeout_s, types)
    if json_out:
        print(json.dumps(verdicts))
    else:
        render_suite(verdicts, Console(width=max(Console().width, 170)))
    return 0 if all(v["verdict"] in ("PASS", "COMPILE_ONLY") for v in verdicts) else 1


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_suite(verdicts: list[dict], console: Console) -> None:
    cpu = any(v.get("timing") and not v["timing"]["representative_of_gpu"] for v in verdicts)
    title = "starter kernels" + (" — CPU interpreter time: says nothing about GPU speed" if cpu else "")
    table = Table(title=title)
    for col in ("target", "backend", "verdict", "median us", "eager us", "vs eager", "vs compile",
                "GB/s", "TFLOP/s", "% peak", "regs", "spills", "smem B"):
        table.add_column(col, justify="left" if col in ("target", "backend", "verdict") else "right")
    for v in verdicts:
        t, r, res = v.get("timing") or {}, v.get("roofline") or {}, v.get("resources") or {}
        verdict = v["verdict"] + (f" ({v['failed_stage']})" if v.get("failed_stage") else "")
        pct = r.get("pct_of_peak")
        table.add_row(v.get("target", ""), v.get("backend") or "", verdict, _fmt(t.get("median_us"), ".1f"),
                      _fmt(t.get("baseline_median_us"), ".1f"), _fmt(t.get("speedup_vs_eager"), ".3f"),
                      _fmt(t.get("speedup_vs_compile"), ".3f"), _fmt(r.get("gbps"), ".3g"),
                      _fmt(r.get("tflops"), ".3g"), _fmt(None if pct is None else 100 * pct, ".1f"),
                      _fmt(res.get("registers"), "d"), _fmt(res.get("spills"), "d"),
                      _fmt(res.get("shared_bytes"), "d"))
    console.print(table)
