"""`autokernel kernelbench ...`: the KernelBench sub-commands (eval, score, run), mounted on the
main command line by autokernel/cli.py. Like it: parse options, call the library, render.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

kb_app = typer.Typer(no_args_is_help=True, help="KernelBench: judge ModelNew solutions, search for them, score runs.")
err = Console(stderr=True)


@kb_app.command("eval")
def kernelbench_eval(
    problem: Path = typer.Option(..., "--problem", help="A KernelBench problem file (Model, get_inputs, get_init_inputs)."),
    solution: Path = typer.Option(..., "--solution", help="A file that defines ModelNew."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu (default: cuda if present)."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, fp16 or bf16 (atol=rtol 1e-4, 1e-2, 1e-2)."),
    json_out: bool = typer.Option(False, "--json", help="Print exactly one verdict JSON object on stdout."),
    timeout: float = typer.Option(300.0, "--timeout", help="Wall-clock limit in seconds for each child process."),
    reps: Optional[int] = typer.Option(None, "--reps", help="Timed reps (default: 100 on a GPU, 10 on the CPU)."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip the torch.compile baseline."),
    compile_timeout: Optional[float] = typer.Option(None, "--compile-timeout", help="Seconds for the torch.compile baseline (default: max(--timeout, 300))."),
    no_sandbox: bool = typer.Option(False, "--no-sandbox", help="Run the solution without the OS sandbox (the verdict says so)."),
) -> None:
    """Judge a ModelNew file against a problem's Model: correctness, integrity, timing."""
    import json
    from autokernel.judging import kb_evaluate
    from autokernel.kernelbench.render import verdict_text
    opts = kb_evaluate.EvalOptions(device=device, precision=precision, timeout_s=timeout, reps=reps,
                                   compile_baseline=not no_compile, compile_timeout_s=compile_timeout,
                                   sandbox=not no_sandbox)
    verdict = kb_evaluate.evaluate(problem, solution, opts)
    typer.echo(json.dumps(verdict, default=str) if json_out else verdict_text(verdict))
    raise typer.Exit(0 if verdict["correct"] else 1)


@kb_app.command("score")
def kernelbench_score(
    run: str = typer.Argument(..., help="A run id under --runs-dir, a run folder, or its kernelbench.json."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where runs are written."),
    export: Optional[Path] = typer.Option(None, "--export", help="Write level_{L}_problem_{id}_sample_0_kernel.py files here."),
    json_out: bool = typer.Option(False, "--json", help="Print the score as one JSON object on stdout."),
) -> None:
    """fast_p (p = 0, 0.5, 0.8, 1, 1.5, 2) and geometric-mean speedups vs eager and torch.compile."""
    import json
    from autokernel.kernelbench import score as kb_score
    from autokernel.kernelbench.render import score_text
    path = kb_score.summary_path(run, runs_dir)
    _, results = kb_score.load_results(path)
    result = kb_score.score(results)
    if export is not None:
        written, skipped = kb_score.export(results, path.parent, export)
        result["exported"] = [str(p) for p in written]
        for why in skipped:
            err.print(f"not exported: {why}", highlight=False)
    typer.echo(json.dumps(result) if json_out else score_text(result))


@kb_app.command("run")
def kernelbench_run(
    kb_dir: Optional[Path] = typer.Option(None, "--kb-dir", help="KernelBench's repository root, or the folder holding level1/ ... level4/."),
    level: Optional[int] = typer.Option(None, "--level", help="The level to search (1-4)."),
    problems: Optional[str] = typer.Option(None, "--problems", help="Problem ids, e.g. 1-10,17 (default: the whole level)."),
    agent: Optional[str] = typer.Option(None, "--agent", help="llm or tune (default: llm when an API key is set, else tune)."),
    budget_per_problem: str = typer.Option("30m", "--budget-per-problem", help="Search time per problem, e.g. 30m, 1h."),
    max_experiments: Optional[int] = typer.Option(None, "--max-experiments", min=0, help="Proposals per problem after the baseline."),
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="Where runs are written."),
    resume: Optional[str] = typer.Option(None, "--resume", help="Continue the run with this id (also after a crash)."),
    device: Optional[str] = typer.Option(None, "--device", help="cuda or cpu (default: cuda if present)."),
    precision: str = typer.Option("fp32", "--precision", help="fp32, fp16 or bf16."),
    llm: Optional[str] = typer.Option(None, "--llm", help="Model name at the endpoint (default: gpt-4.1)."),
    base_url: Optional[str] = typer.Option(None, "--base-url", help="An OpenAI-compatible endpoint, e.g. http://localhost:8000/v1."),
    api_key_env: str = typer.Option("OPENAI_API_KEY", "--api-key-env", help="The environment variable holding the API key."),
    timeout: float = typer.Option(300.0, "--timeout", help="Wall-clock limit in seconds for each judge child process."),
    reps: Optional[int] = typer.Option(None, "--reps", help="Timed reps (default: 100 on a GPU, 10 on the CPU)."),
    no_compile: bool = typer.Option(False, "--no-compile", help="Skip the torch.compile baseline."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Solutions judged at once: one per GPU (the first N), or N CPU slots on the CPU."),
) -> None:
    """Search ModelNew solutions for a level's problems; write kernelbench.json for `score`."""
    from autokernel.errors import UsageError
    from autokernel.kernelbench import run as kb_run
    from autokernel.kernelbench import score as kb_score
    from autokernel.kernelbench.render import score_text
    from autokernel.search.run import parse_duration_s
    budget_s = parse_duration_s(budget_per_problem)
    if resume is not None:
        run, state, config = kb_run.resume(runs_dir, resume, {"budget_per_problem_s": budget_s,
                                                              "max_experiments": max_experiments,
                                                              "workers": workers},
                                           log=lambda m: err.print(m, highlight=False))
    elif kb_dir is None or level is None:
        raise UsageError("give --kb-dir and --level (or --resume RUN_ID)",
                         "e.g. autokernel kernelbench run --kb-dir ~/KernelBench --level 1 --problems 1-10")
    else:
        options = kb_run.KBRunOptions(agent=agent, budget_per_problem_s=budget_s, max_experiments=max_experiments,
                                      llm=llm or kb_run.DEFAULT_LLM, base_url=base_url, api_key_env=api_key_env,
                                      device=device, precision=precision, timeout_s=timeout, reps=reps,
                                      compile_baseline=not no_compile, workers=workers or 1)
        run, state, config = kb_run.start(kb_dir, level, problems, options, runs_dir)
    err.print(f"run {run.run_id} in {run.path} ({state.agent} agent)", highlight=False)
    state = kb_run.execute(run, state, config, log=lambda m: err.print(m, highlight=False))
    _, results = kb_score.load_results(run.path / kb_score.SUMMARY_FILE)
    typer.echo(score_text(kb_score.score(results)))
    if state.status == "interrupted":
        err.print(f"resume with: autokernel kernelbench run --resume {run.run_id} --runs-dir {runs_dir}", highlight=False)
    raise typer.Exit(130 if state.status == "interrupted" else 0)
