"""fast_p and geometric-mean speedups against values computed by hand, the CLI's score and the
export in KernelBench's layout."""
from __future__ import annotations

import json
import math

import pytest
from sealed_runs import record_baseline
from typer.testing import CliRunner

from autokernel.cli import app
from autokernel.kernelbench.score import ProblemResult, fast_p, geomean_speedup, score
from autokernel.search.run import RunDir, TargetState

# five problems: four correct (one without a torch.compile baseline), one wrong but fast
ROWS = [
    {"key": "1_A", "level": 1, "problem_id": 1, "correct": True, "speedup_vs_eager": 2.0, "speedup_vs_compile": 1.2},
    {"key": "2_B", "level": 1, "problem_id": 2, "correct": True, "speedup_vs_eager": 0.5, "speedup_vs_compile": 0.25},
    {"key": "3_C", "level": 1, "problem_id": 3, "correct": True, "speedup_vs_eager": 1.0, "speedup_vs_compile": None},
    {"key": "4_D", "level": 1, "problem_id": 4, "correct": False, "speedup_vs_eager": 3.0, "speedup_vs_compile": 3.0},
    {"key": "5_E", "level": 1, "problem_id": 5, "correct": True, "speedup_vs_eager": 1.6, "speedup_vs_compile": 0.9},
]
RESULTS = [ProblemResult.from_json(r) for r in ROWS]


@pytest.mark.parametrize("p, eager, compile_", [
    (0.0, 4 / 5, 4 / 5),  # fast_0 is the fraction correct, baseline or not
    (0.5, 3 / 5, 2 / 5),  # speedup must exceed p: 0.5 itself does not count
    (0.8, 3 / 5, 2 / 5),
    (1.0, 2 / 5, 1 / 5),  # 1.0 is not faster
    (1.5, 2 / 5, 0.0),
    (2.0, 0.0, 0.0),  # 2.0 is not > 2; the wrong 3.0x never counts
])
def test_fast_p_by_hand(p, eager, compile_):
    assert fast_p(RESULTS, p, "eager") == pytest.approx(eager)
    assert fast_p(RESULTS, p, "compile") == pytest.approx(compile_)


def test_geomean_by_hand():
    g, n = geomean_speedup(RESULTS, "eager")
    assert n == 4 and g == pytest.approx((2.0 * 0.5 * 1.0 * 1.6) ** 0.25) and g == pytest.approx(1.124682, rel=1e-6)
    g, n = geomean_speedup(RESULTS, "compile")
    assert n == 3 and g == pytest.approx((1.2 * 0.25 * 0.9) ** (1 / 3)) and g == pytest.approx(0.646330, rel=1e-6)
    assert geomean_speedup([ProblemResult("x", False, 2.0)], "eager") == (None, 0)


def test_score_summary():
    s = score(RESULTS)
    assert (s["problems"], s["correct"], s["missing_compile_baseline"]) == (5, 4, 1)
    assert s["fast_p"]["eager"]["1"] == pytest.approx(0.4) and set(s["fast_p"]["eager"]) == {"0", "0.5", "0.8", "1", "1.5", "2"}
    assert s["geomean_over"] == {"eager": 4, "compile": 3}
    assert score([])["fast_p"]["eager"]["0"] == 0.0


def _run_dir(tmp_path):
    run = tmp_path / "runs" / "r1"
    (run / "best").mkdir(parents=True)
    problems = []
    for row in ROWS:
        solution = f"best/{row['key']}.py"
        target = TargetState(name=row["key"], kernel_type="kernelbench", dims={}, dtype="fp32")
        record_baseline(RunDir(run), target, f"# ModelNew for {row['key']}\nclass ModelNew: pass\n")
        problems.append({**row, "solution": solution, "name": row["key"][2:], "flags": []})
    problems[0]["flags"] = ["speedup_vs_eager 12.0x exceeds 10x"]
    (run / "kernelbench.json").write_text(json.dumps({"kind": "autokernel-kernelbench", "version": 1,
                                                      "level": 1, "problems": problems}))
    return run


def test_cli_score_json_and_export(tmp_path):
    run = _run_dir(tmp_path)
    out = tmp_path / "export"
    result = CliRunner().invoke(app, ["kernelbench", "score", "r1", "--runs-dir", str(tmp_path / "runs"),
                                      "--json", "--export", str(out)])
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)
    assert s["fast_p"]["compile"]["0.5"] == pytest.approx(0.4)
    assert math.isclose(s["geomean_speedup"]["eager"], 1.6 ** 0.25)
    assert s["flagged"] == ["1_A"]
    names = sorted(p.name for p in out.iterdir())
    # the wrong problem 4 is not exported; the others in KernelBench's own file names
    assert names == [f"level_1_problem_{i}_sample_0_kernel.py" for i in (1, 2, 3, 5)]
    assert (out / "level_1_problem_5_sample_0_kernel.py").read_text() == (run / "best" / "5_E.py").read_text()


def test_cli_score_text_and_unknown_run(tmp_path):
    run = _run_dir(tmp_path)
    result = CliRunner().invoke(app, ["kernelbench", "score", str(run)])
    assert result.exit_code == 0 and "4 of 5 problems correct" in result.stdout
    assert "fast_0.5" in result.stdout and "1.12x (4)" in result.stdout
    missing = CliRunner().invoke(app, ["kernelbench", "score", "nope", "--runs-dir", str(tmp_path)])
    assert missing.exit_code != 0


def test_export_refuses_a_solution_that_is_not_what_was_judged(tmp_path):
    run = _run_dir(tmp_path)
    (run / "best" / "5_E.py").write_text("class ModelNew: pass  # never judged\n")
    out = tmp_path / "export"
    result = CliRunner().invoke(app, ["kernelbench", "score", "r1", "--runs-dir", str(tmp_path / "runs"),
                                      "--export", str(out)])
    assert result.exit_code == 1 and "best/5_E.py" in result.exception.message
    assert not out.exists()
