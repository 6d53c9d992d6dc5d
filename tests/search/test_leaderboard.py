"""leaderboard.tsv: the rows written, read back, the best per target, and the CLI that renders them."""
import pytest
from typer.testing import CliRunner

from autokernel.search import leaderboard as board
from autokernel.cli import app
from autokernel.errors import UserError

TARGET = "softmax[64x1024:float16]"


def verdict(median_us, result="PASS", failed=None, iqr_us=1.0):
    timing = None if median_us is None else {"median_us": median_us, "iqr_us": iqr_us,
                                             "baseline_median_us": 100.0,
                                             "speedup_vs_eager": 100.0 / median_us}
    return {"verdict": result, "failed_stage": failed, "timing": timing,
            "device": {"type": "cuda", "name": "NVIDIA H100"}}


def write_run(run_dir, rows):
    lb = board.Leaderboard(run_dir / board.FILENAME)
    for row in rows:
        lb.append(board.make_row(**row))
    return lb


def rows_for(target=TARGET, medians=(80.0, 60.0, 70.0)):
    base = dict(target=target, kernel_type=target.split("[")[0], agent="llm")
    return [
        dict(base, experiment=0, decision="BASELINE", verdict=verdict(medians[0]), candidate="kernels/t/exp_0000.py"),
        dict(base, experiment=1, decision="KEEP", verdict=verdict(medians[1]), best_median_us=medians[0],
             candidate="kernels/t/exp_0001.py", prompt_tokens=1200, completion_tokens=300,
             description="one block per row"),
        dict(base, experiment=2, decision="REVERT", verdict=verdict(medians[2]), best_median_us=medians[1],
             candidate="kernels/t/exp_0002.py"),
        dict(base, experiment=3, decision="REVERT", verdict=verdict(None, "FAIL", "integrity"),
             candidate="kernels/t/exp_0003.py", description="called\ttorch.softmax\nthen\\returned"),
        dict(base, experiment=4, decision="REVERT", verdict=None, description="reply without a kernel"),
    ]


def test_header_then_one_row_per_experiment(tmp_path):
    lb = write_run(tmp_path, rows_for())
    lines = (tmp_path / "leaderboard.tsv").read_text().split("\n")
    assert lines[0].split("\t") == list(board.COLUMNS)
    assert lines[-1] == "" and len(lines) == 1 + 5 + 1
    assert all(len(line.split("\t")) == len(board.COLUMNS) for line in lines[1:-1])
    frame = lb.read()
    assert list(frame["experiment"]) == [0, 1, 2, 3, 4]
    assert list(frame["decision"]) == ["BASELINE", "KEEP", "REVERT", "REVERT", "REVERT"]
    assert list(frame["verdict"]) == ["PASS", "PASS", "PASS", "FAIL", "FAIL"]
    assert list(frame["failed_stage"]) == ["", "", "", "integrity", "parse"]
    kept = frame.iloc[1]
    assert kept["median_us"] == 60.0 and kept["baseline_us"] == 100.0
    assert kept["speedup_vs_best"] == pytest.approx(80 / 60) and kept["speedup_vs_eager"] == pytest.approx(100 / 60)
    assert kept["prompt_tokens"] == 1200 and kept["device"] == "cuda NVIDIA H100"
    assert kept["candidate"] == "kernels/t/exp_0001.py"
    # empty cells where a value does not apply
    parse = frame.iloc[4]
    assert parse["candidate"] == "" and parse["median_us"] != parse["median_us"]
    assert parse["prompt_tokens"] is board.pd.NA


def test_tabs_newlines_and_backslashes_survive_the_round_trip(tmp_path):
    write_run(tmp_path, rows_for())
    raw = (tmp_path / "leaderboard.tsv").read_text()
    assert "called\\ttorch.softmax\\nthen\\\\returned" in raw
    assert board.read(tmp_path / "leaderboard.tsv").iloc[3]["description"] == "called\ttorch.softmax\nthen\\returned"


def test_append_after_reopen_keeps_one_header_and_drops_a_torn_row(tmp_path):
    rows = rows_for()
    write_run(tmp_path, rows[:2])
    path = tmp_path / "leaderboard.tsv"
    with open(path, "a") as f:  # kill -9 in the middle of a write
        f.write("2\t2025-01-01T00:00:00+00:00\tsoftm")
    write_run(tmp_path, rows[2:3])
    text = path.read_text()
    assert text.count("experiment\ttimestamp") == 1 and "softm\n" not in text
    assert list(board.read(path)["experiment"]) == [0, 1, 2]


def test_a_foreign_file_is_not_appended_to(tmp_path):
    (tmp_path / "leaderboard.tsv").write_text("a\tb\n1\t2\n")
    with pytest.raises(UserError, match="header"):
        write_run(tmp_path, rows_for()[:1])
    with pytest.raises(ValueError, match="not leaderboard columns"):
        board.Leaderboard(tmp_path / "other.tsv").append({"speedup": 2})


def test_best_per_target_across_runs(tmp_path):
    write_run(tmp_path / "20250101-000000", rows_for(medians=(80.0, 60.0, 70.0)))
    write_run(tmp_path / "20250102-000000", rows_for(medians=(82.0, 50.0, 40.0))
              + rows_for("rmsnorm[8x512:float32]", medians=(30.0, 35.0, 20.0)))
    (tmp_path / "not-a-run").mkdir()
    best = board.best_per_target(tmp_path)
    assert list(best["target"]) == ["rmsnorm[8x512:float32]", TARGET]
    soft = best[best["target"] == TARGET].iloc[0]
    # 40 us was a REVERT (not kept by its run); the best kept is 50 us from the second run
    assert (soft["run"], soft["experiment"], soft["median_us"]) == ("20250102-000000", 1, 50.0)
    assert soft["candidate"] == "20250102-000000/kernels/t/exp_0001.py"
    assert soft["speedup_vs_starter"] == pytest.approx(82 / 50)
    rms = best[best["target"] != TARGET].iloc[0]
    assert (rms["decision"], rms["median_us"]) == ("BASELINE", 30.0)  # nothing beat the starter
    assert board.best_per_target(tmp_path / "missing").empty


def test_cli_renders_a_run_and_the_best_per_target(tmp_path):
    write_run(tmp_path / "run-a", rows_for())
    runner = CliRunner()
    env = {"COLUMNS": "250"}
    shown = runner.invoke(app, ["leaderboard", "run-a", "--runs-dir", str(tmp_path)], env=env)
    assert shown.exit_code == 0, shown.output
    assert "Run run-a" in shown.output and "KEEP" in shown.output and "integrity" in shown.output
    assert "parse" in shown.output and "1.33x" in shown.output
    by_path = runner.invoke(app, ["leaderboard", str(tmp_path / "run-a")], env=env)
    assert by_path.exit_code == 0 and "one block per row" in by_path.output
    best = runner.invoke(app, ["leaderboard", "--runs-dir", str(tmp_path)], env=env)
    assert best.exit_code == 0 and TARGET in best.output and "run-a/kernels/t/exp_0001.py" in best.output
    missing = runner.invoke(app, ["leaderboard", "nope", "--runs-dir", str(tmp_path)], env=env)
    assert missing.exit_code != 0 and isinstance(missing.exception, UserError)
    assert "run-a" in missing.exception.hint


def test_a_leaderboard_from_before_parents_and_strategies_still_reads_and_takes_new_rows(tmp_path):
    path = tmp_path / board.FILENAME
    old = ["\t".join(board.escape(board.make_row(**r).get(c)) for c in board.SEALED_COLUMNS) + "\n"
           for r in rows_for()[:2]]
    path.write_text("\t".join(board.SEALED_COLUMNS) + "\n" + "".join(old))  # a run of the previous layout
    frame = board.read(path)
    assert list(frame["experiment"]) == [0, 1] and frame["parent"].isna().all() and set(frame["strategy"]) == {""}
    board.Leaderboard(path).append(board.make_row(**rows_for()[2], parent=1, strategy="next_tier"))
    lines = path.read_text().splitlines()
    assert lines[0].split("\t") == list(board.COLUMNS) and len(lines) == 4  # header upgraded, rows kept
    frame = board.read(path)
    assert list(frame["experiment"]) == [0, 1, 2] and frame["parent"][2] == 1 and frame["strategy"][2] == "next_tier"


def lineage_run(tmp_path):
    base = dict(target=TARGET, kernel_type="softmax", agent="llm")
    rows = [dict(base, experiment=0, decision="BASELINE", verdict=verdict(80.0)),
            dict(base, experiment=1, decision="KEEP", verdict=verdict(60.0), parent=0, strategy="refine",
                 description="one block per row"),
            dict(base, experiment=2, decision="REVERT", verdict=verdict(70.0), parent=1, strategy="refine"),
            dict(base, experiment=3, decision="REVERT", verdict=verdict(65.0), parent=0, strategy="different_algorithm"),
            dict(base, experiment=4, decision="KEEP", verdict=verdict(40.0), parent=1, strategy="next_tier",
                 description="vectorised loads"),
            dict(target="reduce[8x8:float32]", kernel_type="reduce", agent="llm", experiment=0, decision="BASELINE",
                 verdict=verdict(10.0))]
    write_run(tmp_path, rows)
    return tmp_path


def test_lineage_follows_the_best_kernel_back_to_the_starter(tmp_path):
    frame = board.read(lineage_run(tmp_path) / board.FILENAME)
    chain = board.lineage(frame, "softmax")
    assert list(chain["experiment"]) == [0, 1, 4] and list(chain["strategy"]) == ["", "refine", "next_tier"]
    with pytest.raises(UserError, match="no target named 'matmul'"):
        board.lineage(frame, "matmul")
    result = CliRunner().invoke(app, ["leaderboard", str(tmp_path), "--lineage", "softmax"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "vectorised loads" in result.output and "next_tier" in result.output and "Lineage" in result.output
    assert "different_algorithm" not in result.output  # not on the best's line
