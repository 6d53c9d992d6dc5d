"""The search's state on disk: state.json as a snapshot continued by state.journal, saved after
every experiment at a cost that does not grow with the run, read back whole after a crash, and
runs written before the journal (state.json alone) still read.

What is asserted is what is written (bytes, files, lines), never how long it took."""
import json

import pytest

from autokernel.search import journal
from autokernel.search import run as runs
from autokernel.errors import UserError
from autokernel.search.run import RunState, TargetState
from autokernel.search.seal import check_run


def target(name="softmax[8x128:float32]"):
    return TargetState(name=name, kernel_type="softmax", dims={"M": 8, "N": 128}, dtype="float32", share=1.0)


def entry(number, decision="REVERT"):
    return {"number": number, "description": f"idea {number}", "decision": decision, "verdict": "PASS",
            "failed_stage": None, "message": "", "median_us": 50.0 + number, "iqr_us": 0.5,
            "speedup_vs_best": 0.9, "config": {"BLOCK": number},
            "row": {"experiment": number, "target": "softmax[8x128:float32]", "decision": decision}}


def new_run(tmp_path, targets=None):
    run = runs.RunDir(tmp_path / "run")
    run.create()
    state = RunState(run_id="run", agent="tune", targets=targets or [target()])
    run.save_state(state)
    return run, state


def record(run, state, number, index=0):
    t = state.targets[index]
    t.history.append(entry(number, "BASELINE" if number == 0 else "REVERT"))
    t.next_experiment = number + 1
    state.elapsed_s += 1.0
    run.save_state(state)


def test_a_save_appends_one_line_of_what_changed_and_the_snapshot_is_not_rewritten(tmp_path):
    run, state = new_run(tmp_path)
    snapshot = run.state_path.stat()
    for number in range(5):
        record(run, state, number)
    assert (run.state_path.stat().st_ino, run.state_path.stat().st_mtime_ns) == (snapshot.st_ino, snapshot.st_mtime_ns)
    lines = run.journal_path.read_text().splitlines()
    assert len(lines) == 5
    last = json.loads(lines[-1])
    assert [h["number"] for h in last["history"]["0"]] == [4]  # the new entry only, not the history
    assert last["targets"]["0"]["next_experiment"] == 5 and last["run"]["elapsed_s"] == 5.0
    run.save_state(state)  # nothing changed: nothing written
    assert len(run.journal_path.read_text().splitlines()) == 5
    loaded = runs.RunDir(run.path).load_state()
    assert [h["number"] for h in loaded.targets[0].history] == [0, 1, 2, 3, 4]
    assert loaded.targets[0].next_experiment == 5 and loaded.elapsed_s == 5.0


def test_what_one_experiment_writes_does_not_grow_with_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "MIN_COMPACT_BYTES", 1 << 40)  # no compaction: every save is a line
    run, state = new_run(tmp_path, [target(), target("softmax[8x128:float32]#2")])
    sizes = []
    for number in range(1000):
        before = run.journal_path.stat().st_size
        record(run, state, number, index=number % 2)
        sizes.append(run.journal_path.stat().st_size - before)
    # the same experiment shape at 10 and at 990: the same bytes, give or take the digits of its number
    assert abs(sizes[990] - sizes[10]) <= 16, (sizes[10], sizes[990])
    assert len(runs.RunDir(run.path).load_state().targets[1].history) == 500


def test_the_journal_is_compacted_once_it_is_as_large_as_the_snapshot(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "MIN_COMPACT_BYTES", 4096)
    run, state = new_run(tmp_path)
    compactions = 0
    inode = run.state_path.stat().st_ino
    for number in range(200):
        record(run, state, number)
        if run.state_path.stat().st_ino != inode:
            compactions, inode = compactions + 1, run.state_path.stat().st_ino
            assert run.journal_path.stat().st_size == 0
            snapshot = json.loads(run.state_path.read_text())
            assert len(snapshot["targets"][0]["history"]) == number + 1 and snapshot["journal"]
        assert run.journal_path.stat().st_size < max(4096, run.state_path.stat().st_size) + 2048
    # the snapshot grows each time: compactions thin out (a run's and a target's fields, which each
    # line carries when they change, set where within that range it falls)
    assert 2 <= compactions <= 14
    assert len(runs.RunDir(run.path).load_state().targets[0].history) == 200


def test_a_line_torn_by_a_crash_is_no_save_and_the_next_save_cuts_it(tmp_path):
    run, state = new_run(tmp_path)
    for number in range(3):
        record(run, state, number)
    whole = run.journal_path.read_bytes()
    run.journal_path.write_bytes(whole + b'{"generation": "x", "history": {"0": [{"num')  # kill -9 mid-write
    resumed_dir = runs.RunDir(run.path)
    resumed = resumed_dir.load_state()
    assert [h["number"] for h in resumed.targets[0].history] == [0, 1, 2]
    assert run.journal_path.read_bytes().startswith(whole)  # reading never writes
    record(resumed_dir, resumed, 3)
    assert run.journal_path.read_bytes().startswith(whole) and b'"num\n' not in run.journal_path.read_bytes()
    assert [h["number"] for h in runs.RunDir(run.path).load_state().targets[0].history] == [0, 1, 2, 3]


def test_lines_of_another_generation_are_skipped(tmp_path):
    # a compaction that wrote its snapshot and died before it emptied the journal
    run, state = new_run(tmp_path)
    for number in range(3):
        record(run, state, number)
    old_lines = run.journal_path.read_bytes()
    run.compact_state(state)
    run.journal_path.write_bytes(old_lines)
    assert [h["number"] for h in runs.RunDir(run.path).load_state().targets[0].history] == [0, 1, 2]


def test_a_line_changed_in_the_middle_of_the_journal_is_refused(tmp_path):
    run, state = new_run(tmp_path)
    for number in range(3):
        record(run, state, number)
    lines = run.journal_path.read_text().splitlines(keepends=True)
    run.journal_path.write_text(lines[0] + "not a save\n" + "".join(lines[1:]))
    with pytest.raises(UserError, match="state.journal is damaged: line 2"):
        runs.RunDir(run.path).load_state()
    assert any(e.startswith("state.journal: line 2") for e in check_run(run.path).errors)


def test_another_state_object_is_compacted_not_mixed_in(tmp_path):
    run, state = new_run(tmp_path)
    record(run, state, 0)
    other = RunState(run_id="run", agent="tune", targets=[target()])
    other.targets[0].history.append(entry(7))
    run.save_state(other)  # e.g. a resumed state saved through another RunDir
    assert run.journal_path.stat().st_size == 0
    assert [h["number"] for h in runs.RunDir(run.path).load_state().targets[0].history] == [7]


def test_a_history_rewritten_in_place_is_saved_whole(tmp_path):
    run, state = new_run(tmp_path)
    record(run, state, 0)
    state.targets[0].history.clear()  # the same list, as long as before, another entry in it
    state.targets[0].history.append(entry(5, "KEEP"))
    run.save_state(state)
    assert [h["number"] for h in runs.RunDir(run.path).load_state().targets[0].history] == [5]
    assert state.targets[0].proposals == 1 and state.targets[0].reverts_in_a_row == 0


def test_a_state_json_from_before_the_journal_is_read_and_written_anew(tmp_path):
    run, state = new_run(tmp_path)
    old = {**state.to_json(), "version": 1}
    old["targets"][0]["history"] = [entry(0, "BASELINE"), entry(1)]
    run.state_path.write_text(json.dumps(old, indent=1))  # the layout every earlier run has
    run.journal_path.unlink()
    resumed_dir = runs.RunDir(run.path)
    resumed = resumed_dir.load_state()
    assert [h["number"] for h in resumed.targets[0].history] == [0, 1] and resumed.targets[0].proposals == 1
    record(resumed_dir, resumed, 2)
    snapshot = json.loads(run.state_path.read_text())
    assert snapshot["version"] == runs.STATE_VERSION and snapshot["journal"]  # the first save compacts
    assert [h["number"] for h in runs.RunDir(run.path).load_state().targets[0].history] == [0, 1, 2]


def test_the_counts_follow_the_history_without_recounting_it(tmp_path):
    t = target()
    t.history.extend(entry(n, "BASELINE" if n == 0 else "REVERT") for n in range(5))
    assert (t.proposals, t.reverts_in_a_row) == (4, 4)
    t.history.append(entry(5, "KEEP"))
    assert (t.proposals, t.reverts_in_a_row) == (5, 0)
    t.history.append(entry(6))
    assert (t.proposals, t.reverts_in_a_row) == (6, 1)
    t.history = [entry(0, "BASELINE")]  # another list: counted anew
    assert (t.proposals, t.reverts_in_a_row) == (0, 0)
    assert "_counts" not in t.to_json() and [e.number for e in t.recent(3)] == [0]


def test_the_visits_proposals_leave_out_baselines_and_what_came_before_the_visit():
    t = target()
    t.history.extend(entry(n, "BASELINE" if n in (0, 4) else "REVERT") for n in range(6))
    assert t.visit_proposals == 4  # stint_start 0: every entry but the two baselines
    t.stint_start = 3
    assert t.visit_proposals == 2  # entries 3 and 5; 4 is a baseline
    t.stint_start = 4
    assert t.visit_proposals == 1  # a visit that starts on a baseline
    t.stint_start = 5
    assert t.visit_proposals == 1
    t.history.append(entry(6, "KEEP"))
    assert t.visit_proposals == 2
    t.stint_start = 9  # past the end (a history rewritten shorter): nothing this visit
    assert t.visit_proposals == 0
    t.history, t.stint_start = [entry(0, "BASELINE"), entry(1)], 0  # another list: counted anew
    assert t.visit_proposals == 1
