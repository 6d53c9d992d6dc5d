"""The messages for one LLM experiment.

System: what the model is and the rules of the judge (playbook/rules.md). User: the kernel type's
contract and reference, the target's shapes and dtype, the device and its measured peaks, the best
kernel so far in full with its timing and roofline position, the recent experiments with what the
judge said about each failure, and the playbook section that fits where the search stands.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import playbook

if TYPE_CHECKING:
    from autokernel.search.proposer import Experiment, SearchContext

RECENT_EXPERIMENTS = 8
MESSAGE_CHARS = 700  # a failing stage's detail, cut: enough to act on, not a page of traceback

SYSTEM = """You are an expert GPU kernel engineer. You improve one {backend} kernel at a time for a \
fixed judge that checks correctness against a float64 reference, blocks every shortcut listed in \
the rules, and times only kernels that pass. Each reply is one experiment: one idea, the complete \
kernel file.

{rules}"""


def _fmt(value: float | None, unit: str = "", digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}{unit}"


def contract_section(ctx: "SearchContext") -> str:
    from harness import registry
    kt = registry.get(ctx.kernel_type)
    rtol, atol = kt.tolerances.get(ctx.dtype, (None, None))
    sweep = "; ".join("x".join(str(v) for v in dims.values()) + (f" {kw}" if kw else "")
                      for dims, kw in kt.sweep[:8])
    return (f"## Contract: {ctx.kernel_type}\n"
            f"Signature: `{kt.signature_text()}`\n\n"
            "Reference (what the output must equal, computed in float64 by the judge):\n"
            f"```python\n{kt.reference_source.strip()}\n```\n"
            f"Tolerance for {ctx.dtype}: rtol {rtol}, atol {atol} (relative to the row's magnitude).\n"
            f"Correctness is also checked at other shapes, e.g. {sweep}, plus non-contiguous and "
            "offset inputs: the kernel must handle any size, not only the target's.\n")


def target_section(ctx: "SearchContext") -> str:
    dims = ", ".join(f"{k}={v}" for k, v in ctx.dims.items())
    return (f"## Target: {ctx.target}\n"
            f"Timed at dims {dims}, dtype {ctx.dtype}, backend {ctx.backend}. "
            "This is the shape in the model being optimised: make it fast here.\n")


def device_section(ctx: "SearchContext") -> str:
    device = ctx.device or {}
    name = device.get("name") or device.get("type") or "unknown"
    lines = [f"## Device: {name} ({device.get('type', '?')})"]
    for key in ("capability", "sms", "memory_gb", "cores"):
        if device.get(key) is not None:
            lines.append(f"- {key}: {device[key]}")
    roofline = (ctx.best_verdict or {}).get("roofline") or {}
    gbps = ctx.peaks.get("copy_gbps") or roofline.get("peak_gbps")
    tflops = ctx.peaks.get("matmul_tflops") or roofline.get("peak_tflops")
    if isinstance(tflops, dict):
        tflops = tflops.get(ctx.dtype) or max(tflops.values(), default=None)
    lines.append(f"- measured peaks: memory {_fmt(gbps, ' GB/s')}, compute {_fmt(tflops, ' TFLOP/s')} "
                 f"({ctx.dtype})")
    if device.get("type") == "cpu":
        lines.append("- no GPU here: kernels run under the Triton interpreter and timings are CPU "
                     "interpreter time. Favour changes that are sound on a GPU; fewer, larger "
                     "programs and fewer launches also help the interpreter.")
    return "\n".join(lines) + "\n"


def best_section(ctx: "SearchContext") -> str:
    verdict = ctx.best_verdict or {}
    timing, roofline = verdict.get("timing") or {}, verdict.get("roofline") or {}
    head = "## Current best kernel"
    if timing:
        head += (f": median {_fmt(timing.get('median_us'), ' us')} (IQR {_fmt(timing.get('iqr_us'), ' us')}), "
                 f"{_fmt(timing.get('speedup_vs_eager'), 'x', 3)} vs PyTorch eager "
                 f"({_fmt(timing.get('baseline_median_us'), ' us')})")
    lines = [head]
    if roofline:
        lines.append(f"Roofline: {roofline.get('bound', '?')}-bound, {_fmt(roofline.get('gbps'), ' GB/s')}, "
                     f"{_fmt(roofline.get('tflops'), ' TFLOP/s')}, {_fmt(roofline.get('pct_of_peak'), '%', 3)} "
                     "of the measured peak.")
    resources = verdict.get("resources") or {}
    if resources:
        lines.append("Compiled for " + ", ".join(f"{k} {v}" for k, v in resources.items() if v is not None) + ".")
    lines.append(f"```python\n{ctx.best_source.rstrip()}\n```")
    return "\n".join(lines) + "\n"


def history_section(history: "list[Experiment]") -> str:
    recent = history[-RECENT_EXPERIMENTS:]
    if not recent:
        return ""
    lines = ["## Recent experiments (oldest first)",
             "| # | decision | verdict | failed stage | median us | vs best | description |",
             "|---|---|---|---|---|---|---|"]
    for e in recent:
        description = e.description.replace("|", "/")[:100]
        lines.append(f"| {e.number} | {e.decision} | {e.verdict} | {e.failed_stage or '-'} | "
                     f"{_fmt(e.median_us)} | {_fmt(e.speedup_vs_best, 'x', 3)} | {description} |")
    failures = [e for e in recent if e.failed_stage]
    if failures:
        lines.append("\nWhat the judge said about each failure:")
        for e in failures:
            message = e.message if len(e.message) <= MESSAGE_CHARS else e.message[:MESSAGE_CHARS] + " ..."
            lines.append(f"- experiment {e.number} failed `{e.failed_stage}`: {message}")
    return "\n".join(lines) + "\n"


def last_reply_section(ctx: "SearchContext") -> str:
    last = ctx.last
    if last is None or last.failed_stage != "parse":
        return ""
    return ("## Your previous reply\nIt held no complete ```python block, so nothing was judged. "
            "This time end your reply with the whole kernel file in one ```python block.\n")


def playbook_section(ctx: "SearchContext") -> str:
    roofline = (ctx.best_verdict or {}).get("roofline") or {}
    last = ctx.last
    section = playbook.choose(ctx.kernel_type, bound=roofline.get("bound"),
                              failed_stage=last.failed_stage if last else None,
                              experiments=ctx.proposals + 1)
    return f"## Playbook (tier {section.tier})\n{section.text}"


def build_messages(ctx: "SearchContext") -> list[dict[str, str]]:
    """The chat messages for experiment `ctx.experiment` on `ctx.target`."""
    system = SYSTEM.format(backend=ctx.backend, rules=playbook.read("rules").strip())
    parts = [f"# Experiment {ctx.experiment}: make `{ctx.kernel_type}` faster on {ctx.target}\n",
             contract_section(ctx), target_section(ctx), device_section(ctx), best_section(ctx),
             history_section(ctx.history), last_reply_section(ctx), playbook_section(ctx),
             "## Your turn\nPropose one change that should make the current best kernel faster "
             "without breaking any stage. First line: what you changed and why. Then the complete "
             "file in one ```python block."]
    return [{"role": "system", "content": system},
            {"role": "user", "content": "\n".join(p for p in parts if p)}]


def render(messages: list[dict[str, str]]) -> str:
    """The messages as one markdown document (the run's exp_NNNN.prompt.md)."""
    return "\n\n".join(f"<!-- {m['role']} -->\n{m['content']}" for m in messages) + "\n"
