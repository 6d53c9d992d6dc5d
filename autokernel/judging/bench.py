"""`autokernel bench`: judge one kernel file (or every starter) and render the verdict."""
from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autokernel.errors import UsageError

STATUS_STYLE = {"pass": "green", "fail": "bold red", "skip": "dim"}
VERDICT_STYLE = {"PASS": "bold green", "COMPILE_ONLY": "bold cyan", "FAIL": "bold red",
                 "CRASH": "bold red", "TIMEOUT": "bold red"}


def exit_status(verdict: dict) -> int:
    if verdict.get("usage_error"):
        return 2
    return 0 if verdict["verdict"] in ("PASS", "COMPILE_ONLY") else 1


def run(file: Path | None, *, json_out: bool, timeout_s: float | None, device: str | None,
        arch: str, suite: str | None, backend: str = "both", dtype: str | None = None,
        jsonl: str | None = None, types: list[str] | None = None, sandbox: bool = True,
        backward: bool = True) -> int:
    """`backward`: judge a file's backward_fn too, where it gives one (--no-backward: the forward alone)."""
    from harness.judge import JudgeUsageError, judge
    if suite is not None:
        from autokernel.judging.suite import run_suite
        return run_suite(suite, json_out=json_out, timeout_s=timeout_s, device=device, arch=arch,
                         types=types, backend=backend, dtype=dtype, jsonl=jsonl, backward=backward)
    if jsonl is not None or dtype is not None or types is not None or backend != "both":
        raise UsageError("--jsonl, --dtype, --types and --backend apply to --suite only",
                         "autokernel bench --suite starters --backend triton --dtype bfloat16")
    if file is None:
        raise UsageError("no kernel file given", "autokernel bench path/to/kernel.py, or --suite starters")
    try:
        # a file benched on its own is judged whole: its backward too, where it has one
        verdict = judge(file, device=device, arch=arch, timeout_s=timeout_s, sandbox=sandbox, backward=backward)
    except JudgeUsageError as e:
        raise UsageError(str(e), "check the path, or pass --device cpu on a machine without a GPU") from None
    if not backward:
        from autokernel.judging.suite import mark_not_judged
        verdict = mark_not_judged(verdict, file)
    if json_out:
        print(json.dumps(verdict))
    else:
        render(verdict, Console())
    if verdict.get("usage_error"):
        Console(stderr=True).print(f"[bold red]Error:[/] {verdict['usage_error']}", highlight=False)
    return exit_status(verdict)


def render(verdict: dict, console: Console) -> None:
    style = VERDICT_STYLE.get(verdict["verdict"], "bold")
    title = f"{verdict['kernel_file']}  ({verdict.get('kernel_type')}, {verdict.get('backend')})"
    table = Table(title=title, show_lines=False)
    table.add_column("stage")
    table.add_column("status")
    table.add_column("seconds", justify="right")
    table.add_column("detail", overflow="fold")
    for s in verdict["stages"]:
        table.add_row(s["name"], f"[{STATUS_STYLE.get(s['status'], '')}]{s['status']}[/]",
                      f"{s['seconds']:.2f}", s["detail"])
    console.print(table)
    console.print(f"verdict: [{style}]{verdict['verdict']}[/]"
                  + (f"  (failed stage: {verdict['failed_stage']})" if verdict["failed_stage"] else ""))
    render_backward(verdict, console)
    t, r, res = verdict.get("timing"), verdict.get("roofline"), verdict.get("resources")
    if t:
        label = "" if t["representative_of_gpu"] else \
            "  [yellow]CPU interpreter time: says nothing about GPU speed[/]"
        console.print(f"timing ({t['shape']}): median {t['median_us']:.1f} us, IQR {t['iqr_us']:.1f} us, "
                      f"{t['reps']} reps; eager {t['baseline_median_us']:.1f} us; "
                      f"speedup vs eager {t['speedup_vs_eager']:.3f}x{label}")
    if r:
        pct = f", {100 * r['pct_of_peak']:.1f}% of the measured peak ({r['bound']}-bound)" if r.get("pct_of_peak") else ""
        console.print(f"roofline: {r['gbps']:.3g} GB/s, {r['tflops']:.3g} TFLOP/s{pct}"
                      + (" [CPU figures]" if r.get("cpu_figures") else ""))
    if res:
        console.print(f"resources ({res.get('arch')}): {res.get('registers')} registers, "
                      f"{res.get('spills')} bytes spilled, {res.get('shared_bytes')} bytes shared memory")


def render_backward(verdict: dict, console: Console) -> None:
    """A file with backward_fn: its backward's stages and verdict, and what the file serves."""
    back = verdict.get("backward")
    if back is not None:
        table = Table(title="backward", show_lines=False)
        for column in ("stage", "status", "seconds", "detail"):
            table.add_column(column, justify="right" if column == "seconds" else "left",
                             overflow="fold" if column == "detail" else "ellipsis")
        for s in back["stages"]:
            table.add_row(s["name"], f"[{STATUS_STYLE.get(s['status'], '')}]{s['status']}[/]",
                          f"{s['seconds']:.2f}", s["detail"])
        console.print(table)
        style = VERDICT_STYLE.get(back["verdict"], "bold")
        console.print(f"backward: [{style}]{back['verdict']}[/]"
                      + (f"  (failed stage: {back['failed_stage']})" if back.get("failed_stage") else ""))
        memory = back.get("memory")
        if memory:
            console.print("memory (forward+backward): " + (
                f"peak {memory['peak_bytes'] / 2**20:.1f} MiB, eager {memory['eager_peak_bytes'] / 2**20:.1f} MiB"
                if memory.get("measured") and memory.get("eager_peak_bytes") else memory.get("detail", "measured")))
    elif verdict.get("backward_skipped"):
        console.print(f"backward: {verdict['backward_skipped']}")
    if verdict.get("serves"):
        console.print(f"serves: {verdict['serves']}")
