"""`autokernel optimize` as a user runs it, in real subprocesses: the offline tuner end to end on a
one-op model, Ctrl-C (SIGINT) stopping cleanly, kill -9, and --resume continuing the same run."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from loop_kernels import SOFTMAX_MODEL

from autokernel import leaderboard as board

ROOT = Path(__file__).resolve().parent.parent
WAIT_S = 300


def start(args, runs_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "autokernel", "optimize", *args, "--runs-dir", str(runs_dir),
                             "--plain"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def only_run(runs_dir):
    folders = [p for p in runs_dir.iterdir() if p.is_dir()] if runs_dir.exists() else []
    return folders[0] if len(folders) == 1 else None


def wait_for_rows(proc, runs_dir, count):
    """Wait until the run's leaderboard has `count` rows; the run's folder."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        run = only_run(runs_dir)
        if run is not None and len(board.read(run / board.FILENAME)) >= count:
            return run
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"optimize exited {proc.returncode} early:\n{out}\n{err}")
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no {count} leaderboard rows within {WAIT_S} s")


def judge_processes(run_dir):
    """Pids of processes still working on this run's candidates (the judge's workers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(run_dir) in cmdline and "harness.worker" in cmdline:
                pids.append(int(entry.name))
    return pids


def end_orphans(run_dir):
    """kill -9 leaves the judge's worker (its own session) running: end it by pid."""
    for pid in judge_processes(run_dir):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@pytest.mark.slow
def test_tuner_interrupt_kill_and_resume(tmp_path):
    model = tmp_path / "softmax_model.py"
    model.write_text(SOFTMAX_MODEL)
    runs_dir = tmp_path / "runs"
    args = ["--max-experiments", "2", "--timeout", "300", "--device", "cpu"]

    # 1. Ctrl-C while experiment 1 is being judged: a clean stop, state saved, a summary
    first = start([str(model), "--agent", "tune", *args], runs_dir)
    run = wait_for_rows(first, runs_dir, 1)
    time.sleep(1.0)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 130, err
    assert "interrupted" in out and "softmax[16x256:float32]" in out
    assert f"--resume {run.name}" in err
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "interrupted" and state["agent"] == "tune"
    assert state["targets"][0]["next_experiment"] == 1
    assert judge_processes(run) == []  # Ctrl-C took the judge's process group down with it
    assert (run / "config.json").exists() and (run / "plan.json").exists()

    # 2. resume, then kill -9 while experiment 2 is being judged
    second = start(["--resume", run.name], runs_dir)
    wait_for_rows(second, runs_dir, 2)
    time.sleep(1.0)
    second.kill()
    second.communicate(timeout=60)
    end_orphans(run)

    # 3. resume again: numbering, budgets and the tuner's memory carry on; the run completes
    third = start(["--resume", run.name], runs_dir)
    out, err = third.communicate(timeout=WAIT_S)
    assert third.returncode == 0, err
    frame = board.read(run / board.FILENAME)
    assert list(frame["experiment"]) == [0, 1, 2]
    assert list(frame["decision"])[0] == "BASELINE" and set(frame["agent"]) == {"tune"}
    assert set(frame["decision"][1:]) <= {"KEEP", "REVERT"}
    assert frame["description"][1] != frame["description"][2]  # no configuration twice
    assert all(frame["verdict"] == "PASS")  # every configuration of a starter is correct

    state = json.loads((run / "state.json").read_text())
    target = state["targets"][0]
    assert state["status"] == "done" and state["sessions"] == 3
    assert target["status"] == "done" and "2 experiments" in target["stop_reason"]
    best = frame[frame["experiment"] == target["best_experiment"]].iloc[0]
    assert best["decision"] in ("BASELINE", "KEEP")
    best_file = run / "best" / "softmax-16x256-float32.py"
    assert best_file.read_text() == (run / best["candidate"]).read_text()
    assert state["elapsed_s"] > 0 and state["elapsed_s"] < state["budget_s"]
    assert "done" in out and "softmax[16x256:float32]" in out
