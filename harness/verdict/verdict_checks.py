"""The parent's reading of a worker's records: every stage decided here, from outputs it rechecks.

Each integrity check carries a one-line comment naming the hack it blocks.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness.kernel_types import references, registry
from harness.correctness.cases import STAGES, Plan
from harness.correctness.compare import bitwise_equal, compare
from harness.correctness.integrity import observation_problem
from harness.correctness.unspecified import hint as unspecified_hint
from harness.kernel_types.registry import Case
from harness.verdict import memory_checks
from harness.verdict.records import RecordProblem, load_output, plan_problem, told_problem


@dataclass
class Assessment:
    verdict: str = "PASS"
    failed_stage: str | None = None
    stages: dict[str, dict] = field(default_factory=dict)
    timing: dict | None = None
    roofline: dict | None = None
    resources: dict | None = None
    usage_error: str | None = None
    notes: list[str] = field(default_factory=list)
    complete: bool = False
    running_stage: str | None = None

    @staticmethod
    def failed(stage: str, detail: str) -> "Assessment":
        a = Assessment()
        a.set(stage, "fail", detail)
        a.verdict, a.failed_stage = "FAIL", stage
        return a

    def set(self, stage: str, status: str, detail: str, seconds: float = 0.0, **extra) -> None:
        self.stages[stage] = {"name": stage, "status": status, "detail": detail, "seconds": seconds, **extra}

    def fail(self, stage: str, detail: str, seconds: float = 0.0) -> "Assessment":
        self.set(stage, "fail", detail, seconds)
        self.verdict, self.failed_stage = "FAIL", stage
        self.timing = self.roofline = None
        return self

    def with_end(self, verdict: str, stage: str, detail: str) -> "Assessment":
        a = dataclasses.replace(self, stages=dict(self.stages))
        a.set(stage, "fail", detail)
        a.verdict, a.failed_stage, a.timing, a.roofline = verdict, stage, None, None
        return a

    def stage_list(self) -> list[dict]:
        out = []
        for name in STAGES:
            if name in self.stages:
                out.append(self.stages[name])
            else:
                why = "not run: an earlier stage failed" if self.failed_stage else "not run"
                if self.verdict == "COMPILE_ONLY":
                    why = "not run: no GPU here; a CUDA C++ kernel is compiled for the target only"
                out.append({"name": name, "status": "skip", "detail": why, "seconds": 0.0})
        return out


def _group(events: list[dict]) -> dict[str, dict]:
    stages: dict[str, dict] = {}
    for e in events:
        stage = e.get("stage")
        if stage is None:
            continue
        s = stages.setdefault(stage, {"start": False, "end": None, "cases": []})
        if e["event"] == "stage_start":
            s["start"] = True
        elif e["event"] == "stage_end":
            s["end"] = e
        elif e["event"] == "case":
            s["cases"].append(e)
    return stages


class _Checker:
    def __init__(self, out_dir: Path, plan: Plan, device: str, witnessed=None):
        self.out_dir, self.plan, self.device, self.witnessed = out_dir, plan, device, witnessed
        self.observations: list[tuple[str, dict]] = []
        self.memory: list[str] = []  # checked calls' buffers and modes, rechecked (memory_checks.py)
        self.dropped: list[str] = []
        self.counted = 0

    def check_output(self, rec: dict, case: Case, inputs: tuple[list, dict] | None = None,
                     trivial: bool = True, digests: list | None = None, mode_of: Case | None = None) -> str | None:
        """None when the recorded output is right for `case` (on `inputs`, its seed's by default);
        `trivial`: also ask whether zeros or a constant would have passed (a case that counts).
        A checked call (no `inputs`) has its buffers and mode rechecked too, against `digests`
        (those of its seed's buffers by default) and the mode `mode_of`'s seed chooses (its own by
        default): a problem there fails `integrity`."""
        if rec.get("error"):
            return f"{case.label()}: kernel_fn raised\n{rec['error']}"
        self.observations.append((case.label(), rec.get("obs", {})))
        # one launch's programs reading what others of it wrote: fails the stage where it showed
        if (rec.get("obs") or {}).get("program_order"):
            return f"{case.label()}: {rec['obs']['program_order'][0]}"
        out = self.load(rec.get("output"))
        if out is None:
            return f"{case.label()}: kernel_fn returned no tensor"
        args, kwargs = inputs if inputs is not None else registry.build_inputs(case, "cpu")
        if inputs is None:
            memory = memory_checks.call_problem(rec, case, args, digests, mode_of)
            if memory:
                self.memory.append(memory)
        ref = references.reference(case, self.device, (args, kwargs))  # large cases: on the judged device
        cmp = compare(out, ref.value, case, args, trivial=trivial, ref_error=ref.error)
        if not cmp.ok:
            obs = rec.get("obs") or {}
            return f"{case.label()}: {cmp.detail}" + _tf32_hint(case, obs) + unspecified_hint(obs)
        if cmp.trivial:
            # a case that zeros or a constant would pass proves nothing: not counted
            self.dropped.append(f"{case.label()} ({cmp.trivial} would pass)")
        else:
            self.counted += 1
        return None

    def correctness(self, stage: str, recs: list[dict], end: dict | None) -> str | None:
        expected = self.plan.stages[stage]
        for i, case in enumerate(expected):
            if i >= len(recs):
                return (end or {}).get("detail") or f"the worker stopped before {case.label()}"
            if Case.from_json(recs[i]["case"]) != case:
                return f"the worker's record {i} does not match the judge's plan ({case.label()})"
            problem = self.check_output(recs[i], case)
            if problem:
                return problem
        if end is not None and end.get("status") == "fail":
            return end.get("detail", "the worker reported a failure")
        return None

    def determinism(self, recs: list[dict]) -> str | None:
        for case in self.plan.stages["determinism"]:
            mine = [r for r in recs if Case.from_json(r["case"]) == case]
            if len(mine) < 2:
                return f"{case.label()}: the worker recorded {len(mine)} calls, expected several"
            problem = self.check_output(mine[0], case)
            if problem:
                return problem
            first = self.load(mine[0]["output"])
            args, _ = registry.build_inputs(case, "cpu")
            want = memory_checks.expected(case, args)
            for r in mine[1:]:
                if (r.get("obs") or {}).get("program_order"):
                    return f"{case.label()}: {r['obs']['program_order'][0]}"
                memory = memory_checks.call_problem(r, case, args, want)
                if memory:
                    self.memory.append(memory)
                # nondeterminism (racy atomics, unseeded randomness) makes every later result suspect
                if not bitwise_equal(self.load(r["output"]), first):
                    return (f"{case.label()}: repeated calls on identical inputs are not bitwise identical"
                            + unspecified_hint(r.get("obs") or {}))
        return None

    def integrity(self, recs: list[dict]) -> str | None:
        first_case, second_case = self.plan.stages["integrity"]
        by_role = {r.get("role"): r for r in recs}
        a, b = by_role.get("replay_first"), by_role.get("replay_second")
        if a is None or b is None:
            return "the worker did not record the replay check"
        problem = self.check_output(a, first_case)
        if problem:
            return problem
        if b.get("error"):
            return f"{second_case.label()}: kernel_fn raised\n{b['error']}"
        # a reused output buffer: the caller's earlier result changes under its feet
        if b.get("earlier_output_changed"):
            return "an earlier output changed when kernel_fn was called again (is an output buffer reused?)"
        # result replay: a kernel that caches by buffer address returns the old answer here
        if self.check_output(b, second_case, digests=memory_checks.refilled(first_case, second_case),
                             mode_of=first_case):
            return ("result replay: after the same input buffers were refilled in place with new values, "
                    "the output did not match the new inputs (is a result cached by address?)")
        if self.memory:
            # a store outside an input's elements or past an output, an input written in place, a
            # call not made as a model makes it: the judge's own rebuild of the buffers says so
            return self.memory[0]
        # mutated inputs: a kernel that writes into its inputs corrupts the caller's tensors
        args, _ = registry.build_inputs(first_case, "cpu")
        for i, (name, arg) in enumerate(zip(a.get("inputs_after", []), args)):
            after = self.load(name)
            if isinstance(arg, torch.Tensor) and (after is None or not bitwise_equal(after, arg)):
                return f"input {i} was modified by kernel_fn (inputs must be left unchanged)"
        return self.observed()

    def load(self, name: str | None):
        """A saved output, held to the hash the witness carried as it was saved (harness/verdict/records.py)."""
        return load_output(self.out_dir, name, self.witnessed)

    def observed(self) -> str | None:
        for label, obs in self.observations:
            problem = observation_problem(label, obs, self.device)
            if problem:
                return problem
        if self.counted == 0:
            return "no test case counted: a trivial output would pass every case run"
        return None


def _tf32_hint(case: Case, obs: dict) -> str:
    """Why an fp32 case that fails may have failed: its dots ran as TF32, as they would on a GPU."""
    if case.dtype != "float32" or not obs.get("tf32_dots"):
        return ""
    return ("; its tl.dot multiplied fp32 operands as TF32 (10 mantissa bits), as every NVIDIA GPU since sm_80 "
            "does by default: an fp32 target is computed in fp32, so pass input_precision=\"ieee\" "
            "(or \"tf32x3\")")


def assess(events: list[dict], out_dir: Path, plan: Plan, device: str, witnessed=None,
           around_cases: list[Case] = (), more_records: dict[str, list[str]] | None = None) -> Assessment:
    """The verdict from the worker's records; `witnessed` (harness/timing/witness.py's Record) is what the
    judge's own clock saw of the timed reps, what the audit hook refused, and every record's and
    saved output's digest as the worker wrote it; `around_cases`: the shapes timed around the target;
    `more_records`: the records a backward's stages plan (harness/verdict/backward_checks.py)."""
    try:
        a = _assess_stages(events, out_dir, plan, device, witnessed)
    except RecordProblem as e:  # an output rewritten after it was saved, or never saved for its record
        a = Assessment().fail("integrity", str(e))
    # a record written by anyone but the worker, or one the plan never had, is a forgery
    forged = (told_problem(out_dir, witnessed) if witnessed is not None else None) \
        or plan_problem(events, plan, device, around_cases, more_records)
    if forged:
        return a.fail("integrity", f"the worker's records are not the judge's: {forged}")
    tampered = identity_problem(events, a)
    if tampered:
        return a.fail("integrity", tampered)
    if witnessed is not None and witnessed.refusals and a.verdict == "PASS":
        # the candidate tried what a kernel may not do and went on as if refused nothing
        more = f" (and {len(witnessed.refusals) - 1} more)" if len(witnessed.refusals) > 1 else ""
        return a.fail("integrity", witnessed.refusals[0] + more)
    return a


def identity_problem(events: list[dict], a: Assessment) -> str | None:
    """The worker's identity records of its clocks and functions, read against what it got to."""
    from harness.isolation.tamper import describe
    seen = {}
    for e in events:
        if e.get("event") == "identity":
            # a replaced clock or sync point fakes the time; a replaced check fakes a verdict
            if e.get("replaced"):
                return describe(e["replaced"], e.get("where", "during the run"))
            seen[e.get("where")] = True
    # a worker that went on without recording the check has had its checking switched off
    if a.stages.get("compile", {}).get("status") == "pass" and a.verdict != "COMPILE_ONLY" \
            and "after import" not in seen:
        return "the worker did not confirm its clocks and checks after import"
    if a.timing is not None and "after timing" not in seen:
        return "the worker did not confirm its clocks and checks after timing"
    return None


def _assess_stages(events: list[dict], out_dir: Path, plan: Plan, device: str, witnessed=None) -> Assessment:
    from harness.device.roofline import roofline_for, timing_summary
    stages = _group(events)
    a = Assessment(complete=any(e.get("event") == "done" for e in events))
    checker = _Checker(out_dir, plan, device, witnessed)
    for name in STAGES + ("timing",):
        s = stages.get(name)
        if s is None or not s["start"]:
            break
        end = s["end"]
        seconds = (end or {}).get("seconds", 0.0)
        if end is None:
            a.running_stage = name
        if name == "compile":
            problem = end and end["status"] == "fail" and end["detail"]
            if end and end.get("usage_error"):
                a.usage_error = end["detail"]
            a.resources = (end or {}).get("resources")
            if problem:
                return a.fail("compile", problem, seconds)
            if end:
                a.set("compile", "pass", end["detail"], seconds)
            if end and end.get("compile_only"):
                a.verdict = "COMPILE_ONLY"
                return a
            continue
        if name == "timing":
            if end and end["status"] == "pass":
                problem, end = _timing_problem(end, s["cases"], plan, out_dir, device, witnessed)
                if problem:
                    return a.fail("integrity", problem)
                a.timing = {**timing_summary(end), **end["trust"]}
                a.roofline = roofline_for(plan.timing, end, device)
            elif end:
                a.notes.append(f"timing failed: {end['detail']}")
                return a.fail("integrity", f"kernel_fn failed while being timed: {end['detail']}")
            continue
        if end is None and name != "integrity":
            return a  # the worker died inside this stage; the caller names how
        problem = {"determinism": lambda: checker.determinism(s["cases"]),
                   "integrity": lambda: checker.integrity(s["cases"])}.get(
            name, lambda: checker.correctness(name, s["cases"], end))()
        if problem:
            return a.fail(name, problem, seconds)
        if end is None:
            return a
        detail = _stage_detail(name, plan, checker)
        a.set(name, "pass", detail, seconds, **({"skipped": plan.skipped[name]} if name in plan.skipped else {}))
    if a.verdict == "PASS" and "integrity" in a.stages and a.timing is None:
        a.notes.append("timing was not recorded")
    if "integrity" not in a.stages and a.failed_stage is None:
        a.running_stage = a.running_stage or next((n for n in STAGES if n not in a.stages), None)
    return a


def _timing_problem(end: dict, recs: list[dict], plan: Plan, out_dir: Path, device: str,
                    witnessed) -> tuple[str | None, dict]:
    """Why the target's timing fails integrity, or None and the record the verdict's timing is made of
    (figures as the judge's clock saw them, and end["trust"]: spread_ok, spread_note, second_look)."""
    from harness.verdict import timing_checks
    from harness.timing.measurement import budget
    from harness.device.roofline import below_floor
    rounds = end.get("rounds") or [end["kernel"]]
    if witnessed is not None:
        problem, end = timing_checks.witnessed_rounds(end, witnessed, device, "kernel")
        if problem:
            return problem, end
        rounds = end["rounds"]
    else:
        end = {**end, "rounds": rounds}
    problem = timing_checks.timed_calls_problem(recs, plan.timing, budget(device), {**end, "rounds": rounds},
                                                _Checker(out_dir, None, device, witnessed))
    if problem:
        return problem, end
    impossible = below_floor(plan.timing, end["kernel"]["median_us"], device)
    if impossible:
        return impossible, end
    problem, look = timing_checks.second_look_problem(plan.timing, end, device)
    if problem:
        return problem, end
    trust = {**timing_checks.spread_verdict(rounds, device), "second_look": look,
             "rounds": [{k: r[k] for k in ("median_us", "iqr_us", "reps", "cpu_wait_pct") if k in r} for r in rounds]}
    return None, {**end, "trust": trust}


def _stage_detail(name: str, plan: Plan, checker: _Checker) -> str:
    if name == "integrity":
        detail = (f"replay, input mutation, aliasing, dense output, no PyTorch compute, kernel launches: ok; "
                  f"{checker.counted} cases counted")
        if checker.dropped:
            detail += f", {len(checker.dropped)} not counted ({'; '.join(checker.dropped[:3])})"
        return detail
    if name == "determinism":
        return "repeated calls on identical inputs are bitwise identical"
    detail = f"{len(plan.stages[name])} cases within tolerance"
    if name in plan.skipped:
        detail += "; " + "; ".join(plan.skipped[name])
    return detail
