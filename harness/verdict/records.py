"""The worker's records are the judge's: held to what the witness was told and to the judge's plan.

The candidate shares the worker's process, so it can write to the worker's events file and its
saved outputs like the worker does (a native write to the file's descriptor needs no Python at
all). Two rules make such a write worthless:

- Told as written. The worker sends the judge each events-file line's sha256, and each saved
  output's, over the witness socket as it writes them (harness/workers/worker.py's Log). The file
  must be exactly the lines the judge was told of, in order (`told_problem`), and an output whose
  bytes differ from the hash sent when it was saved fails when the judge loads it (`load_output`).
- The plan's and nothing else. Each stage holds exactly the case records the judge planned, in the
  planned order (`plan_problem`): a record missing from a stage that passed, a duplicate, one out of
  order, one the plan never had, or one after its stage ended fails the candidate. A forged record
  next to the worker's own is therefore always one too many.
"""
from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import torch

from harness.correctness.cases import AROUND_STAGE, DETERMINISM_CALLS, STAGES, Plan, around_limits
from harness.kernel_types.registry import Case


class RecordProblem(Exception):
    """A record or an output that is not the one the worker reported writing."""


def told_problem(out_dir: Path, witnessed) -> str | None:
    """Why the events file is not exactly the lines whose digests the witness carried, or None."""
    path = out_dir / "events.jsonl"
    lines = path.read_bytes().split(b"\n") if path.exists() else []
    if lines and lines[-1] == b"":
        lines.pop()
    told = witnessed.digests
    for n, line in enumerate(lines):
        if n >= len(told):
            if n == len(lines) - 1 and b'"event": "done"' not in b"".join(lines):
                return None  # the worker died between writing its last line and reporting it
            return f"line {n + 1} of the worker's records was never reported to the judge as written"
        if hashlib.sha256(line).hexdigest() != told[n]:
            return f"line {n + 1} of the worker's records differs from the line the worker reported writing"
    if len(told) > len(lines):
        return f"the worker reported {len(told)} records and its file holds {len(lines)}"
    return None


def load_output(out_dir: Path, name: str | None, witnessed=None):
    """A saved output, its bytes held to the hash the witness carried when it was saved."""
    if not name:
        return None
    path = out_dir / "tensors" / str(name)
    data = path.read_bytes()
    if witnessed is not None:
        told = witnessed.outputs.get(str(name))
        if told is None:
            raise RecordProblem(f"the output {name} was never reported saved: a record points at a file the "
                                "worker did not write for it")
        if hashlib.sha256(data).hexdigest() != told:
            raise RecordProblem(f"the output {name} differs from the one whose hash the worker reported as it "
                                "saved it: rewritten after it was written")
    # weights_only: the file was written by the untrusted process; never unpickle code from it
    return torch.load(io.BytesIO(data), weights_only=True)


def planned(stage: str, plan: Plan, end: dict | None, warmup: int, case: Case | None = None,
            recorded: int = 0) -> list[str]:
    """Every record the plan puts in `stage`, in order, as keys (`key`); a timing that did not pass
    is planned as far as its `recorded` records reach (the ones it made must still be the plan's)."""
    from harness.verdict.timing_checks import expected_reps
    if stage in ("smoke", "shape_sweep", "stability", "edge_cases"):
        return [key("check", c.to_json()) for c in plan.stages[stage]]
    if stage == "determinism":
        return [key("repeat", c.to_json()) for c in plan.stages[stage] for _ in range(DETERMINISM_CALLS)]
    if stage == "integrity":
        first, second = plan.stages[stage]
        return [key("replay_first", first.to_json()), key("replay_second", second.to_json())]
    if case is None:
        return []
    rounds = (end or {}).get("rounds") or ([end["kernel"]] if end and "kernel" in end else [])
    reps = sum(int(r.get("reps", 0)) for r in rounds if isinstance(r, dict))
    if end is None or end.get("status") != "pass":
        reps = max(0, recorded - warmup) + 1
    case_json = case.to_json()
    return [key("timed", case_json, rep) for rep in expected_reps(warmup, reps)]


def key(role, case, rep=None) -> str:
    """A record's identity: its role, case and rep, in one canonical form (JSON turns tuples into lists)."""
    return json.dumps([role, case, rep], sort_keys=True, default=str)


def plan_problem(events: list[dict], plan: Plan, device: str, around_cases: list[Case] = (),
                 more: dict[str, list[str]] | None = None) -> str | None:
    """Why the case records break the judge's plan, or None. `more`: the keys of every record other
    stages plan (a backward's: harness/verdict/backward_checks.py), by stage."""
    from harness.timing.measurement import budget
    warmups = {"timing": budget(device)["warmup"]}
    cases = {"timing": plan.timing}
    for i, c in enumerate(around_cases):
        cases[f"{AROUND_STAGE}:{i}"] = c
        warmups[f"{AROUND_STAGE}:{i}"] = (around_limits(device) or budget(device))["warmup"]
    more = more or {}
    known = set(STAGES) | set(cases) | set(more)
    ends = {e.get("stage"): e for e in events if e.get("event") == "stage_end"}
    counts: dict[str, int] = {}
    for e in events:
        if e.get("event") == "case":
            counts[e.get("stage")] = counts.get(e.get("stage"), 0) + 1
    expected: dict[str, list[str]] = {}
    seen: dict[str, list[str]] = {}
    open_stage, started, ended = None, set(), set()
    for e in events:
        kind, stage = e.get("event"), e.get("stage")
        if kind == "stage_start":
            if stage in started or stage not in known:
                return f"the worker's records start the stage {stage!r} where the judge planned no such start"
            started.add(stage)
            open_stage = stage
            expected[stage] = more[stage] if stage in more else planned(
                stage, plan, ends.get(stage), warmups.get(stage, 0), cases.get(stage), counts.get(stage, 0))
        elif kind == "stage_end":
            if stage != open_stage or stage in ended:
                return f"the worker's records end the stage {stage!r} where no such stage was running"
            ended.add(stage)
            open_stage = None
        elif kind == "case":
            if stage in ended:
                return f"a record of {stage} after that stage ended: the judge plans none"
            if stage != open_stage:
                return f"a record of {stage!r} outside that stage"
            mine = seen.setdefault(stage, [])
            mine.append(key(e.get("role"), e.get("case"), e.get("rep")))
            problem = _placed(stage, mine, expected[stage])
            if problem:
                return problem
    for stage in ended:
        if ends[stage].get("status") == "pass" and len(seen.get(stage, [])) != len(expected[stage]):
            return (f"{stage} passed with {len(seen.get(stage, []))} of the judge's {len(expected[stage])} "
                    "planned records: every planned case is recorded")
    return None


def _placed(stage: str, mine: list[str], expected: list[str]) -> str | None:
    """Is the newest record of `stage` the plan's next one? Why not, or None."""
    n = len(mine) - 1
    record = mine[-1]
    if n < len(expected) and record == expected[n]:
        return None
    what = f"record {n + 1} of {stage}"
    if record in mine[:-1] and record not in expected[n:]:
        return f"{what} duplicates an earlier record: the judge plans each case once"
    if record in expected[n + 1:]:
        return f"{what} is out of the judge's order: it plans that case later"
    if n >= len(expected):
        return f"{what} is one more than the judge's {len(expected)} planned records"
    return f"{what} is not the case the judge planned there"
