"""The messages for one LLM experiment.

System: what the model is and the rules of the judge (playbook/rules.md). User: the kernel type's
contract and reference, the target's shapes and dtype, the device and its measured peaks, the parent
kernel in full (usually the best so far) with its timing and roofline position, one or two other
elites as inspirations, the recent experiments with what the judge said about each failure (and
each time it did not trust), the playbook section that fits where the search stands, and what the
visit's strategy asks for.

`level` makes the prompt smaller for a server that refused it for its length: 1 shows fewer
history rows, a shorter playbook and no inspirations; 2 no history, no playbook, no inspirations.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import playbook

if TYPE_CHECKING:
    from autokernel.search.proposer import Experiment, SearchContext

RECENT_EXPERIMENTS = 8
MESSAGE_CHARS = 700  # a failing stage's detail, cut: enough to act on, not a page of traceback
LEVELS = 3  # prompt sizes: 0 whole, 1 smaller, 2 smallest
SHORT_PLAYBOOK_CHARS = 1500
INSPIRATION_CHARS = 4000  # an inspiration longer than this is cut: it is there for its idea

SYSTEM = """You are an expert GPU kernel engineer. You improve one {backend} kernel at a time for a \
fixed judge that checks correctness against a float64 reference, blocks every shortcut listed in \
the rules, and times only kernels that pass. Each reply is one experiment: one idea, the complete \
kernel file.

{rules}"""


def _fmt(value: float | None, unit: str = "", digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}{unit}"


def contract_section(ctx: "SearchContext") -> str:
    from harness.kernel_types import registry
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


def backward_section(kernel_type: str) -> str:
    """For a training target: the backward's signature for `kernel_type` and the playbook's
    training page (the contract in words, and how to write a backward)."""
    from harness.kernel_types import registry
    kt = registry.get(kernel_type)
    params = ", ".join(p if p not in kt.defaults else f"{p}={kt.defaults[p]!r}" for p in kt.params)
    return (f"## Training target: give a backward too\n"
            f"Signature: `backward_fn(grad_out, out, {params})`\n\n"
            f"{playbook.read(playbook.TRAINING).strip()}\n")


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
    from autokernel.search.decision import ranked
    verdict = (ranked(ctx.best_verdict) if ctx.training else ctx.best_verdict) or {}
    timing, roofline = verdict.get("timing") or {}, verdict.get("roofline") or {}
    if ctx.parent_source is not None:  # another elite, or the starter: the best is named, not shown
        what = "the starter" if ctx.parent_number == 0 else f"experiment {ctx.parent_number}"
        return (f"## Parent kernel: {what}, median {_fmt(ctx.parent_median_us, ' us')} (the best so far: "
                f"{_fmt(timing.get('median_us'), ' us')})\nStart from this kernel, not from the best.\n"
                f"```python\n{ctx.parent_source.rstrip()}\n```\n")
    head = "## Current best kernel"
    if timing:
        both = " for one forward plus backward" if timing.get("step") == "forward_backward" else ""
        head += (f": median {_fmt(timing.get('median_us'), ' us')}{both} (IQR {_fmt(timing.get('iqr_us'), ' us')}), "
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
    said = [e for e in recent if e.failed_stage or e.message]
    if said:
        lines.append("\nWhat the judge said about each failure, and each time it did not trust:")
        for e in said:
            message = e.message if len(e.message) <= MESSAGE_CHARS else e.message[:MESSAGE_CHARS] + " ..."
            what = f"failed `{e.failed_stage}`" if e.failed_stage else "passed, but"
            lines.append(f"- experiment {e.number} {what}: {message}")
    return "\n".join(lines) + "\n"


def inspirations_section(ctx: "SearchContext") -> str:
    if not ctx.inspirations:
        return ""
    lines = ["## Other good kernels of this search (for ideas; start from the one above)"]
    for e in ctx.inspirations:
        source = e["source"] if len(e["source"]) <= INSPIRATION_CHARS else e["source"][:INSPIRATION_CHARS] + "\n# ..."
        lines.append(f"Experiment {e['number']}, median {_fmt(e.get('median_us'), ' us')}: "
                     f"{e.get('description', '')[:120]}\n```python\n{source.rstrip()}\n```")
    return "\n".join(lines) + "\n"


def last_reply_section(ctx: "SearchContext") -> str:
    last = ctx.last
    if last is not None and last.failed_stage == "truncated":
        return ("## Your previous reply\nIt was cut off at the token limit before it ended, so nothing was "
                "judged. This time keep it short: one or two sentences, then the complete kernel file, "
                "compact, in one ```python block.\n")
    if last is None or last.failed_stage != "parse":
        return ""
    return ("## Your previous reply\nIt held no complete ```python block, so nothing was judged. "
            "This time end your reply with the whole kernel file in one ```python block.\n")


def playbook_section(ctx: "SearchContext", level: int = 0) -> str:
    if level >= 2:
        return ""
    roofline = (ctx.best_verdict or {}).get("roofline") or {}
    last = ctx.last
    # the "next tier" strategy moves the advice on by a tier for each plateau
    skip = playbook.EXPERIMENTS_PER_TIER * ctx.parks if ctx.strategy == "next_tier" else 0
    section = playbook.choose(ctx.kernel_type, bound=roofline.get("bound"),
                              failed_stage=last.failed_stage if last else None,
                              experiments=ctx.proposals + 1 + skip)
    text = section.text if level == 0 else section.text[:SHORT_PLAYBOOK_CHARS] + "\n..."
    return f"## Playbook (tier {section.tier})\n{text}"


def strategy_section(ctx: "SearchContext") -> str:
    """What this visit's strategy asks for (autokernel.search.schedule): the first visit refines."""
    if ctx.strategy == "next_tier":
        return ("## Strategy: the next tier\nThe last experiments found nothing faster. Leave the ideas "
                "tried so far: apply the playbook tier above, which this search has not used yet.\n")
    if ctx.strategy == "different_algorithm":
        return ("## Strategy: a different algorithm\nRefining the current kernel has stopped paying. Write "
                "a different algorithm for this operation, from the kernel above or from scratch: another "
                "decomposition, another reduction or tiling scheme, not a retuning of the same one.\n")
    if ctx.strategy == "ideas_first":
        if not ctx.ideas:
            return ("## Strategy: ideas first\nFirst list three distinct ideas that could make this kernel "
                    "faster, in words, one line each, numbered `1.` to `3.`. Then implement idea 1 only.\n")
        idea = ctx.ideas[max(ctx.visit_proposals, 0) % len(ctx.ideas)]
        return f"## Strategy: ideas first\nImplement this idea, and only this one: {idea}\n"
    return ""


def parse_ideas(text: str) -> list[str]:
    """The numbered ideas (`1.` ... `3.`) of an "ideas first" reply, in words, outside its code."""
    import re
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    ideas = [m.group(1).strip() for m in re.finditer(r"^\s*(?:\*\*)?[1-9][.)]\s*(.+)$", prose, re.M)]
    return [i[:300] for i in ideas if i][:3]


def build_messages(ctx: "SearchContext", level: int = 0) -> list[dict[str, str]]:
    """The chat messages for experiment `ctx.experiment` on `ctx.target`; `level` 1 or 2: smaller
    (a server refused the bigger one for its length)."""
    system = SYSTEM.format(backend=ctx.backend, rules=playbook.read("rules").strip())
    history = ctx.history if level == 0 else ctx.history[-3:] if level == 1 else []
    parts = [f"# Experiment {ctx.experiment}: make `{ctx.kernel_type}` faster on {ctx.target}\n",
             contract_section(ctx), backward_section(ctx.kernel_type) if ctx.training else "",
             target_section(ctx), device_section(ctx), best_section(ctx),
             inspirations_section(ctx) if level == 0 else "",
             history_section(history), last_reply_section(ctx), playbook_section(ctx, level),
             strategy_section(ctx),
             "## Your turn\nPropose one change that should make the kernel above faster "
             "without breaking any stage. First line: what you changed and why. Then the complete "
             "file in one ```python block."]
    return [{"role": "system", "content": system},
            {"role": "user", "content": "\n".join(p for p in parts if p)}]


def render(messages: list[dict[str, str]]) -> str:
    """The messages as one markdown document (the run's exp_NNNN.prompt.md)."""
    return "\n\n".join(f"<!-- {m['role']} -->\n{m['content']}" for m in messages) + "\n"
