"""The command line: parse options, call the library, render. Nothing else lives here.

Set AUTOKERNEL_DEBUG=1 to see full tracebacks instead of one-line errors.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console

from autokernel.errors import UserError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Profile a PyTorch model and search for faster Triton/CUDA kernels for its bottlenecks.")
err = Console(stderr=True)


def main() -> None:
    """Entry point: turns our exceptions into `Error: ...` lines with a hint and an exit status."""
    try:
        status = app(standalone_mode=False)
    except UserError as e:
        if os.environ.get("AUTOKERNEL_DEBUG"):
            raise
        err.print(f"[bold red]Error:[/] {e.message}", highlight=False)
        if e.hint:
            err.print(f"  hint: {e.hint}", highlight=False)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err.print("Interrupted.")
        sys.exit(130)
    except Exception as e:
        if hasattr(e, "show") and hasattr(e, "exit_code"):  # the parser's own usage errors
            e.show()
            sys.exit(e.exit_code)
        if type(e).__name__ == "Abort":
            err.print("Aborted.")
            sys.exit(130)
        raise
    sys.exit(status if isinstance(status, int) else 0)


@app.callback()
def _root() -> None:
    """Profile a PyTorch model and search for faster Triton/CUDA kernels for its bottlenecks."""


# ---- bench (the judge) ----------------------------------------------------------------------
@app.command()
def bench(
    file: Optional[Path] = typer.Argument(None, help="A kernel file (see DESIGN: KERNEL_TYPE, BACKEND, kernel_fn)."),
    json_out: bool = typer.Option(False, "--json", help="Print exactly one verdict JSON object on stdout."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Wall-clock limit in seconds (default per device)."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu (default: cuda if present)."),
    arch: str = typer.Option("sm_90", "--arch", help="Target architecture for compile-for-target checks."),
    suite: Optional[str] = typer.Option(None, "--suite", help="'starters': judge every starter kernel."),
    backend: str = typer.Option("both", "--backend", help="With --suite: triton, cuda or both."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="With --suite: float32, float16 or bfloat16 "
                                                              "(default: float16 on a GPU, float32 on a CPU)."),
    jsonl: Optional[str] = typer.Option(None, "--jsonl", help="With --suite: append one JSON line per verdict "
                                                              "to this file as it finishes ('-': stdout)."),
    types: Optional[str] = typer.Option(None, "--types", help="With --suite: comma-separated kernel types."),
    no_sandbox: bool = typer.Option(False, "--no-sandbox", help="Judge without the OS sandbox (the verdict says so)."),
    no_backward: bool = typer.Option(False, "--no-backward", help="Judge the forward alone, even where the file "
                                                                  "gives a backward_fn (quicker; serves inference)."),
) -> None:
    """Judge a kernel file: correctness stages, integrity checks, then timing; its backward too, where it has one."""
    from autokernel.judging import bench as bench_cmd
    code = bench_cmd.run(file, json_out=json_out, timeout_s=timeout, device=device, arch=arch, suite=suite,
                         backend=backend, dtype=dtype, jsonl=jsonl,
                         types=None if types is None else [t.strip() for t in types.split(",") if t.strip()],
                         sandbox=not no_sandbox, backward=not no_backward)
    raise typer.Exit(code)
# ---- end bench ------------------------------------------------------------------------------


# ---- leaderboard ----------------------------------------------------------------------------
@app.command()
def leaderboard(
    run: Optional[str] = typer.Argument(None, help="A run id under --runs-dir, or a run folder. "
                                                   "Without it: the best result per target across every run."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where runs are written."),
    check: bool = typer.Option(False, "--check", help="Check RUN's records: every row against the sha256 of "
                                                      "its experiment file, best/ against the best rows."),
    lineage: Optional[str] = typer.Option(None, "--lineage", help="Show how TARGET's best kernel came to be: "
                                                                  "it, its parent, the parent's parent... "
                                                                  "(a target's name or the start of one)."),
) -> None:
    """Show a run's experiments, or the best kernel per target across all runs."""
    from rich.console import Console as _Console

    from autokernel.search import leaderboard as board
    out = _Console()
    if check:
        from autokernel.search import seal
        from autokernel.errors import UsageError
        if run is None:
            raise UsageError("--check needs a RUN", "e.g. autokernel leaderboard --check RUN_ID")
        folder = Path(run) if Path(run).is_dir() else runs_dir / run
        if not (folder / board.FILENAME).is_file():
            raise UserError(f"no leaderboard at {folder / board.FILENAME}", "pass a run id or a run folder")
        report = seal.require_sealed(folder, "not sealed")
        typer.echo(f"sealed: {report.summary()}")
        return
    if run is None:
        if lineage is not None:
            from autokernel.errors import UsageError
            raise UsageError("--lineage needs a RUN", "e.g. autokernel leaderboard RUN_ID --lineage softmax")
        best = board.best_per_target(runs_dir)
        if best.empty:
            raise UserError(f"no passing experiments in any run under {runs_dir}",
                            "run `autokernel optimize MODEL` first, or point --runs-dir at your runs")
        out.print(board.rich_table(best, board.BEST_VIEW, f"Best per target under {runs_dir}"))
        return
    folder = Path(run) if Path(run).is_dir() else runs_dir / run
    path = folder / board.FILENAME
    if not path.exists():
        known = ", ".join(p.name for p in board.run_dirs(runs_dir)[-5:]) or "none"
        raise UserError(f"no leaderboard at {path}", f"runs under {runs_dir}: {known}")
    if lineage is not None:
        chain = board.lineage(board.read(path), lineage)
        out.print(board.rich_table(chain, board.LINEAGE_VIEW, f"Lineage of the best kernel for {lineage} "
                                                              f"in run {folder.name} (oldest first)"))
        return
    out.print(board.rich_table(board.read(path), board.RUN_VIEW, f"Run {folder.name}"))
# ---- end leaderboard ------------------------------------------------------------------------


# ---- profile --------------------------------------------------------------------------------
from autokernel.profile.modelfile import ModelOptions, model_options  # noqa: E402  (shared by model commands)


@app.command()
@model_options
def profile(
    model: Path = typer.Argument(..., help="A KernelBench-format file, or any file with an nn.Module class."),
    json_path: Optional[str] = typer.Option(None, "--json", help="Write the profile JSON here ('-': stdout)."),
    trace: Optional[Path] = typer.Option(None, "--trace", help="Write a Chrome trace (chrome://tracing, Perfetto)."),
    records: Optional[Path] = typer.Option(None, "--records", help="Write the raw op and kernel records (JSON), "
                                           "to attribute again on another machine."),
    iters: int = typer.Option(10, "--iters", min=1, help="Profiled forwards (training steps with --train)."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Plain forwards (training steps) before profiling."),
    model_opts: ModelOptions = None,
) -> None:
    """Where the model's time goes, by kernel type, and what each bottleneck could be worth."""
    import json as _json

    from autokernel.profile import plan as plan_mod
    from autokernel.profile.modelfile import load_model
    from autokernel.profile.profiler import profile_model
    from harness.device.peaks import measured_peaks

    spec = model_opts.spec(model)
    loaded = load_model(spec)
    what = "training steps (forward, loss, backward, optimizer step)" if loaded.training else "forwards"
    err.print(f"profiling {model} on {spec.device}: {max(warmup, int(loaded.training))} warm-up + {iters} profiled {what}",
              highlight=False)
    prof = profile_model(loaded, iters=iters, warmup=warmup, trace_path=str(trace) if trace else None,
                         records_path=str(records) if records else None)
    peaks = measured_peaks(spec.device, at_least=plan_mod.achieved_tflops(prof))
    plan = plan_mod.make_plan(prof, peaks, model=spec.to_json())
    shown = Console(stderr=json_path == "-")
    if not shown.is_terminal:  # a pipe or a file: wide enough that target names stay whole
        shown = Console(stderr=json_path == "-", width=140 if loaded.training else 120)
    shown.print(plan_mod.table(plan))
    if plan.get("chains", {}).get("entries") or plan.get("chains", {}).get("rejected"):
        from autokernel.profile.chain_plan import table as chain_table
        shown.print(chain_table(plan))
    text = _json.dumps(plan, indent=2)
    if json_path == "-":
        sys.stdout.write(text + "\n")
    elif json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(text + "\n")
        err.print(f"wrote {json_path}", highlight=False)
    if trace:
        err.print(f"wrote {trace}", highlight=False)
# ---- end profile ----------------------------------------------------------------------------


# ---- optimize -------------------------------------------------------------------------------
from autokernel.profile.modelfile import ModelOptions as _ModelOptions  # noqa: E402
from autokernel.profile.modelfile import model_options as _model_options  # noqa: E402


@app.command()
@_model_options
def optimize(
    model: Optional[Path] = typer.Argument(None, help="A KernelBench-format file, or any file with an nn.Module class."),
    agent: Optional[str] = typer.Option(None, "--agent", help="llm or tune (default: llm when an API key is set, else tune)."),
    llm: Optional[str] = typer.Option(None, "--llm", help="Model name at the endpoint (default: gpt-4.1); "
                                      "cheap,strong: the second takes over a target after its plateau."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="An OpenAI-compatible endpoint, e.g. http://localhost:8000/v1."),
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env", help="The environment variable holding the API key."),
    budget: Optional[str] = typer.Option(None, "--budget", help="Search time for the whole run, e.g. 8h, 90m (default 8h)."),
    max_experiments: Optional[int] = typer.Option(None, "--max-experiments", min=0, help="Proposals per target after the baseline."),
    top: Optional[int] = typer.Option(None, "--top", min=1, help="Search at most this many of the plan's targets, "
                                                                 "in Amdahl order (default: every one)."),
    only: Optional[List[str]] = typer.Option(None, "--only", help="Search only targets of this kernel type, or whose name starts so (repeatable): module, 'module[MLP.gelu'."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where runs are written."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Continue the run with this id (also after a crash)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Wall-clock limit per judged candidate, seconds."),
    plain: bool = typer.Option(False, "--plain", help="Plain log lines even on a terminal."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Candidates judged at once: one per GPU (the first N), or N CPU slots on the CPU."),
    devices: Optional[str] = typer.Option(None, "--devices", help="CUDA devices to judge on, one candidate each, e.g. 0,1,2,3."),
    concurrency: Optional[int] = typer.Option(None, "--concurrency", min=1, help="LLM requests in flight at once (default 1)."),
    ray: Optional[str] = typer.Option(None, "--ray", help="Judge on a Ray cluster: its address, auto (the cluster this machine is in) or local."),
    max_tokens: Optional[int] = typer.Option(None, "--max-tokens", min=1, help="The LLM's reply limit per request (a reply cut off there is recorded as truncated)."),
    reasoning_effort: Optional[str] = typer.Option(None, "--reasoning-effort", help="low, medium or high: passed to a reasoning model where the server accepts it."),
    max_unusable: Optional[int] = typer.Option(None, "--max-unusable", min=1, help="Stop the run after this many LLM replies in a row with nothing that compiles (default 20)."),
    model_opts: _ModelOptions = None,
) -> None:
    """Profile MODEL, then search faster kernels for its bottlenecks until the budget is spent, where the
    end-to-end gain is largest, judging every candidate."""
    from autokernel import display as shown
    from autokernel.search import run_search
    from autokernel.search import run as runs
    from autokernel.search import start as run_start
    from autokernel.errors import UsageError
    from autokernel.search.slots import parse_devices
    budget_s = runs.parse_duration_s(budget) if budget is not None else None
    scale = {"workers": workers, "devices": parse_devices(devices), "concurrency": concurrency, "ray": ray,
             "max_tokens": max_tokens, "reasoning_effort": reasoning_effort, "max_unusable": max_unusable}
    if resume is not None:
        run, state, config = run_start.resume(runs_dir, resume, {"budget_s": budget_s, "timeout_s": timeout,
                                                             "max_experiments": max_experiments, **scale},
                                         log=lambda m: err.print(m, highlight=False))
    elif model is None:
        raise UsageError("give a MODEL file to optimize, or --resume RUN_ID", "e.g. autokernel optimize model.py --budget 2h")
    else:
        options = run_start.OptimizeOptions(agent=agent, llm=llm or run_start.DEFAULT_LLM, base_url=base_url,
                                       api_key_env=api_key_env, budget_s=budget_s or 8 * 3600.0,
                                       max_experiments=max_experiments, top=top, timeout_s=timeout,
                                       only=list(only) if only else None,
                                       **{k: v for k, v in scale.items() if v is not None})
        spec = model_opts.spec(model)
        if ray is None:  # a bad --workers/--devices fails before minutes of profiling
            from autokernel.search.slots import local_slots
            local_slots(spec.device, options.workers, options.devices)
        run, state, config = run_start.start(spec, options, runs_dir,
                                        log=lambda m: err.print(m, highlight=False))
    err.print(f"run {run.run_id} in {run.path} ({state.agent} agent)", highlight=False)
    view = shown.make_display(state, live=False if plain else None)
    try:
        state = run_search.execute(run, state, config, display=view)
    finally:
        view.close()
    raise typer.Exit(_after_search(run, state, config, runs_dir))


def _after_search(run, state, config: dict, runs_dir: Path) -> int:
    """Once the search stopped: the summary table, verify when it finished, how to resume when it was
    interrupted, why when the LLM gave nothing usable; the command's exit status."""
    from autokernel import display as shown
    cpu_figures = (config.get("device") or {}).get("type") == "cpu"
    Console(width=max(Console().width, 120)).print(shown.summary_table(state, cpu_figures))
    if state.status == "stopped":  # nothing usable: never "done", and not a success
        err.print(f"[bold red]Stopped:[/] {state.stop_reason}", highlight=False)
        err.print(f"after a change, continue with: autokernel optimize --resume {run.run_id} --runs-dir {runs_dir}",
                  highlight=False)
        return 1
    verified = 0
    if state.status == "done":  # the winners inside the model; a failure is the command's, the run is kept
        from autokernel.deploy.verify_report import after_optimize
        verified = after_optimize(run.path, log=lambda m: err.print(m, highlight=False))
    if state.status == "interrupted":
        err.print(f"resume with: autokernel optimize --resume {run.run_id} --runs-dir {runs_dir}", highlight=False)
    return 130 if state.status == "interrupted" else verified
# ---- end optimize ---------------------------------------------------------------------------


# ---- kernelbench ----------------------------------------------------------------------------
from autokernel.kernelbench.cli import kb_app  # noqa: E402  (eval, score, run)

app.add_typer(kb_app, name="kernelbench")
# ---- end kernelbench ------------------------------------------------------------------------


# ---- verify/report/export ----
@app.command()
def verify(
    run: str = typer.Argument(..., help="A run id under --runs-dir, or a run folder."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu (default: the run's)."),
    compile_baseline: Optional[bool] = typer.Option(None, "--compile/--no-compile",
                                                    help="Also time torch.compile of the model, unmodified and "
                                                         "patched (default: on a GPU only)."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where runs are written."),
    no_sandbox: bool = typer.Option(False, "--no-sandbox", help="Run the winners in this process, unconfined "
                                                                "(only when you trust every winner)."),
    train: Optional[bool] = typer.Option(None, "--train/--no-train",
                                         help="Also fine-tune the model with and without the winners and compare "
                                              "(default: when the run profiled a training step)."),
    steps: int = typer.Option(20, "--steps", min=1, help="Optimizer steps of the --train comparison."),
) -> None:
    """Plug the run's winners into the unmodified model: same outputs? how much faster end to end?"""
    from autokernel.deploy import verify as verifier
    from autokernel.errors import UsageError
    from autokernel.deploy.verify_child import verify_confined
    from autokernel.deploy.verify_report import render
    if device not in (None, "cpu", "cuda"):
        raise UsageError(f"--device {device!r} is not supported", "use cuda or cpu")
    folder = verifier.run_folder(run, runs_dir)
    if no_sandbox:
        err.print("WARNING: --no-sandbox: the winners run in this process with your rights", highlight=False)
        result = verifier.verify(folder, device=device, compile_baseline=compile_baseline,
                                 log=lambda m: err.print(m, highlight=False), train=train, steps=steps)
    else:  # the winners run in a sandboxed child on a copy of the run; this process writes verify.json
        result = verify_confined(folder, device, compile_baseline, train=train, steps=steps)
    render(result, folder, print_table=Console(width=max(Console().width, 120)).print,
           log=lambda m: err.print(m, highlight=False))


@app.command()
def report(
    run: str = typer.Argument(..., help="A run id under --runs-dir, or a run folder."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where runs are written."),
) -> None:
    """Write report.md and progress.png in the run: the plan, each target's search, the end-to-end result."""
    from autokernel.deploy import report as reporter
    from autokernel.deploy.verify import run_folder
    folder = run_folder(run, runs_dir)
    for path in reporter.write_report(folder):
        err.print(f"wrote {path}", highlight=False)


@app.command()
def export(
    run: str = typer.Argument(..., help="A run id under --runs-dir, or a run folder."),
    out: Path = typer.Option(..., "--out", help="Folder to write the autokernel_kernels package into."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where runs are written."),
    selftest: bool = typer.Option(False, "--selftest", help="Then run the package's selftest, sandboxed: each "
                                                            "kernel against PyTorch at its target shape."),
    format: str = typer.Option("package", "--format", help="package (DIR/autokernel_kernels/), or hf-kernels: a "
                                                           "Hugging Face kernel repository (DIR/autokernel-<run id>/) "
                                                           "whose layers kernels.kernelize binds."),
) -> None:
    """Write a self-contained package (torch + triton only) with the run's verified winners and patch(model)."""
    from autokernel.deploy import export as exporter
    from autokernel.deploy.verify import run_folder
    exporter.check_format(format)
    if format == "hf-kernels":
        from autokernel.deploy.hf_kernels import export_repository
        manifest = export_repository(run_folder(run, runs_dir), out)
    else:
        manifest = exporter.export(run_folder(run, runs_dir), out)
    if not manifest["verified"]:
        err.print(f"note: this run has no verify.json, so no kernel was checked inside the model; "
                  f"run `autokernel verify {run}` first", highlight=False)
    for left in manifest["left_out"]:
        err.print(f"left out {left['target']}: {left['reason']}", highlight=False)
    cuda = [k["target"] for k in manifest["kernels"] if k.get("backend") == "cuda"]
    if cuda:
        err.print(f"CUDA C++ kernel(s) {', '.join(cuda)}: they need a CUDA GPU, nvcc and nm where the package runs "
                  "(the launch library is built there); elsewhere their calls run in PyTorch", highlight=False)
    if format == "hf-kernels":
        err.print(f"wrote the kernel repository {manifest['repository']} with {len(manifest['kernels'])} kernel(s); "
                  f"layers {', '.join(x['layer'] for x in manifest['layers']) or 'none'} (its README.md shows "
                  "kernels.kernelize), the rest through its patch(model)", highlight=False)
    else:
        err.print(f"wrote {manifest['package']} with {len(manifest['kernels'])} kernel(s); "
                  f"use: with autokernel_kernels.patch(model): model(x)", highlight=False)
    if selftest:
        from autokernel.deploy.export_check import selftest_confined
        package = Path(manifest["package"])
        result = selftest_confined(package.parent, package=package.name)
        err.print(f"selftest (sandbox: {result['sandbox'].get('kind')}): "
                  + (", ".join(f"{t} error {e:.2g}" for t, e in result["errors"].items()) if result["ok"]
                     else result["failure"]), highlight=False)
        if not result["ok"]:
            raise UserError("the exported package's selftest failed", "see the line above; the package is written")
# ---- end verify/report/export ---------------------------------------------------------------
