"""report: report.md from a run's files and progress.png read back as an image, on a run written
here row by row (no search needed)."""

import matplotlib.image
import pytest

from autokernel.search import leaderboard as board
from autokernel.deploy.report import CPU_BANNER, plot_progress, write_report
from autokernel.search.run import RunDir, RunState, TargetState

SOFTMAX, NORM = "softmax[64x1024:float16]", "rmsnorm[128x384:float32]"


def verdict(median_us=None, eager_us=100.0, status="PASS", stage=None):
    timing = None if median_us is None else {"median_us": median_us, "baseline_median_us": eager_us,
                                             "speedup_vs_eager": eager_us / median_us}
    return {"verdict": status, "failed_stage": stage, "timing": timing, "device": {"type": "cpu"}}


# (target, decision, verdict) per experiment
EXPERIMENTS = [
    (SOFTMAX, "BASELINE", verdict(200.0)), (SOFTMAX, "KEEP", verdict(80.0)),
    (SOFTMAX, "REVERT", verdict(status="FAIL", stage="smoke")), (SOFTMAX, "KEEP", verdict(50.0)),
    (NORM, "BASELINE", verdict(40.0, eager_us=20.0)), (NORM, "REVERT", verdict(status="CRASH", stage="compile")),
    (NORM, "REVERT", verdict(45.0, eager_us=20.0)),
]


def make_run(root, device="cpu", verified=True):
    run = RunDir(root / f"run-{device}")
    run.create()
    run.write_json(run.config_path, {"run_id": run.run_id, "model": {"path": "model.py", "device": device},
                                     "device": {"type": device, "name": "Test Device"},
                                     "versions": {"torch": "2.x", "triton": "3.x"}})
    run.write_json(run.plan_path, {"device_name": "Test Device", "total_ms": 2.0, "coverage": 0.9, "entries": [
        {"rank": 1, "kernel_type": "softmax", "target": SOFTMAX, "calls": 4, "time_ms": 1.2, "share": 0.6,
         "bound": "memory", "ceiling_speedup": 3.0, "projected_e2e_speedup": 1.67, "modules": [{"name": "a", "class": "Attn"}]},
        {"rank": 2, "kernel_type": "rmsnorm", "target": NORM, "calls": 9, "time_ms": 0.6, "share": 0.3,
         "bound": "memory", "ceiling_speedup": 2.0, "projected_e2e_speedup": 1.18, "modules": []},
        {"rank": 3, "kernel_type": "other", "op": "aten::add", "ops": ["aten::add"], "calls": 3, "time_ms": 0.2,
         "share": 0.1, "modules": []}]})
    state = RunState(run_id=run.run_id, agent="tune", status="done", stop_reason="every target searched", targets=[
        TargetState(SOFTMAX, "softmax", {"M": 64, "N": 1024}, "float16", rank=1, share=0.6, status="done",
                    best_experiment=3, best_median_us=50.0, baseline_median_us=200.0, eager_median_us=100.0),
        TargetState(NORM, "rmsnorm", {"M": 128, "N": 384}, "float32", rank=2, share=0.3, status="done",
                    best_experiment=0, best_median_us=40.0, baseline_median_us=40.0, eager_median_us=20.0)])
    run.save_state(state)
    writer = board.Leaderboard(run.leaderboard_path)
    numbers = {}
    for target, decision, v in EXPERIMENTS:
        number = numbers[target] = numbers.get(target, -1) + 1
        writer.append(board.make_row(experiment=number, target=target, kernel_type=target.split("[")[0], agent="tune",
                                     decision=decision, verdict=v, candidate=f"kernels/x/exp_{number:04d}.py"))
    if verified:
        run.write_json(run.path / "verify.json", {
            "outputs_match": False, "max_rel_err": 0.25, "seeds": [0, 1, 2], "e2e_speedup": 1.31,
            "eager_median_us": 1000.0, "patched_median_us": 763.4, "projected_e2e_speedup": 1.45,
            "guilty": [NORM], "per_kernel": {
                SOFTMAX: {"route": "op", "calls_served": 12, "fallbacks": 3, "guilty": False,
                          "fallback_reasons": {"no winner at softmax[64x512:float16]": 3}},
                NORM: {"route": "module", "calls_served": 27, "fallbacks": 0, "guilty": True,
                       "guilty_reason": "alone it changes the model's outputs", "fallback_reasons": {}}}})
    return run


def test_report_md_says_cpu_first_then_the_result_the_plan_and_every_target(tmp_path):
    run = make_run(tmp_path)
    paths = write_report(run.path)
    assert [p.name for p in paths] == ["report.md", "progress.png"]
    text = (run.path / "report.md").read_text()
    head = text.splitlines()[:4]
    assert CPU_BANNER in head
    assert "**1.31x**" in text and "1.45x" in text and "outputs **differ**" in text
    assert f"**guilty, left out of the export**: {NORM}" in text
    assert "| " + SOFTMAX + " | op | 12 | 3 | no winner at softmax[64x512:float16] (3) | ok |" in text
    assert f"### {SOFTMAX}" in text and f"### {NORM}" in text
    assert "experiments: 4 (2 kept, 1 FAIL)" in text and "experiments: 3 (0 kept, 1 CRASH)" in text
    assert "2x vs eager, 4x vs the starter" in text  # softmax: 100/50 and 200/50
    assert f"| {SOFTMAX} | 3 | tune | 50.0 | 100.0 | 2x | 4x |" in text  # the final table's best row
    assert "| 3 | other: aten::add |" in text
    assert "![speedup vs eager per experiment](progress.png)" in text


def test_a_gpu_run_has_no_cpu_banner_and_an_unverified_run_says_so(tmp_path):
    run = make_run(tmp_path, device="cuda", verified=False)
    write_report(run.path)
    text = (run.path / "report.md").read_text()
    assert "CPU figures" not in text
    assert f"Not verified yet: run `autokernel verify {run.run_id}`." in text


def test_progress_png_is_an_image_with_one_line_per_target_and_failures_marked(tmp_path):
    run = make_run(tmp_path)
    write_report(run.path)
    image = matplotlib.image.imread(run.path / "progress.png")
    assert image.shape[0] == 550 and image.shape[1] == 990 and image.shape[2] in (3, 4)
    assert image.std() > 0.01  # something was drawn
    figure = plot_progress(board.read(run.leaderboard_path))
    ax = figure.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == [SOFTMAX, NORM]
    # the line is the best kept speedup so far: 0.5x, 1.25x, still 1.25x after the failure, 2x
    assert list(ax.get_lines()[0].get_ydata()) == pytest.approx([0.5, 1.25, 1.25, 2.0])
    marks = {c.get_gid(): c.get_offsets().tolist() for c in ax.collections}
    assert marks[f"failed:{SOFTMAX}"] == [[2.0, 1.25]]
    assert marks[f"failed:{NORM}"] == [[1.0, 0.5]]
    assert marks[f"kept:{SOFTMAX}"] == [[0.0, 0.5], [1.0, 1.25], [3.0, 2.0]]


def test_an_empty_run_still_plots(tmp_path):
    figure = plot_progress(board.read(tmp_path / "missing.tsv"))
    ax = figure.axes[0]
    assert ax.get_lines() == [] and ax.get_title() == "speedup per experiment"
    assert [text.get_text() for text in ax.texts] == ["no experiments yet"]
    figure.canvas.draw()  # it renders, with nothing to plot
