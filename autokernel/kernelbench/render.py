"""Plain-text renderings of a KernelBench verdict and of a run's score (the CLI prints them)."""
from __future__ import annotations


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}x"


def _us(timing: dict | None) -> str:
    if not timing:
        return "-"
    return f"{timing['median_us']:.1f} us (IQR {timing['iqr_us']:.1f}, {timing['reps']} reps)"


def verdict_text(v: dict) -> str:
    lines = [f"{v['verdict']}  {v['problem_key']}  <-  {v['solution']}",
             f"  device {v['device'].get('name') or v['device'].get('type')}, {v['precision']}, "
             f"atol=rtol={v['tolerance']:g}"]
    trials = v.get("trials") or []
    if trials:
        passed, counted = sum(t["passed"] for t in trials), sum(t["counted"] for t in trials)
        errors = [t["max_abs_err"] for t in trials if t["max_abs_err"] is not None]
        worst = f"; max abs error {max(errors):.3g}" if errors else ""
        lines.append(f"  trials: {passed}/{len(trials)} passed, {counted} counted{worst}")
    integrity = v.get("integrity") or {}
    if integrity:
        ops = ", ".join(integrity.get("pytorch_ops") or []) or "none"
        lines.append(f"  kernels launched per trial: {integrity.get('launches_per_trial')}; "
                     f"PyTorch compute outside them: {ops}")
    timing = v.get("timing")
    if timing:
        lines.append(f"  solution {_us(timing)}")
        lines.append(f"  eager    {_us(timing.get('eager'))}  -> speedup {_x(v['speedup_vs_eager'])}")
        lines.append(f"  compile  {_us(timing.get('compile'))}  -> speedup {_x(v['speedup_vs_compile'])}")
    if v.get("failed_stage"):
        lines.append(f"  failed at {v['failed_stage']}: {v['reason']}")
    if v.get("stderr_tail"):
        lines.append("  stderr (tail):\n    " + v["stderr_tail"].replace("\n", "\n    "))
    lines += [f"  flag: {f}" for f in v.get("flags") or []]
    lines += [f"  note: {n}" for n in v.get("notes") or []]
    return "\n".join(lines)


def score_text(s: dict) -> str:
    ps = list(s["fast_p"]["eager"])
    lines = [f"{s['correct']} of {s['problems']} problems correct",
             "baseline  " + "  ".join(f"fast_{p:<5s}" for p in ps) + "  geomean (over)"]
    for b in ("eager", "compile"):
        row = "  ".join(f"{s['fast_p'][b][p]:<10.3f}" for p in ps)
        lines.append(f"{b:<8s}  {row}  {_x(s['geomean_speedup'][b])} ({s['geomean_over'][b]})")
    if s.get("missing_compile_baseline"):
        lines.append(f"{s['missing_compile_baseline']} correct problem(s) have no torch.compile baseline")
    if s.get("flagged"):
        lines.append(f"flagged for review: {', '.join(s['flagged'])}")
    return "\n".join(lines)
