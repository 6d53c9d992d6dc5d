"""`autokernel bench --suite starters`, cut to one kernel type so it stays quick on a CPU. The tests
share one judge session, as the rows of one suite do: the reduce target's torch.compile baseline
is compiled once, and later rows say it was reused. One run judges the starter's backward too (the
default); the others look at the forwards alone (--no-backward), as today's quicker look does."""
from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from autokernel.cli import app
from autokernel.errors import UsageError
from autokernel.judging.suite import NOT_JUDGED, judge_suite, render_suite, row_line, run_suite, suite_status
from harness.workers.judge_session import judge_session
from starter_kernels import starter_path
from toolchain import needs_nvcc


@pytest.fixture(scope="module", autouse=True)
def one_session():
    with judge_session() as session:
        yield session


@needs_nvcc  # the CUDA C++ row is compiled for the target
def test_suite_judges_both_backends_with_both_baselines():
    triton, cuda = judge_suite("cpu", "sm_90", None, types=["reduce"], backward=False)
    assert (triton["backend"], triton["verdict"]) == ("triton", "PASS")
    # --no-backward: the Triton starter's backward is said to be not judged; the CUDA one gives none
    assert triton["backward"] is None and triton["backward_skipped"] == NOT_JUDGED
    assert cuda["backward"] is None and "backward_skipped" not in cuda
    assert triton["target"] == "reduce[16x4096:float32]"
    t = triton["timing"]
    assert t["representative_of_gpu"] is False and t["baseline_median_us"] > 0
    # torch.compile is the second baseline: timed, or missing with the reason, never silently absent
    assert (t["speedup_vs_compile"] or 0) > 0 or t["compile_note"]
    assert triton["roofline"]["gbps"] > 0 and triton["resources"]["registers"] > 0
    assert (cuda["backend"], cuda["verdict"]) == ("cuda", "COMPILE_ONLY")
    assert cuda["resources"]["arch"] == "sm_90" and cuda["resources"]["registers"] > 0


@needs_nvcc  # the CUDA C++ row is compiled for the target
def test_suite_json_is_one_list(capsys):
    code = run_suite("starters", json_out=True, timeout_s=None, device="cpu", arch="sm_80", types=["reduce"],
                     backward=False)
    verdicts = json.loads(capsys.readouterr().out)
    assert code == 0 and [v["verdict"] for v in verdicts] == ["PASS", "COMPILE_ONLY"]
    assert [v.get("backward_skipped") for v in verdicts] == [NOT_JUDGED, None]
    assert all(v["resources"]["arch"] == "sm_80" for v in verdicts)


def test_suite_streams_each_row_as_a_json_line_and_a_stderr_row_with_its_backward(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    out.write_text('{"earlier": "run"}\n', encoding="utf-8")  # appended to, never truncated
    code = run_suite("starters", json_out=False, timeout_s=None, device="cpu", arch="sm_90", types=["reduce"],
                     backend="triton", dtype="bfloat16", jsonl=str(out))
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert code == 0 and lines[0] == {"earlier": "run"} and len(lines) == 2
    row = lines[1]
    assert (row["backend"], row["target"]) == ("triton", "reduce[16x4096:bfloat16]")
    # the starter's backward judged by default: its verdict and its figures against eager autograd
    back = row["backward"]
    assert back["verdict"] == "PASS" and row["serves"] == "training and inference"
    both = back["timing"]["forward_backward"]
    assert both["median_us"] > 0 and both["eager_median_us"] > 0
    assert both["speedup_vs_eager"] == pytest.approx(both["eager_median_us"] / both["median_us"])
    captured = capsys.readouterr()
    assert "reduce[16x4096:bfloat16] | triton | PASS" in captured.err
    assert f"backward PASS | bwd {back['timing']['backward']['median_us']:.1f} us" in captured.err
    assert f"fwd+bwd vs eager {both['speedup_vs_eager']:.3f}x" in captured.err
    assert "fwd+bwd vs eager" in captured.out  # the table's column


def _row(verdict="PASS", back=None, **extra) -> dict:
    """A suite row as the judge records it, with the figures the table shows."""
    return {"target": "softmax[8x256:float32]", "backend": "triton", "verdict": verdict, "failed_stage": None,
            "timing": {"median_us": 10.0, "baseline_median_us": 20.0, "speedup_vs_eager": 2.0,
                       "representative_of_gpu": False}, "backward": back, **extra}


PASSED_BACKWARD = {"verdict": "PASS", "failed_stage": None, "timing": {
    "backward": {"median_us": 30.0}, "forward_backward": {"median_us": 40.0, "eager_median_us": 50.0,
                                                          "speedup_vs_eager": 1.25}}}


def test_a_row_shows_its_backward_and_a_failed_backward_fails_the_suite():
    failed = {"verdict": "FAIL", "failed_stage": "shape_sweep", "timing": None}
    rows = [_row(back=PASSED_BACKWARD), _row(back=failed), _row(), _row(backward_skipped=NOT_JUDGED)]
    lines = [row_line(v) for v in rows]
    assert "backward PASS | bwd 30.0 us | fwd+bwd 40.0 us | fwd+bwd eager 50.0 us | fwd+bwd vs eager 1.250x" in lines[0]
    assert "backward FAIL (shape_sweep) | bwd - us" in lines[1]
    assert "backward none |" in lines[2] and f"backward {NOT_JUDGED} |" in lines[3]
    console = Console(width=250, record=True)
    render_suite(rows, console)
    table = console.export_text()
    assert "fwd+bwd vs eager" in table and "FAIL (shape_sweep)" in table and "1.250" in table
    assert suite_status([rows[0], rows[2], rows[3]]) == 0
    assert suite_status(rows) == 1  # a starter whose backward fails serves inference only
    assert suite_status([_row(verdict="FAIL")]) == 1


def test_bench_no_backward_judges_the_forward_alone_and_says_so(tmp_path):
    # refused by the static check before any worker starts: the flag's way through the command is
    # what is tested, at no judging cost
    path = tmp_path / "rmsnorm.py"
    path.write_text("import os\n" + starter_path("rmsnorm").read_text())
    for flags, skipped in ((["--no-backward"], NOT_JUDGED), ([], None)):
        result = CliRunner().invoke(app, ["bench", str(path), "--json", "--device", "cpu", *flags])
        verdict = json.loads(result.stdout)
        assert result.exit_code == 1 and verdict["failed_stage"] == "compile", result.output
        assert verdict.get("backward_skipped") == skipped


def test_suite_rejects_an_unknown_backend_or_type():
    with pytest.raises(UsageError, match="unknown backend"):
        run_suite("starters", json_out=True, timeout_s=None, device="cpu", arch="sm_90", backend="opencl")
    with pytest.raises(UsageError, match="unknown kernel type"):
        run_suite("starters", json_out=True, timeout_s=None, device="cpu", arch="sm_90", types=["conv9"])
