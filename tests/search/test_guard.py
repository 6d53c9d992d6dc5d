"""The record guard around each judge call: it looks at what a candidate could change without
walking the whole run, finds and names what changed, puts back what the search holds, and leaves
what it cannot see (an old experiment's file rewritten in place) to the recorded hashes, which the
end-of-run check, --resume and `leaderboard --check` compare.

The judge is a function at the loop's seam that tampers as a candidate's import would; nothing
depends on timing."""
import json
import os
from pathlib import Path

import pytest
from loop_kernels import CHEAT
from sealed_runs import tuned_run

from autokernel.search import guard as guards
from autokernel.search import leaderboard as board
from autokernel.search import run as runs
from autokernel.search import start as run_start
from autokernel.search.guard import RecordGuard
from autokernel.search.seal import SealError, check_at_end, check_run

SLUG = "softmax-8x128-float32"


def judge_for(tamper=None):
    """PASS, 50 us for the baseline and 10 us after (so experiment 1 is kept unless it fails);
    `tamper(number, kernel_file)` runs while the candidate is judged."""
    def judge(kernel_file, *, target, device, arch, timeout_s):
        number = int(Path(kernel_file).stem.split("_")[1])
        if tamper is not None:
            tamper(number, Path(kernel_file))
        median_us = 50.0 if number == 0 else 10.0 - number * 0.01
        return {"verdict": "PASS", "failed_stage": None, "stages": [], "device": {"type": "cpu"},
                "timing": {"median_us": median_us, "iqr_us": 0.0, "reps": 20, "baseline_median_us": 100.0}}
    return judge


def search(tmp_path, judge, max_experiments=3):
    return tuned_run(tmp_path, judge, max_experiments)


def integrity_detail(run, number):
    verdict = json.loads((run.path / "kernels" / SLUG / f"exp_{number:04d}.json").read_text())
    assert verdict["failed_stage"] == "integrity" and verdict["timing"] is None
    return next(s["detail"] for s in verdict["stages"] if s["name"] == "integrity")


class CountingScandir:
    """os.scandir as the guard calls it, counting the entries it is shown."""

    def __init__(self):
        self.entries = 0
        self._scandir = os.scandir

    def __call__(self, path):
        listed = list(self._scandir(path))
        self.entries += len(listed)

        class Scan(list):
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False
        return Scan(listed)


def test_the_guard_does_not_walk_the_experiments(tmp_path, monkeypatch):
    folder = tmp_path / "kernels" / SLUG
    folder.mkdir(parents=True)
    (tmp_path / "best").mkdir()
    (tmp_path / "leaderboard.tsv").write_text(board.HEADER)
    counted = []
    for experiments in (10, 1000):
        for n in range(experiments):
            (folder / f"exp_{n:04d}.py").write_text(f"# {n}\n")
            (folder / f"exp_{n:04d}.json").write_text("{}")
        guard = RecordGuard(tmp_path, rebuilt=("leaderboard.tsv",))
        guard.snapshot()  # first sight: the folder is listed once
        counter = CountingScandir()
        monkeypatch.setattr(guards.os, "scandir", counter)
        guard.snapshot()
        assert guard.restore() == []
        monkeypatch.setattr(guards.os, "scandir", counter._scandir)
        counted.append(counter.entries)
    assert counted[0] == counted[1] and counted[0] < 20, counted


def test_files_added_or_removed_among_the_experiments_are_found_and_named(tmp_path):
    def tamper(number, kernel_file):
        if number == 2:
            folder = kernel_file.parent
            (folder / "exp_0099.py").write_text(CHEAT)  # a forged experiment beside the real ones
            (folder / "__pycache__").mkdir()
            (folder / "__pycache__" / "exp_0000.cpython-311.pyc").write_bytes(b"\0" * 16)
            (folder / "exp_0000.json").unlink()  # an old verdict removed
    run, state = search(tmp_path, judge_for(tamper))
    frame = board.read(run.leaderboard_path)
    assert list(frame["decision"]) == ["BASELINE", "KEEP", "REVERT", "KEEP"]  # the run went on
    detail = integrity_detail(run, 2)
    for name in ("exp_0099.py", "__pycache__", "exp_0000.json"):
        assert f"kernels/{SLUG}/{name}" in detail
    folder = run.path / "kernels" / SLUG
    assert not (folder / "exp_0099.py").exists() and not (folder / "__pycache__").exists()
    # a removed old file cannot be put back (the search does not keep every old text): the run is
    # refused at check time, naming it
    errors = check_run(run.path).errors
    assert len(errors) == 1 and errors[0].startswith(f"kernels/{SLUG}/exp_0000.json: missing")


def test_an_old_file_rewritten_in_place_is_refused_at_check_time(tmp_path):
    # the guard does not read old experiments around each call: the hash recorded when the search
    # wrote the file finds the change, at the end of the run, on resume and in every check
    def tamper(number, kernel_file):
        if number == 2:
            old = kernel_file.parent / "exp_0001.json"
            old.write_text(old.read_text().replace('"PASS"', '"FAIL"'))
            prompt = kernel_file.parent / "exp_0000.py"
            prompt.write_text(prompt.read_text() + "\n# rewritten\n")
    run, state = search(tmp_path, judge_for(tamper))
    assert list(board.read(run.leaderboard_path)["verdict"]) == ["PASS"] * 4  # not seen while judged
    errors = check_run(run.path).errors
    assert any(e.startswith(f"kernels/{SLUG}/exp_0001.json: its sha256") for e in errors)
    assert any(e.startswith(f"kernels/{SLUG}/exp_0000.py: its sha256") for e in errors)
    lines = []
    check_at_end(run, state, lines.append)
    assert "exp_0001.json" in lines[0] and "leaderboard --check" in lines[0]
    with pytest.raises(SealError, match="--resume refused") as refused:
        run_start.resume(run.path.parent, run.run_id)
    assert f"kernels/{SLUG}/exp_0001.json" in refused.value.message


def test_the_state_and_its_journal_forged_while_judged_are_written_again_from_memory(tmp_path):
    def tamper(number, kernel_file):
        if number == 2:
            run_dir = kernel_file.parents[2]
            with open(run_dir / runs.JOURNAL, "a") as f:
                f.write('{"generation": "forged", "run": {"status": "done"}}\n')
            state = json.loads((run_dir / "state.json").read_text())
            state["targets"][0]["best_experiment"] = 99
            (run_dir / "state.json").write_text(json.dumps(state))
    run, state = search(tmp_path, judge_for(tamper))
    detail = integrity_detail(run, 2)
    assert "state.json" in detail and "state.journal" in detail
    saved = runs.RunDir(run.path).load_state()
    assert saved.to_json() == state.to_json()  # what the search holds, not the forgery
    assert "forged" not in run.journal_path.read_text() and check_run(run.path).ok


def test_a_candidates_own_files_are_put_back_from_the_text_the_search_holds(tmp_path):
    held = {}

    def tamper(number, kernel_file):
        if number == 1:
            held["text"] = kernel_file.read_text()
            kernel_file.unlink()
            kernel_file.with_name("exp_0001.prompt.md").write_text("forged")  # not written by the tuner
    run, state = search(tmp_path, judge_for(tamper), max_experiments=1)
    detail = integrity_detail(run, 1)
    assert f"kernels/{SLUG}/exp_0001.py" in detail and f"kernels/{SLUG}/exp_0001.prompt.md" in detail
    assert (run.path / "kernels" / SLUG / "exp_0001.py").read_text() == held["text"]
    assert not (run.path / "kernels" / SLUG / "exp_0001.prompt.md").exists()
    assert check_run(run.path).ok


def test_a_run_without_tampering_is_left_alone(tmp_path):
    run, state = search(tmp_path, judge_for(), max_experiments=4)
    frame = board.read(run.leaderboard_path)
    assert set(frame["verdict"]) == {"PASS"} and frame["failed_stage"].eq("").all()
    assert check_run(run.path).ok
    files = state.targets[0].history[-1]["files"]
    assert sorted(files) == [f"kernels/{SLUG}/exp_0004.json"]  # the tuner writes no prompt or reply
