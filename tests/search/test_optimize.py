"""`autokernel optimize` as a user runs it, in real subprocesses: the offline tuner end to end on a
one-op model, Ctrl-C (SIGINT) stopping cleanly, kill -9, and --resume continuing the same run."""
import json

import pytest
from loop_kernels import SOFTMAX_MODEL
from processes import WAIT_S, end_orphans, interrupt, judge_workers, judging, start, wait_for

from autokernel.search import leaderboard as board
from autokernel.search.kernel_source import read_literals


@pytest.mark.slow
def test_tuner_interrupt_kill_and_resume(tmp_path):
    model = tmp_path / "softmax_model.py"
    model.write_text(SOFTMAX_MODEL)
    runs_dir = tmp_path / "runs"

    # 1. Ctrl-C while the baseline is being judged: a clean stop, state saved, a summary
    first = start([str(model), "--agent", "tune", "--max-experiments", "1", "--timeout", "300",
                   "--device", "cpu"], runs_dir)
    run = wait_for(first, runs_dir, judging(0), "the baseline's judge")
    interrupt(first)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 130, err
    assert "interrupted" in out and "softmax[16x256:float32]" in out
    assert f"--resume {run.name}" in err
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "interrupted" and state["agent"] == "tune"
    assert state["targets"][0]["next_experiment"] == 0 and state["elapsed_s"] > 0
    assert judge_workers(run) == {}  # Ctrl-C took the judge's process group down with it
    assert (run / "config.json").exists() and (run / "plan.json").exists()

    # 2. resume: the baseline is judged; kill -9 while experiment 1 is being judged
    second = start(["--resume", run.name], runs_dir)
    wait_for(second, runs_dir, judging(1), "experiment 1's judge")
    second.kill()
    second.communicate(timeout=60)
    end_orphans(run)
    assert list(board.read(run / board.FILENAME)["experiment"]) == [0]

    # 3. resume again: numbering, budget and the tuner's memory carry on; the run completes
    third = start(["--resume", run.name], runs_dir)
    out, err = third.communicate(timeout=WAIT_S)
    assert third.returncode == 0, err
    frame = board.read(run / board.FILENAME)
    assert list(frame["experiment"]) == [0, 1]
    assert list(frame["decision"])[0] == "BASELINE" and frame["decision"][1] in ("KEEP", "REVERT")
    assert set(frame["agent"]) == {"tune"} and all(frame["verdict"] == "PASS")
    starter = read_literals((run / frame["candidate"][0]).read_text())["CONFIG"]
    assert read_literals((run / frame["candidate"][1]).read_text())["CONFIG"] != starter

    state = json.loads((run / "state.json").read_text())
    target = state["targets"][0]
    assert state["status"] == "done" and state["sessions"] == 3
    assert target["status"] == "done" and "experiment budget spent (1 per target)" in target["stop_reason"]
    best = frame[frame["experiment"] == target["best_experiment"]].iloc[0]
    assert best["decision"] in ("BASELINE", "KEEP")
    best_file = run / "best" / "softmax-16x256-float32.py"
    assert best_file.read_text() == (run / best["candidate"]).read_text()
    assert 0 < state["elapsed_s"] < state["budget_s"]
    assert "done" in out and "softmax[16x256:float32]" in out
