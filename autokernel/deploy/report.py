"""`autokernel report`: a run as report.md and progress.png, in its own folder.

report.md says first whether its times are CPU-interpreter figures, then the end-to-end result
(verify.json), the plan, each target's search and the final table. progress.png draws each target's
speedup over PyTorch eager against the experiment number: one line per target (the best kept kernel
so far), keeps as filled circles, every passing candidate as a faint dot, failures as x markers on
the line where they happened. Everything is read back from the run's files (leaderboard.tsv through
autokernel.search.leaderboard's reader), never from a live search.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from autokernel.search import leaderboard as board
from autokernel.profile.plan import ceiling_cells, ceiling_notes
from autokernel.search.run import RunDir

REPORT = "report.md"
PLOT = "progress.png"
CPU_BANNER = ("> **CPU figures.** Every time in this report was measured on a CPU, with the Triton kernels "
              "running in the Triton interpreter. They show that the kernels are correct and how the search "
              "went; they say nothing about how fast the kernels are on a GPU.")


def write_report(run_path: str | Path) -> list[Path]:
    """Write report.md and progress.png into the run folder; their paths."""
    run = RunDir(run_path)
    frame = board.read(run.leaderboard_path)
    figure = plot_progress(frame, title=f"run {run.run_id}" + (" (CPU interpreter figures)" if _on_cpu(run) else ""))
    plot_path = run.path / PLOT
    figure.savefig(plot_path, dpi=110)
    report_path = run.path / REPORT
    report_path.write_text(render(run, frame), encoding="utf-8")
    return [report_path, plot_path]


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _read_state(run: RunDir) -> dict:
    """The state as last saved: state.json and its journal (autokernel.search.journal)."""
    from autokernel.errors import UserError
    try:
        return run.load_state().to_json()
    except (OSError, UserError):
        return {}


def _on_cpu(run: RunDir) -> bool:
    config = _read_json(run.config_path)
    return config.get("device", {}).get("type", "cpu") != "cuda"


# ---------------------------------------------------------------- the plot
def plot_progress(frame: Any, title: str = "") -> Any:
    """The progress figure (matplotlib, Agg canvas: no display needed); one Line2D per target."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
    figure = Figure(figsize=(9, 5))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    targets = list(dict.fromkeys(frame["target"])) if len(frame) else []
    colors = [f"C{i % 10}" for i in range(len(targets))]
    speedups = []
    for target, color in zip(targets, colors):
        rows = frame[frame["target"] == target].sort_values("experiment")
        x, best, ys = _best_so_far(rows)
        speedups += [y for y in ys if y is not None] + [b for b in best if b is not None]
        ax.step(x, [b if b is not None else math.nan for b in best], where="post", color=color, label=target)
        passed = [(e, y) for e, y in zip(x, ys) if y is not None]
        if passed:
            ax.scatter(*zip(*passed), color=color, alpha=0.35, s=14, gid=f"passed:{target}")
        kept = [(e, y) for e, y, k in zip(x, ys, _kept(rows)) if k and y is not None]
        if kept:
            ax.scatter(*zip(*kept), color=color, s=46, edgecolors="black", zorder=3, gid=f"kept:{target}")
        failed = [(e, b) for e, b, v in zip(x, best, rows["verdict"]) if v != "PASS"]
        if failed:
            floor = min((b for b in best if b is not None), default=1.0)
            ax.scatter([e for e, _ in failed], [b if b is not None else floor for _, b in failed],
                       color=color, marker="x", s=40, zorder=3, gid=f"failed:{target}")
    if speedups and max(speedups) / max(min(speedups), 1e-30) > 10:
        ax.set_yscale("log")  # CPU-interpreter speedups span orders of magnitude
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("experiment")
    ax.set_ylabel("speedup vs PyTorch eager (1 = eager)")
    ax.set_title(title or "speedup per experiment")
    if targets:
        ax.legend(fontsize="small", title="o kept, x failed", title_fontsize="small")
    else:
        ax.text(0.5, 0.5, "no experiments yet", ha="center", va="center", transform=ax.transAxes)
    ax.grid(True, alpha=0.3)
    figure.tight_layout()
    return figure


def _kept(rows: Any) -> list[bool]:
    return [d == "KEEP" or (d == "BASELINE" and v == "PASS") for d, v in zip(rows["decision"], rows["verdict"])]


def _best_so_far(rows: Any) -> tuple[list[int], list, list]:
    """Experiment numbers, the best kept speedup so far after each, and each one's own speedup."""
    x, best, ys, current = [], [], [], None
    for (_, row), kept in zip(rows.iterrows(), _kept(rows)):
        y = row["speedup_vs_eager"]
        y = float(y) if row["verdict"] == "PASS" and y == y and y is not None else None
        if kept and y is not None:
            current = y if current is None else max(current, y)
        x.append(int(row["experiment"]))
        best.append(current)
        ys.append(y)
    return x, best, ys


# ---------------------------------------------------------------- the markdown
def _cell(value: Any, fmt: str = "{}") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return (fmt.format(value) if not isinstance(value, str) else value).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def render(run: RunDir, frame: Any) -> str:
    config, plan = _read_json(run.config_path), _read_json(run.plan_path)
    state, verified = _read_state(run), _read_json(run.path / "verify.json")
    model = config.get("model", {})
    lines = [f"# autokernel run {run.run_id}", ""]
    if _on_cpu(run):
        lines += [CPU_BANNER, ""]
    versions = config.get("versions", {})
    lines += [f"- model: `{model.get('path', '?')}`" + (f" (class {model['class_name']})" if model.get("class_name") else "")
              + f", dtype {plan.get('dtype', model.get('dtype') or '?')}, device {model.get('device', '?')}",
              f"- device: {config.get('device', {}).get('name', '?')}",
              "- versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v),
              f"- agent: {state.get('agent', '?')}; status: {state.get('status', '?')} ({state.get('stop_reason', '')}); "
              f"search time {state.get('elapsed_s', 0.0) / 60:.1f} min of {state.get('budget_s', 0.0) / 3600:.2f} h",
              "", "## End to end", ""]
    lines += _end_to_end(verified, run.run_id)
    if verified.get("train"):
        lines += ["", "## Training", ""] + _training(verified["train"])
    lines += ["", "## The plan", ""] + _plan(plan)
    lines += ["", "## Targets", ""] + _targets(state, frame)
    lines += ["", "## Final table", ""] + _final(frame)
    lines += ["", "## Progress", "", f"![speedup vs eager per experiment]({PLOT})", ""]
    return "\n".join(lines)


def _end_to_end(v: dict, run_id: str) -> list[str]:
    if not v:
        return [f"Not verified yet: run `autokernel verify {run_id}`."]
    match = "match" if v["outputs_match"] else "**differ**"
    sets = (v.get("workload") or {}).get("sets") or []
    over = f"{len(sets)} input sets" if sets else f"{len(v['seeds'])} seeded inputs"
    out = [f"With the winners plugged into the unmodified model, its outputs {match} the original's "
           f"(largest error {v['max_rel_err']:.3g} of the output's rms over {over}).",
           "",
           f"- measured end-to-end speedup: **{_cell(v.get('e2e_speedup'), '{:.3g}x')}** "
           f"({_cell(v.get('eager_median_us'), '{:,.1f}')} us eager, {_cell(v.get('patched_median_us'), '{:,.1f}')} us patched)",
           f"- projected (Amdahl, from the plan's shares and the kernels' own speedups): "
           f"{_cell(v.get('projected_e2e_speedup'), '{:.3g}x')}"]
    if v.get("compile_median_us") or v.get("compile_error"):
        out.append(f"- torch.compile of the unmodified model: {_cell(v.get('compile_median_us'), '{:,.1f}')} us; "
                   f"winners vs compile {_cell(v.get('e2e_speedup_vs_compile'), '{:.3g}x')} {v.get('compile_error') or ''}")
    if v.get("guilty"):
        out.append(f"- **guilty, left out of the export**: {', '.join(v['guilty'])}")
    rows = []
    for target, k in v.get("per_kernel", {}).items():
        reasons = "; ".join(f"{r} ({n})" for r, n in (k.get("fallback_reasons") or {}).items())
        rows.append([_cell(target), k["route"], str(k["calls_served"]), str(k["fallbacks"]), _cell(reasons),
                     "guilty: " + _cell(k.get("guilty_reason")) if k.get("guilty") else "ok"])
    out += [""] + _table(["target", "route", "calls served", "fallbacks", "why they fell back", "verdict"], rows)
    return out + _workload(v["workload"]) if v.get("workload") else out


def _workload(w: dict) -> list[str]:
    """verify's input sets: served, fallen back, accuracy and times per set."""
    rows = [[_cell(s["name"]), str(s["calls_served"]), str(s["fallbacks"]),
             _cell("; ".join(f"{r} ({n})" for r, n in (s.get("fallback_reasons") or {}).items())),
             "match" if s["outputs_match"] else "**differ**", _cell(s.get("eager_median_us"), "{:,.1f}"),
             _cell(s.get("patched_median_us"), "{:,.1f}"), _cell(s.get("e2e_speedup"), "{:.3g}x")] for s in w["sets"]]
    return ["", f"Over the workload ({w['source']}): {w['summary']}.", ""] + _table(
        ["input set", "calls served", "fallbacks", "why they fell back", "outputs", "eager us", "patched us",
         "speedup"], rows)


def _training(train: dict) -> list[str]:
    """verify --train: the comparison, the loss per step, the figures per run."""
    from autokernel.deploy.verify_report import memory_words, train_rows, train_summary
    figures = train["throughput"]
    out = [_cell(train_summary(train)) + "."]
    memory = memory_words(train)
    if memory:
        out += ["", _cell(memory) + "."]
    if train.get("failures"):
        out += [""] + [f"- **{_cell(f)}**" for f in train["failures"]]
    if not figures["representative_of_gpu"]:
        out += ["", f"Timings: {figures['note']}."]
    losses = train["losses"]
    out += [""] + _table(["step", "eager loss", "loss with the winners", "relative difference"],
                         [[str(i + 1), f"{e:.6g}", f"{p:.6g}", "-" if d is None else f"{d:.2g}"] for i, (e, p, d) in
                          enumerate(zip(losses["eager"], losses["patched"], train["loss_rel_err"]))])
    return out + [""] + _table(["run", "step ms", figures["unit"], "peak MB", "vs eager", "not timed because"],
                               [[_cell(c) for c in row] for row in train_rows(train)])


def _plan(plan: dict) -> list[str]:
    train, rows = plan.get("train"), []
    for e in plan.get("entries", []):
        other = e["kernel_type"] == "other"
        where = ", ".join(sorted({m["class"] for m in e.get("modules", [])}))
        split = [_cell(e.get("fwd_ms"), "{:.3f}"), _cell(e.get("bwd_ms"), "{:.3f}")] if train else []
        rows.append([str(e["rank"]), _cell("other: " + ", ".join(e.get("ops", [])[:3]) if other else e.get("target")),
                     _cell(where), _cell(e["calls"], "{:g}"), *split, _cell(e["time_ms"], "{:.3f}"),
                     _cell(e["share"], "{:.1%}"), _cell(e.get("bound")), *ceiling_cells(e, "{:.2f}x", "{:.3f}x")])
    if not rows:
        return ["No plan.json in this run."]
    per = "training step (forward + backward; the optimizer step apart)" if train else "forward"
    head = [f"{plan.get('device_name', '?')}: {plan.get('total_ms', 0.0):.3f} ms per {per}, "
            f"{plan.get('coverage', 0.0):.1%} of it in targets ({plan.get('typed_coverage', plan.get('coverage', 0.0)):.1%} "
            "in the nine kernel types, the rest in module targets).", ""]
    if train:
        head[0] += (f" The loss is {_cell(train.get('step'))}; forward {_cell(train.get('forward_ms'), '{:.3f}')} ms, "
                    f"backward {_cell(train.get('backward_ms'), '{:.3f}')} ms; the optimizer step "
                    f"({_cell(train.get('optimizer'))}) {_cell(train.get('optimizer_ms'), '{:.3f}')} ms more, "
                    "outside every target's share.")
    notes = [_cell(n) for n in ceiling_notes(plan.get("entries", []), limit=10)]
    times = ["fwd ms", "bwd ms", "ms"] if train else ["ms"]
    return head + _table(["#", "target", "where", "calls", *times, "share", "bound", "ceiling", "e2e at ceiling"], rows) \
        + ([""] + [f"- {n}" for n in notes] if notes else [])


def _targets(state: dict, frame: Any) -> list[str]:
    out = []
    for t in state.get("targets", []):
        rows = frame[frame["target"] == t["name"]] if len(frame) else frame
        failures = rows[rows["verdict"] != "PASS"]["verdict"].value_counts().to_dict() if len(rows) else {}
        keeps = int((rows["decision"] == "KEEP").sum()) if len(rows) else 0
        best, starter, eager = t.get("best_median_us"), t.get("baseline_median_us"), t.get("eager_median_us")
        out += [f"### {t['name']}", "",
                f"- share of the model's time: {t.get('share', 0.0):.1%} (plan rank {t.get('rank')}); "
                f"status {t.get('status')}: {t.get('stop_reason') or '-'}",
                f"- experiments: {len(rows)} ({keeps} kept, "
                + (", ".join(f"{n} {v}" for v, n in failures.items()) or "no failures") + ")",
                f"- starter {_cell(starter, '{:,.1f}')} us, best {_cell(best, '{:,.1f}')} us "
                f"(experiment {t.get('best_experiment')}), PyTorch eager {_cell(eager, '{:,.1f}')} us: "
                f"{_cell(eager / best if eager and best else None, '{:.3g}x')} vs eager, "
                f"{_cell(starter / best if starter and best else None, '{:.3g}x')} vs the starter", ""]
    return out or ["No targets."]


def _final(frame: Any) -> list[str]:
    best = board.best_rows(frame) if len(frame) else frame
    if not len(best):
        return ["No passing experiment yet."]
    rows = [[_cell(r["target"]), str(r["experiment"]), _cell(r["agent"]), _cell(r["median_us"], "{:,.1f}"),
             _cell(r["baseline_us"], "{:,.1f}"), _cell(r["speedup_vs_eager"], "{:.3g}x"),
             _cell(r["speedup_vs_starter"], "{:.3g}x"), _cell(r["candidate"])] for _, r in best.iterrows()]
    return _table(["target", "experiment", "agent", "median us", "eager us", "vs eager", "vs starter", "kernel"], rows)
