"""The LLM agent on a KernelBench problem: a Proposer whose prompt holds the problem's source, the
current best ModelNew with what the judge said about it, and the recent experiments."""
from __future__ import annotations

from autokernel.search.proposer import SearchContext

SYSTEM = """You are an expert GPU kernel engineer. You write ModelNew for a KernelBench problem: a \
drop-in replacement for the problem's Model whose forward computes the same output with custom \
Triton kernels (@triton.jit, launched from forward). Each reply is one experiment: one idea, the \
complete file.

How the judge works, and what it rejects:
- It builds Model and ModelNew from the problem's get_init_inputs() under the same seed and copies \
Model's parameters and buffers into ModelNew where names and shapes match: ModelNew.__init__ takes \
Model's arguments, and keeping Model's submodule names keeps its weights.
- Inputs come only from the problem's get_inputs(), five seeded sets; outputs must match Model's \
with torch.allclose(atol=rtol={tol}), same shape and dtype. Trials that zeros or a constant would \
pass do not count.
- forward must launch at least one kernel of its own. PyTorch compute beside your kernels is \
allowed but flagged, and leaving the main op (matmul, convolution, softmax, norm) to PyTorch is \
flagged.
- No results cached across calls, no writes into inputs, no returning an input's storage: inputs \
are refilled in place between timed calls and timed outputs are checked.
- Timing is CUDA events with a cold L2, against eager PyTorch and torch.compile; speedups over 10x \
are reviewed by a person.
- Before import, a static check refuses the file unless it imports only torch, torch.nn, \
torch.nn.functional, torch.utils.cpp_extension, triton, triton.language, math, typing; it refuses \
attribute stores other than self.<name> in __init__, getattr/setattr/format/repr/str, state kept \
between calls (global, module-level containers changed, caches), and any use of sys, os, builtins, \
ctypes, gc, inspect, importlib, subprocess, open, exec, eval, compile, __import__, __dict__, \
__globals__ and __code__. The solution runs in an OS sandbox \
(no writes outside its scratch folder, no network) and a replaced clock fails the solution.
- The file is complete and self-contained: imports, kernels, helpers, class ModelNew."""


def _fmt(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.4g}{unit}"


def best_section(ctx: SearchContext) -> str:
    if not ctx.best_source.strip():
        return "## Current best ModelNew\nNone yet: write the first one.\n"
    v = ctx.best_verdict or {}
    timing = v.get("timing") or {}
    head = "## Current best ModelNew"
    if timing:
        head += (f": {_fmt(timing.get('median_us'), ' us')}, {_fmt(v.get('speedup_vs_eager'), 'x')} vs eager, "
                 f"{_fmt(v.get('speedup_vs_compile'), 'x')} vs torch.compile")
    flags = "".join(f"\n- judge's flag: {f}" for f in v.get("flags") or [])
    return f"{head}{flags}\n```python\n{ctx.best_source.rstrip()}\n```\n"


def build_messages(ctx: SearchContext, problem_source: str, tolerance: float) -> list[dict[str, str]]:
    from autokernel.search import prompt
    import playbook
    device = ctx.device or {}
    device_line = f"## Device: {device.get('name') or device.get('type') or 'unknown'}"
    if device.get("type") == "cpu":
        device_line += ("\nNo GPU here: kernels run under the Triton interpreter; timings are CPU "
                        "interpreter time. Favour changes that are sound on a GPU.")
    last = ctx.last
    section = playbook.choose(ctx.kernel_type, failed_stage=last.failed_stage if last else None,
                              experiments=ctx.proposals + 1)
    parts = [f"# Experiment {ctx.experiment}: a faster ModelNew for KernelBench problem {ctx.target}\n",
             f"## The problem (Model is the reference)\n```python\n{problem_source.rstrip()}\n```\n",
             device_line + "\n", best_section(ctx), prompt.history_section(ctx.history),
             prompt.last_reply_section(ctx), f"## Playbook (tier {section.tier})\n{section.text}",
             prompt.strategy_section(ctx),
             "## Your turn\nFirst line: what you changed and why. Then the complete file, defining "
             "ModelNew, in one ```python block."]
    return [{"role": "system", "content": SYSTEM.format(tol=f"{tolerance:g}")},
            {"role": "user", "content": "\n".join(p for p in parts if p)}]


def kernelbench_proposer(client, problem_source: str, tolerance: float):
    """The LLM proposer (name "llm") for one problem: the generic one, asking KernelBench's prompt."""
    from autokernel.search.llm_agent import LLMProposer
    return LLMProposer(client, messages_for=lambda ctx: build_messages(ctx, problem_source, tolerance))
