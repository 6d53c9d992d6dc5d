"""`autokernel bench --suite starters`: every starter kernel judged at its bench shapes.

On a GPU: the LLaMA-7B-like bench shapes in fp16, one judge at a time (timings must not share the
device). Without one: the small CPU bench shapes under the Triton interpreter, two judges at a time,
every timing labelled as interpreter time; CUDA C++ starters compile for the target only.
Rows are reported as they finish (stderr, and a JSONL file with --jsonl), so a run stopped by a time
limit keeps what it had.

A starter that gives a backward (backward_fn) is judged whole, as `bench FILE` judges it: its
backward's stages and timing too (forward, backward and one forward plus backward, against eager
autograd and torch.compile's joint graph), and its row fails when its backward does. `--no-backward`
judges the forwards alone, the quicker look; each row then says its backward was not judged.
"""
from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console
from rich.table import Table

from autokernel.errors import UsageError

SUITES = ("starters",)
BACKENDS = ("triton", "cuda")


def suite_targets(device: str, dtype: str | None = None):
    from harness.kernel_types import registry
    from harness.kernel_types.registry import Case
    for name in registry.names():
        kt = registry.get(name)
        dims = kt.bench_shape if device == "cuda" else kt.cpu_bench_shape
        yield Case.make(name, dims, dtype or ("float16" if device == "cuda" else "float32"), seed=7)


NOT_JUDGED = "not judged (--no-backward)"


def iter_suite(device: str, arch: str, timeout_s: float | None, types: list[str] | None = None,
               backends: tuple[str, ...] = BACKENDS, dtype: str | None = None, backward: bool = True):
    """Yield each verdict as soon as it (and every one before it) is judged: in suite order, or in
    the order of `types` when given. `backward`: a starter's backward_fn is judged too, where it
    gives one."""
    from harness.judge import judge
    from harness.workers.judge_session import judge_session
    from starter_kernels import TYPES_BY_BACKEND, starter_path
    # chain types have Triton starters only: no CUDA C++ row for them
    jobs = [(case, backend) for case in suite_targets(device, dtype) for backend in backends
            if (types is None or case.kernel_type in types) and case.kernel_type in TYPES_BY_BACKEND[backend]]
    if types is not None:  # in the order asked for: the rows wanted first come first
        jobs.sort(key=lambda job: types.index(job[0].kernel_type))

    def one(job):
        case, backend = job
        path = starter_path(case.kernel_type, backend)
        verdict = judge(path, target=case, device=device, arch=arch, timeout_s=timeout_s, compile_baseline=True,
                        backward=backward)
        verdict["target"] = case.label()
        return verdict if backward else mark_not_judged(verdict, path)

    with judge_session(), ThreadPoolExecutor(1 if device == "cuda" else 2) as pool:
        yield from pool.map(one, jobs)


def mark_not_judged(verdict: dict, path) -> dict:
    """A verdict of a file judged with --no-backward: where the file gives a backward_fn, it says its
    backward was not judged, so that the row does not read as a forward-only file's."""
    from harness.correctness.candidate import read_header
    try:
        has_backward = read_header(path).get("has_backward_fn")
    except (OSError, SyntaxError):  # the verdict already says why the file could not be judged
        has_backward = False
    if has_backward and verdict.get("backward") is None:
        verdict["backward_skipped"] = NOT_JUDGED
    return verdict


def judge_suite(device: str, arch: str, timeout_s: float | None, types: list[str] | None = None,
                backends: tuple[str, ...] = BACKENDS, dtype: str | None = None, backward: bool = True) -> list[dict]:
    return list(iter_suite(device, arch, timeout_s, types, backends, dtype, backward))


def parse_backends(backend: str) -> tuple[str, ...]:
    if backend == "both":
        return BACKENDS
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}", "use triton, cuda or both")
    return (backend,)


def run_suite(suite: str, *, json_out: bool, timeout_s: float | None, device: str | None, arch: str,
              types: list[str] | None = None, backend: str = "both", dtype: str | None = None,
              jsonl: str | None = None, backward: bool = True) -> int:
    """Judge the suite. Each verdict is reported the moment it is in: a one-line row on stderr and,
    with `jsonl`, one JSON line appended to that file ("-": stdout), so a run cut short keeps every
    finished row. At the end: the table, or with `json_out` one JSON list, on stdout. The exit
    status is suite_status's."""
    from harness.judge import JudgeUsageError, resolve_device
    if suite not in SUITES:
        raise UsageError(f"unknown suite {suite!r}", f"use one of: {', '.join(SUITES)}")
    try:
        device = resolve_device(device)
    except JudgeUsageError as e:
        raise UsageError(str(e)) from None
    backends = parse_backends(backend)
    from harness.kernel_types import registry
    unknown = sorted(set(types or ()) - set(registry.names()))
    if unknown:
        raise UsageError(f"unknown kernel type(s) {', '.join(unknown)}",
                         f"known types are {', '.join(registry.names())}")
    stream = None if jsonl is None else (sys.stdout if jsonl == "-" else open(jsonl, "a", encoding="utf-8"))
    verdicts = []
    try:
        for verdict in iter_suite(device, arch, timeout_s, types, backends, dtype, backward):
            verdicts.append(verdict)
            print(row_line(verdict), file=sys.stderr, flush=True)
            if stream is not None:
                stream.write(json.dumps(verdict) + "\n")
                stream.flush()
    finally:
        if stream is not None and stream is not sys.stdout:
            stream.close()
    if json_out:
        print(json.dumps(verdicts))
    elif jsonl != "-":
        render_suite(verdicts, Console(width=max(Console().width, 220)))  # 17 columns, none folded
    return suite_status(verdicts)


def suite_status(verdicts: list[dict]) -> int:
    """0 when every forward passed (or compiled, where it cannot run) and every backward judged
    passed; else 1. A starter whose backward fails serves inference only: a broken training half."""
    forwards = all(v["verdict"] in ("PASS", "COMPILE_ONLY") for v in verdicts)
    backwards = all((v.get("backward") or {}).get("verdict", "PASS") == "PASS" for v in verdicts)
    return 0 if forwards and backwards else 1


def backward_word(v: dict) -> str:
    """The backward's verdict in a row: PASS, FAIL (stage), none (the file gives no backward_fn), or
    not judged (--no-backward)."""
    back = v.get("backward")
    if back is None:
        return v.get("backward_skipped") or "none"
    return back["verdict"] + (f" ({back['failed_stage']})" if back.get("failed_stage") else "")


def backward_figures(v: dict) -> dict:
    """The backward's own median and one forward plus backward's, against eager autograd's."""
    timing = (v.get("backward") or {}).get("timing") or {}
    both = timing.get("forward_backward") or {}
    return {"bwd_us": (timing.get("backward") or {}).get("median_us"), "fwd_bwd_us": both.get("median_us"),
            "fwd_bwd_eager_us": both.get("eager_median_us"), "fwd_bwd_vs_eager": both.get("speedup_vs_eager")}


def row_line(v: dict) -> str:
    """One verdict as one line of text: what the table row says, readable while the suite runs."""
    t, res = v.get("timing") or {}, v.get("resources") or {}
    verdict = v["verdict"] + (f" ({v['failed_stage']})" if v.get("failed_stage") else "")
    b = backward_figures(v)
    parts = [v.get("target", ""), v.get("backend") or "", verdict,
             f"median {_fmt(t.get('median_us'), '.1f')} us", f"eager {_fmt(t.get('baseline_median_us'), '.1f')} us",
             f"vs eager {_fmt(t.get('speedup_vs_eager'), '.3f')}x",
             f"vs compile {_fmt(t.get('speedup_vs_compile'), '.3f')}x",
             f"backward {backward_word(v)}", f"bwd {_fmt(b['bwd_us'], '.1f')} us",
             f"fwd+bwd {_fmt(b['fwd_bwd_us'], '.1f')} us", f"fwd+bwd eager {_fmt(b['fwd_bwd_eager_us'], '.1f')} us",
             f"fwd+bwd vs eager {_fmt(b['fwd_bwd_vs_eager'], '.3f')}x",
             f"regs {_fmt(res.get('registers'), 'd')}", f"spills {_fmt(res.get('spills'), 'd')}",
             f"smem {_fmt(res.get('shared_bytes'), 'd')} B"]
    if v.get("sandbox") is not None:
        parts.append(f"sandbox {v['sandbox'] if isinstance(v['sandbox'], str) else json.dumps(v['sandbox'])}")
    return " | ".join(parts)


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_suite(verdicts: list[dict], console: Console) -> None:
    cpu = any(v.get("timing") and not v["timing"]["representative_of_gpu"] for v in verdicts)
    title = "starter kernels" + (" — CPU interpreter time: says nothing about GPU speed" if cpu else "")
    table = Table(title=title)
    for col in ("target", "backend", "verdict", "median us", "eager us", "vs eager", "vs compile",
                "backward", "bwd us", "fwd+bwd us", "fwd+bwd vs eager",
                "GB/s", "TFLOP/s", "% peak", "regs", "spills", "smem B"):
        table.add_column(col, justify="left" if col in ("target", "backend", "verdict", "backward") else "right")
    for v in verdicts:
        t, r, res = v.get("timing") or {}, v.get("roofline") or {}, v.get("resources") or {}
        verdict = v["verdict"] + (f" ({v['failed_stage']})" if v.get("failed_stage") else "")
        pct = r.get("pct_of_peak")
        b = backward_figures(v)
        table.add_row(v.get("target", ""), v.get("backend") or "", verdict, _fmt(t.get("median_us"), ".1f"),
                      _fmt(t.get("baseline_median_us"), ".1f"), _fmt(t.get("speedup_vs_eager"), ".3f"),
                      _fmt(t.get("speedup_vs_compile"), ".3f"), backward_word(v), _fmt(b["bwd_us"], ".1f"),
                      _fmt(b["fwd_bwd_us"], ".1f"), _fmt(b["fwd_bwd_vs_eager"], ".3f"), _fmt(r.get("gbps"), ".3g"),
                      _fmt(r.get("tflops"), ".3g"), _fmt(None if pct is None else 100 * pct, ".1f"),
                      _fmt(res.get("registers"), "d"), _fmt(res.get("spills"), "d"),
                      _fmt(res.get("shared_bytes"), "d"))
    console.print(table)
