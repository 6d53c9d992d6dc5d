"""Showing a verify result (autokernel/deploy/verify.py writes it): the summary table, what could not run
on this machine, and the verdict, raised as a UserError when verify failed so the command exits 1;
and `after_optimize`, verify as `optimize` runs it at its end.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from autokernel.errors import UserError
from autokernel.deploy.verify import FILENAME, Log


def after_optimize(run_path: str | Path, log: Log) -> int:
    """`autokernel verify` at the end of `optimize`: the winners run in a sandboxed child on a copy
    of the run (a kernel that crashes the interpreter cannot take the run with it); the exit status
    `optimize` exits with, 1 when verify failed or could not run. Never raises: the run is kept."""
    from rich.console import Console

    from autokernel.deploy.verify_child import verify_confined
    try:
        result = verify_confined(run_path)
        render(result, Path(run_path), print_table=Console(width=max(Console().width, 120)).print, log=log)
    except (UserError, OSError) as e:
        log(f"verify did not pass: {e}")
        log(f"the run is kept: rerun `autokernel verify {run_path}` once it is fixed")
        return 1
    return 0


def render(result: dict, folder: Path, *, print_table: Callable[[Any], None], log: Log) -> None:
    """Show a verify result: the table, what could not run here, and the verdict (raises UserError
    when verify failed, so the command exits 1 naming the reasons)."""
    print_table(summary_table(result))
    if result.get("workload"):
        print_table(workload_table(result))
        log(f"verify: {result['workload']['summary']}")
    if result.get("train"):
        print_table(train_table(result["train"]))
    log(f"wrote {folder / FILENAME}")
    for target, why in result.get("not_run", {}).items():
        log(f"{target}: {why}; verify it on a machine that can run it")
    if result["status"] == "failed":
        raise UserError("verify failed: " + "; ".join(result["failures"]),
                        "`autokernel export` leaves the guilty kernels out; a winner that serves nothing or has "
                        "another dtype than the model's was searched at the wrong target: see verify.json")
    if result["status"] == "partial":
        log(f"verify: partial: {len(result['not_run'])} winner(s) not run on this machine, the rest ok "
            "(verify.json: \"ok\" is false; \"not_run\" says why)")


def _kernel_verdict(k: dict) -> str:
    if k["guilty"]:
        return "[red]GUILTY[/]"
    if k.get("not_run"):
        return "[yellow]NOT RUN[/]"
    if k.get("dtype_matches_model") is False:
        return "[red]WRONG DTYPE[/]"
    if k.get("alternative"):  # a chain or its members: the other side measured the larger gain
        return "[yellow]not bound: see chains[/]"
    if "training_loss_calls" in k:  # a loss: these forwards never call it; verify --train's steps do
        return "[green]served in training[/]" if k["training_loss_calls"] else "[yellow]training loss: see --train[/]"
    if k.get("not_served"):  # right, only not faster on this GPU: PyTorch kept its calls
        return "[yellow]not faster here: not served[/]"
    if k["calls_served"] == 0:
        return "[red]SERVED NOTHING[/]"
    return "[green]ok[/]"


def _inputs_judged(result: dict) -> str:
    sets = (result.get("workload") or {}).get("sets")
    if not sets:
        return f"{len(result['seeds'])} seeded inputs"
    return f"{sum(len(s['seeds']) for s in sets)} forwards on {len(sets)} input sets"


def summary_table(result: dict) -> Any:
    """verify.json as a rich Table: per target, calls served and fallbacks; the e2e result below."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    cpu = " (CPU figures: Triton interpreter)" if result.get("cpu_figures") else ""
    table = Table(title=f"verify {result['run_id']} on {result['device_name']}{cpu}", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for name in ("target", "route", "served", "fallbacks", "main fallback reason", "kernel vs eager", "verdict"):
        table.add_column(name, justify="right" if name in ("served", "fallbacks", "kernel vs eager") else "left",
                         overflow="fold")
    for target, k in result["per_kernel"].items():
        reasons = k.get("fallback_reasons") or {}
        reason = max(reasons, key=reasons.get) if reasons else ""
        speedup = k.get("kernel_speedup_vs_eager")
        table.add_row(escape(target), k["route"], str(k["calls_served"]), str(k["fallbacks"]), escape(reason[:60]),
                      f"{speedup:.3g}x" if speedup else "", _kernel_verdict(k))
    match = "match" if result["outputs_match"] else "DIFFER"
    e2e = result.get("e2e_speedup")
    reference = (result.get("acceptance") or {}).get("reference_dtype", "float64")
    table.caption = (f"outputs {match} (rms error vs the model in {reference}: patched "
                     f"{result.get('patched_err_vs_reference', 0):.3g}, eager {result.get('eager_err_vs_reference', 0):.3g} "
                     f"of the output's rms, over {_inputs_judged(result)}); end to end {e2e:.3g}x measured"
                     f" vs {result['projected_e2e_speedup']:.3g}x projected"
                     + (f"; {result['e2e_speedup_vs_compile']:.3g}x vs torch.compile"
                        if result.get("e2e_speedup_vs_compile") else ""))
    table.caption_justify = "left"
    return table


def workload_table(result: dict) -> Any:
    """verify.json's workload: per input set, the calls served and fallen back, accuracy, times."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    sets = result["workload"]["sets"]
    compiled = any(s.get("patched_compile_median_us") for s in sets)
    table = Table(title=f"workload ({result['workload']['source']})", title_justify="left", box=box.SIMPLE_HEAD)
    names = ["input set", "served", "fallbacks", "main fallback reason", "rms error (patched / eager)",
             "eager us", "patched us", "speedup"] + (["compiled: patched vs plain"] if compiled else [])
    for name in names:
        table.add_column(name, justify="left" if name in ("input set", "main fallback reason") else "right",
                         overflow="fold")
    for s in sets:
        reasons = s.get("fallback_reasons") or {}
        reason = max(reasons, key=reasons.get) if reasons else ""
        match = "" if s["outputs_match"] else " [red]DIFFER[/]"
        row = [escape(s["name"]), str(s["calls_served"]), str(s["fallbacks"]), escape(reason[:60]),
               f"{s['patched_err_vs_reference']:.2g} / {s['eager_err_vs_reference']:.2g}{match}",
               f"{s['eager_median_us']:,.0f}", f"{s['patched_median_us']:,.0f}",
               f"{s['e2e_speedup']:.3g}x" if s.get("e2e_speedup") else ""]
        if compiled:
            speedup = s.get("compiled_e2e_speedup")
            row.append(f"{speedup:.3g}x" if speedup else escape(str(s.get("compile_error") or "")[:40]))
        table.add_row(*row)
    return table


RUN_NAMES = {"eager": "eager", "patched": "with the winners", "compile": "torch.compile",
             "patched_compile": "torch.compile, with the winners", "liger": "Liger Kernel"}


def train_summary(train: dict) -> str:
    """verify --train's comparison in a few sentences: the fine-tuning run, then the second workload."""
    tol = train["tolerances"]
    text = (f"{train['steps']} {train['optimizer']} steps ({train['step']}): training with the winners "
            f"{'matches' if train['match'] else 'DIFFERS FROM'} eager; largest relative difference: loss "
            f"{_g(train.get('worst_loss_rel_err'))} (tolerance {tol['loss']:g}), first gradients "
            f"{_worst_words(train.get('worst_grad_rel_err'))}, parameter changes "
            f"{_worst_words(train.get('worst_param_change_rel_err'))}; served under autograd: "
            f"{', '.join(train['served_under_autograd']) or 'none (no winner has a judged backward)'}")
    if train.get("not_compared"):
        text += f"; not compared: {', '.join(train['not_compared'])}"
    second = train.get("second_workload")
    if not second:
        return text
    if second.get("skipped"):
        return text + f". Second workload left out: {second['skipped']}"
    padded = f"{second['padded_labels']} padded labels, " if second.get("padded_labels") else ""
    zeroed = ", ".join(second.get("zeroed_norm_weights") or []) or "no norm weight in the model"
    return text + (f". Second workload, one step at {second['name']} ({padded}zeroed: {zeroed}): "
                   f"{'matches' if second['match'] else 'DIFFERS FROM'} eager; loss "
                   f"{_g(second.get('worst_loss_rel_err'))}, gradients {_worst_words(second.get('worst_grad_rel_err'))}")


def memory_words(train: dict) -> str:
    """The training step's peak memory, eager and with the winners, in one sentence ('' when not measured)."""
    memory = train.get("memory") or {}
    if not memory.get("eager"):
        return f"Peak memory of one training step not measured: {memory['skipped']}" if memory.get("skipped") else ""
    eager, patched = memory["eager"], memory["patched"]

    def mib(n: Any) -> str:
        return f"{n / 2**20:.2f} MiB"
    text = (f"Peak memory of one training step (weights and optimizer state + the most the CPU allocator held "
            f"during it): eager {mib(eager['peak_bytes'])}, with the winners {mib(patched['peak_bytes'])}, "
            f"{memory['patched_over_eager_peak']:.3f} of eager's (the step's allocations alone: "
            f"{mib(eager['allocator_peak_bytes'])} and {mib(patched['allocator_peak_bytes'])})")
    if eager.get("cuda_max_memory_allocated") is not None and patched.get("cuda_max_memory_allocated") is not None:
        text += (f"; torch.cuda.max_memory_allocated over the step: eager {mib(eager['cuda_max_memory_allocated'])}, "
                 f"with the winners {mib(patched['cuda_max_memory_allocated'])}, "
                 f"{memory['patched_over_eager_cuda_peak']:.3f} of eager's")
    return text


def _worst_words(worst: Any) -> str:
    """'3e-07 (norm.weight; tolerance 0.0001)' for a comparison's worst parameter."""
    if not worst:
        return "-"
    return f"{_g(worst.get('rel_err'))} ({worst['parameter']}; tolerance {worst.get('tolerance', 0):g})"


def _g(value: Any) -> str:
    return "-" if value is None else f"{value:.2g}"


def train_rows(train: dict) -> list[list[str]]:
    """Per run: step ms, throughput, peak memory, speedup vs eager, or why it was not timed."""
    figures, rows = train["throughput"], []
    for name, f in figures["runs"].items():
        if f.get("skipped"):
            rows.append([RUN_NAMES.get(name, name), "", "", "", "", f["skipped"]])
            continue
        peak = f.get("peak_memory_mb")
        rows.append([RUN_NAMES.get(name, name), f"{f['step_ms']:,.1f}", f"{f['per_s']:,.1f}" if f.get("per_s") else "",
                     f"{peak:,.0f}" if peak is not None else "", f"{f['speedup_vs_eager']:.3g}x"
                     if f.get("speedup_vs_eager") else "", ""])
    return rows


def train_table(train: dict) -> Any:
    """verify.json's `train` as a rich Table: per run the figures, the comparison below."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table
    figures = train["throughput"]
    cpu = " (CPU figures: Triton interpreter)" if not figures["representative_of_gpu"] else ""
    table = Table(title=f"verify --train{cpu}", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("run", "step ms", figures["unit"], "peak MB", "vs eager", "not timed because"):
        table.add_column(name, justify="left" if name in ("run", "not timed because") else "right", overflow="fold")
    for row in train_rows(train):
        table.add_row(*[escape(c) for c in row])
    memory = memory_words(train)
    table.caption = escape(train_summary(train) + (f". {memory}" if memory else ""))
    table.caption_justify = "left"
    return table
