"""The worker's records held to the judge's plan and to what the witness was told as they were
written (harness/verdict/records.py): records made by the worker's own Log pass; a missing case, a
duplicate, one out of order, one after its stage ended, a line never reported and an output
rewritten after its hash was sent each fail, naming why."""
from __future__ import annotations

import pytest
import torch

from harness.correctness.cases import DETERMINISM_CALLS, Capabilities, build_plan
from harness.kernel_types.registry import Case
from harness.timing.witness import parse
from harness.verdict.records import RecordProblem, load_output, plan_problem, told_problem
from harness.workers.worker import Log

TARGET = Case.make("softmax", {"M": 8, "N": 256}, "float32", seed=11)
PLAN = build_plan("softmax", Capabilities("cpu", False), TARGET)
WARMUP, REPS = 1, 5  # harness/timing/measurement.py's CPU budget: one warm-up, five reps at least


class Told:
    """A stand-in for the witness: the lines the worker's Reporter would send, stamped in order."""

    def __init__(self):
        self.lines: list[str] = []

    def record(self, digest: str) -> None:
        self.lines.append(f"R {digest}")

    def output(self, name: str, digest: str) -> None:
        self.lines.append(f"H {name} {digest}")

    def record_of(self):
        return parse([(float(i), line) for i, line in enumerate(self.lines)])


def _write_plan(log: Log, skip=None, extra=None) -> list[dict]:
    """The records the worker makes for PLAN, as its Log writes them; `skip` drops one (stage, index),
    `extra(stage, i)` returns records to add after the i-th of a stage."""
    events = []

    def event(**fields):
        events.append(fields)
        log.event(**fields)
    stages = [(s, [("check", c, None) for c in PLAN.stages[s]]) for s in ("smoke", "shape_sweep", "stability")]
    stages.append(("determinism", [("repeat", c, None) for c in PLAN.stages["determinism"]
                                   for _ in range(DETERMINISM_CALLS)]))
    stages.append(("edge_cases", [("check", c, None) for c in PLAN.stages["edge_cases"]]))
    first, second = PLAN.stages["integrity"]
    stages.append(("integrity", [("replay_first", first, None), ("replay_second", second, None)]))
    reps = [-1 - i for i in range(WARMUP)] + list(range(REPS))
    stages.append(("timing", [("timed", PLAN.timing, rep) for rep in reps]))
    out = torch.zeros(2)
    event(event="stage_start", stage="compile")
    event(event="stage_end", stage="compile", status="pass", detail="ok")
    for stage, records in stages:
        event(event="stage_start", stage=stage)
        for i, (role, case, rep) in enumerate(records):
            if skip != (stage, i):
                event(event="case", stage=stage, role=role, case=case.to_json(), rep=rep, output=log.save(out))
            for e in (extra(stage, i) if extra else []):
                event(**e)
        end = {"rounds": [{"reps": REPS}]} if stage == "timing" else {}
        event(event="stage_end", stage=stage, status="pass", detail="ok", **end)
    return events


@pytest.fixture
def worker_log(tmp_path):
    told = Told()
    return Log(tmp_path, told), told, tmp_path


def test_the_workers_own_records_are_the_plans(worker_log):
    log, told, out = worker_log
    events = _write_plan(log)
    assert plan_problem(events, PLAN, "cpu") is None
    assert told_problem(out, told.record_of()) is None
    assert load_output(out, "t0001.pt", told.record_of()).shape == (2,)


def test_a_planned_case_missing_from_a_stage_that_passed_fails(worker_log):
    events = _write_plan(worker_log[0], skip=("shape_sweep", len(PLAN.stages["shape_sweep"]) - 1))
    assert "shape_sweep passed with" in plan_problem(events, PLAN, "cpu")


def test_a_duplicate_record_fails(worker_log):
    dup = lambda stage, i: ([{"event": "case", "stage": "timing", "role": "timed", "case": PLAN.timing.to_json(),
                              "rep": 0, "output": "t0001.pt"}] if (stage, i) == ("timing", 1) else [])
    assert "duplicates an earlier record" in plan_problem(_write_plan(worker_log[0], extra=dup), PLAN, "cpu")


def test_a_record_out_of_order_fails(worker_log):
    early = lambda stage, i: ([{"event": "case", "stage": "timing", "role": "timed", "case": PLAN.timing.to_json(),
                                "rep": 3, "output": "t0001.pt"}] if (stage, i) == ("timing", 0) else [])
    assert "out of the judge's order" in plan_problem(_write_plan(worker_log[0], extra=early), PLAN, "cpu")


def test_a_record_after_its_stage_ended_fails(worker_log):
    log = worker_log[0]
    events = _write_plan(log)
    late = {"event": "case", "stage": "smoke", "role": "check", "case": PLAN.stages["smoke"][0].to_json(),
            "rep": None, "output": "t0001.pt"}
    events.insert(len(events) - 1, late)
    assert "after that stage ended" in plan_problem(events, PLAN, "cpu")


def test_a_line_written_by_anyone_but_the_worker_fails(worker_log):
    log, told, out = worker_log
    _write_plan(log)
    with open(out / "events.jsonl", "a") as f:  # as a native write to the worker's descriptor would
        f.write('{"event": "case", "stage": "timing"}\n')
    with open(out / "events.jsonl", "a") as f:
        f.write('{"event": "done"}\n')
    assert "never reported to the judge as written" in told_problem(out, told.record_of())


def test_an_output_rewritten_after_its_hash_was_sent_fails(worker_log):
    log, told, out = worker_log
    _write_plan(log)
    torch.save(torch.ones(2), out / "tensors" / "t0002.pt")
    with pytest.raises(RecordProblem, match="differs from the one whose hash the worker reported"):
        load_output(out, "t0002.pt", told.record_of())
    # a record pointing at a file the worker never reported saving
    torch.save(torch.ones(2), out / "tensors" / "t9999.pt")
    with pytest.raises(RecordProblem, match="never reported saved"):
        load_output(out, "t9999.pt", told.record_of())
