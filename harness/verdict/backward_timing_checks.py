"""The backward object's `timing` and `memory`, read by the judging process.

The candidate's figures are the reps the judge's witness was told of as they ended (phases
bwd:forward, bwd:backward, bwd:forward_backward), never the worker's record of them; eager
autograd's and torch.compile's joint graph's are the clean baseline worker's
(harness/workers/baseline.py). Every timed call is held to the rules and its outputs to their
references (harness/verdict/backward_timed_checks.py): one that computed with PyTorch, or gave a
wrong answer, fails the backward.
"""
from __future__ import annotations

from harness.timing.backward_timing import NOT_ON_CPU, STEPS


def assess(back: dict, events: list[dict], witnessed, device: str, baselines: dict, case=None,
           out_dir=None) -> dict:
    """`back` with its timing stage decided and its timing and memory filled in. `case`: the timing
    case, whose every timed call is checked (the outputs saved under `out_dir`)."""
    from harness.verdict.backward_checks import replace_stage
    from harness.verdict.backward_timed_checks import timed_problem
    from harness.verdict.records import RecordProblem
    end = next((e for e in events if e.get("event") == "stage_end" and e.get("stage") == "backward:timing"), None)
    if end is None:
        return replace_stage(back, "timing", "fail", "the worker did not time the backward")
    if end.get("status") != "pass":
        return replace_stage(back, "timing", "fail", end.get("detail", "the backward's timing failed"))
    try:
        problem = timed_problem(events, end, case, device, out_dir, witnessed) if case is not None else \
            "the judge has no timing case to check the backward's timed calls against"
    except RecordProblem as e:  # a saved output rewritten after it was saved
        problem = str(e)
    if problem:
        # a timed call that did nothing, answered an old grad_out, or computed with PyTorch
        return replace_stage(back, "timing", "fail", problem)
    timing = {"method": None, "representative_of_gpu": device == "cuda"}
    for step in STEPS:
        figure = _witnessed(witnessed, f"bwd:{step}", device)
        if figure is None:
            return replace_stage(back, "timing", "fail", f"the worker timed {step} without reporting its reps "
                                                         "to the judge as they ended")
        if not figure["agrees"]:
            # a clock swapped for the timed calls: the judge's own clock disagrees, as for the forward
            return replace_stage(back, "timing", "fail", f"{step.replace('_', '+')}: {figure['disagreement']}")
        timing["method"] = figure["method"]
        timing[step] = {**{k: figure[k] for k in ("median_us", "iqr_us", "reps")},
                        **_against(figure["median_us"], baselines.get(step, {}))}
    back = replace_stage(back, "timing", "pass", _words(timing))
    back["stages"][-1]["seconds"] = end.get("seconds", 0.0)
    back["timing"] = timing
    back["memory"] = _memory(end.get("memory") or {}, baselines.get("forward_backward", {}).get("eager"), device)
    return back


def _witnessed(witnessed, phase: str, device: str) -> dict | None:
    """The figures of the reps the witness was told of, and whether its own clock backs them."""
    from harness.timing.timer import summary
    from harness.timing.witness import agreement, disagreement_text
    reps = witnessed.reps(phase) if witnessed is not None else None
    if reps is None or not reps.samples_us:
        return None
    check = agreement(reps, witnessed.reps("null"))
    return {**summary(reps.samples_us, device).to_json(), "agrees": check["agrees"],
            "disagreement": None if check["agrees"] else disagreement_text(check)}


NOT_COMPILED = ("not timed: torch.compile's joint graph is timed on a GPU, and on the CPU only on request "
                "(the interpreter's time compares nothing with Inductor's C++)")


def _against(median_us: float, figures: dict) -> dict:
    out = {}
    for how in ("eager", "compiled"):
        figure = figures.get(how)
        base = (figure.timing or {}).get("median_us") if figure is not None else None
        out[f"{how}_median_us"] = base
        out[f"speedup_vs_{how}"] = (base / median_us) if base and median_us > 0 else None
        if figure is not None and figure.error:
            out[f"{how}_error"] = figure.error
    if "compiled" not in figures:
        out["compiled_note"] = NOT_COMPILED
    return out


def _words(timing: dict) -> str:
    parts = []
    for step in STEPS:
        t = timing[step]
        eager = f", {t['speedup_vs_eager']:.3g}x eager" if t.get("speedup_vs_eager") else ""
        compiled = f", {t['speedup_vs_compiled']:.3g}x torch.compile" if t.get("speedup_vs_compiled") else ""
        parts.append(f"{step.replace('_', '+')} {t['median_us']:.1f} us{eager}{compiled}")
    gpu = "" if timing["representative_of_gpu"] else " (CPU interpreter time: says nothing about a GPU)"
    return "; ".join(parts) + gpu


def _memory(mine: dict, eager, device: str) -> dict:
    if device != "cuda" or not mine.get("measured"):
        return {"measured": False, "detail": NOT_ON_CPU if device != "cuda" else mine.get("detail", "not measured")}
    theirs = (eager.memory or {}) if eager is not None else {}
    out = {"measured": True, "peak_bytes": mine["peak_bytes"], "eager_peak_bytes": theirs.get("peak_bytes")}
    if theirs.get("peak_bytes"):
        out["ratio_vs_eager"] = mine["peak_bytes"] / theirs["peak_bytes"]
    return out
