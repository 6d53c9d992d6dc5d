"""The backward object's `timing` and `memory`, read by the judging process.

The candidate's figures are the reps the judge's witness was told of as they ended (phases
bwd:forward, bwd:backward, bwd:forward_backward), never the worker's record of them; eager
autograd's and torch.compile's joint graph's are the clean baseline worker's
(harness/workers/baseline.py). A timed backward call that computed with PyTorch fails the backward.
"""
from __future__ import annotations

from harness.timing.backward_timing import NOT_ON_CPU, STEPS


def assess(back: dict, events: list[dict], witnessed, device: str, baselines: dict) -> dict:
    """`back` with its timing stage decided and its timing and memory filled in."""
    from harness.verdict.backward_checks import replace_stage
    end = next((e for e in events if e.get("event") == "stage_end" and e.get("stage") == "backward:timing"), None)
    if end is None:
        return replace_stage(back, "timing", "fail", "the worker did not time the backward")
    if end.get("status") != "pass":
        return replace_stage(back, "timing", "fail", end.get("detail", "the backward's timing failed"))
    # the reference op in disguise, only where no output is checked: a timed call computing with PyTorch
    if end.get("forbidden") or end.get("host_reads"):
        ops = ", ".join((end.get("forbidden") or []) + (end.get("host_reads") or []))
        return replace_stage(back, "timing", "fail", f"PyTorch compute or host reads while timed: {ops}")
    timing = {"method": None, "representative_of_gpu": device == "cuda"}
    for step in STEPS:
        figure = _witnessed(witnessed, f"bwd:{step}", device)
        if figure is None:
            return replace_stage(back, "timing", "fail", f"the worker timed {step} without reporting its reps "
                                                         "to the judge as they ended")
        timing["method"] = figure["method"]
        timing[step] = {**{k: figure[k] for k in ("median_us", "iqr_us", "reps")},
                        **_against(figure["median_us"], baselines.get(step, {}))}
    back = replace_stage(back, "timing", "pass", _words(timing))
    back["stages"][-1]["seconds"] = end.get("seconds", 0.0)
    back["timing"] = timing
    back["memory"] = _memory(end.get("memory") or {}, baselines.get("forward_backward", {}).get("eager"), device)
    return back


def _witnessed(witnessed, phase: str, device: str) -> dict | None:
    from harness.timing.timer import summary
    reps = witnessed.reps(phase) if witnessed is not None else None
    if reps is None or not reps.samples_us:
        return None
    return summary(reps.samples_us, device).to_json()


def _against(median_us: float, figures: dict) -> dict:
    out = {}
    for how in ("eager", "compiled"):
        figure = figures.get(how)
        base = (figure.timing or {}).get("median_us") if figure is not None else None
        out[f"{how}_median_us"] = base
        out[f"speedup_vs_{how}"] = (base / median_us) if base and median_us > 0 else None
        if figure is not None and figure.error:
            out[f"{how}_error"] = figure.error
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
