"""The judging process's reading of the worker's backward records: the verdict's `backward` object.

The forward's verdict is decided as if there were no backward (harness/verdict/verdict_checks.py);
a file with backward_fn gets beside it {"verdict", "failed_stage", "stages", "timing", "memory"},
decided here from the gradients the worker saved, against references rebuilt here
(harness/correctness/backward.py, harness/kernel_types/gradients.py). A forward that passes with
a backward that fails still serves inference, and the verdict says so (harness/judge.py's `serves`).

Each integrity check carries a one-line comment naming the hack it blocks.
"""
from __future__ import annotations

from pathlib import Path

import torch

from harness.correctness import backward, backward_values
from harness.correctness.backward import BackwardPlan, event_stage
from harness.correctness.compare import bitwise_equal
from harness.correctness.unspecified import hint as unspecified_hint
from harness.kernel_types import registry
from harness.kernel_types.registry import Case
from harness.verdict.records import key, load_output

STAGES = backward.STAGES + ("timing",)
GRAD_OUT_LAYOUTS = ("dense", "strided", "offset", "column-major", "broadcast")
CHECKED = ("shape_sweep", "stability", "values", "edge_cases", "accumulation")


def planned(bp: BackwardPlan, events: list[dict] = (), device: str = "cpu") -> dict[str, list[str]]:
    """Every record the plan puts in each backward stage (records.plan_problem holds the worker to
    it). The timing's reps are the worker's count where it passed (held to the witness's count by
    harness/verdict/backward_timed_checks.py); a timing that failed is held to nothing more."""
    from harness.timing.backward_timing import STEPS
    from harness.timing.measurement import budget
    from harness.verdict.timing_checks import expected_reps
    out = {event_stage("compile"): [key("check", bp.stages["compile"][0].to_json())]}
    for stage in CHECKED:
        out[event_stage(stage)] = [key("check", c.to_json()) for c in bp.stages[stage]]
    out[event_stage("determinism")] = [key("repeat", c.to_json()) for c in bp.stages["determinism"]
                                       for _ in range(backward.DETERMINISM_CALLS)]
    first, second = bp.stages["integrity"]
    out[event_stage("integrity")] = [key("replay_first", first.to_json()), key("replay_second", second.to_json())]
    out[event_stage(backward.AROUND)] = [key("check", c.to_json()) for c in bp.around]
    stage = event_stage("timing")
    end = next((e for e in events if e.get("event") == "stage_end" and e.get("stage") == stage), None)
    if end is not None and end.get("status") == "pass" and bp.timing is not None:
        warmup = int(budget(device)["warmup"])
        steps = end.get("steps") if isinstance(end.get("steps"), dict) else {}
        out[stage] = [key(f"timed:{step}", bp.timing.to_json(), rep) for step in STEPS
                      for rep in expected_reps(warmup, int((steps.get(step) or {}).get("reps", 0)))]
    else:
        out[stage] = [key(e.get("role"), e.get("case"), e.get("rep")) for e in events
                      if e.get("event") == "case" and e.get("stage") == stage]
    return out


def around_cases(events: list[dict], plan, target: Case | None, asked: bool) -> list[Case]:
    """The shapes around the target where the backward is checked too: where the forward's were
    (harness/workers/backward_stages.py skips them with the forward's, for a candidate not kept)."""
    from harness.verdict import around
    if not asked or target is None or any(e.get("event") == "around_skipped" for e in events):
        return []
    return around.cases(target, plan.timing.dtype)


def not_run(why: str) -> dict:
    return {"verdict": "NOT_RUN", "failed_stage": None, "detail": why,
            "stages": [_skip(s, why) for s in STAGES], "timing": None, "memory": None}


def _skip(stage: str, why: str) -> dict:
    return {"name": stage, "status": "skip", "detail": why, "seconds": 0.0}


class _Reader:
    def __init__(self, out_dir: Path, witnessed, device: str, kt, bp: BackwardPlan):
        self.out_dir, self.witnessed, self.device, self.kt, self.bp = out_dir, witnessed, device, kt, bp
        self.observations: list[tuple[str, dict]] = []

    def load(self, name):
        return load_output(self.out_dir, name, self.witnessed)

    def check(self, rec: dict, case: Case) -> str | None:
        if rec.get("forward_error"):
            return f"{case.label()}: kernel_fn raised before the backward\n{rec['forward_error']}"
        if rec.get("error"):
            return f"{case.label()}: backward_fn raised\n{rec['error']}"
        obs = rec.get("obs", {})
        self.observations.append((case.label(), obs))
        grads = [self.load(name) for name in rec.get("grads", [])]
        out = self.load(rec.get("out")) if self.bp.checks_forward(case) else None
        if out is None and self.bp.checks_forward(case):
            return f"{case.label()}: the worker saved no output of kernel_fn for this training call"
        why = backward.check(case, obs.get("returned", "nothing"), grads, backward.inputs(case, "cpu"), out)
        return why + unspecified_hint(obs) if why else None

    def stage(self, stage: str, cases: list[Case], recs: list[dict], end: dict | None) -> str | None:
        for i, case in enumerate(cases):
            if i >= len(recs):
                return (end or {}).get("detail") or f"the worker stopped before {case.label()}"
            if Case.from_json(recs[i]["case"]) != case:
                return f"the worker's record {i} does not match the judge's plan ({case.label()})"
            why = self.check(recs[i], case)
            if why:
                return why
        if end is not None and end.get("status") == "fail":
            return end.get("detail", "the worker reported a failure")
        return None

    def determinism(self, cases: list[Case], recs: list[dict], end: dict | None) -> str | None:
        """Every call right, and every call's gradients bitwise the first's."""
        n = backward.DETERMINISM_CALLS
        why = self.stage("determinism", [c for c in cases for _ in range(n)], recs, end)
        if why:
            return why
        for i, case in enumerate(cases):
            calls = [[self.load(name) for name in r.get("grads", [])] for r in recs[i * n:(i + 1) * n]]
            for later in calls[1:]:
                # a sum whose order follows an address (atomics, a start chosen by a pointer) differs here
                if len(later) != len(calls[0]) or not all(bitwise_equal(a, b) for a, b in zip(calls[0], later)):
                    return (f"{case.label()}: {n} calls on identical inputs (allocations between them) gave "
                            "gradients that differ bitwise: a backward's result may not depend on where its "
                            "buffers lie or on the order its programs run")
        return None

    def integrity(self, cases: list[Case], recs: list[dict]) -> str | None:
        first, second = cases
        by_role = {r.get("role"): r for r in recs}
        a, b = by_role.get("replay_first"), by_role.get("replay_second")
        if a is None or b is None:
            return "the worker did not record the backward's replay check"
        why = self.check(a, first)
        if why:
            return why
        # result replay: a backward that caches gradients by buffer address returns the old ones here
        if self.check(b, second):
            return ("result replay: after the same input buffers were refilled in place with new values, the "
                    "gradients did not match the new inputs (are gradients cached by address?)")
        for label, obs in self.observations:  # what each call did: named more exactly than a changed input
            why = backward.observation_problem(label, obs, self.device, self.kt)
            if why:
                return why
        args, kwargs = backward.inputs(first, "cpu")
        given = [backward_values.upstream(first, args, kwargs), *args]
        for i, (name, want) in enumerate(zip(a.get("inputs_after", []), given)):
            after = self.load(name)
            # a backward writing into grad_out or an input corrupts tensors autograd still holds
            if isinstance(want, torch.Tensor) and (after is None or not bitwise_equal(after, want)):
                what = "grad_out" if i == 0 else self.kt.params[i - 1]
                return f"{what} was modified by backward_fn{backward.READ_ONLY if i == 0 else ''}"
        return None

    def around(self, cases: list[Case], recs: list[dict]) -> list[dict]:
        """Each shape around the target: whether the backward (and its forward) was right there."""
        rows = []
        for case in cases:
            row = {"shape": case.label(), "dims": case.dims, "ok": False, "failed": False}
            rec = next((r for r in recs if Case.from_json(r["case"]) == case), None)
            if rec is None:
                rows.append({**row, "detail": "not checked: the worker stopped before this shape"})
                continue
            why = self.check(rec, case) or backward.observation_problem(case.label(), rec.get("obs", {}),
                                                                        self.device, self.kt)
            rows.append({**row, "ok": why is None, "failed": why is not None,
                         "detail": why or "gradients within tolerance"})
        return rows


def assess(events: list[dict], out_dir: Path, bp: BackwardPlan, device: str, witnessed, kernel_type: str) -> dict:
    """The backward object from the worker's records (the forward passed; the caller checked);
    with shapes around the target, its "around": where the backward was right (its training range)."""
    groups: dict[str, dict] = {}
    for e in events:
        stage = str(e.get("stage", ""))
        if not stage.startswith(backward.PREFIX):
            continue
        g = groups.setdefault(stage[len(backward.PREFIX):], {"start": False, "end": None, "cases": []})
        if e.get("event") == "stage_start":
            g["start"] = True
        elif e.get("event") == "stage_end":
            g["end"] = e
        elif e.get("event") == "case":
            g["cases"].append(e)
    reader = _Reader(out_dir, witnessed, device, registry.get(kernel_type), bp)
    result = {"verdict": "PASS", "failed_stage": None, "stages": [], "timing": None, "memory": None}
    for stage in backward.STAGES:
        g = groups.get(stage)
        if g is None or not g["start"]:
            if not any(e.get("event") == "done" for e in events):
                result["running_stage"] = stage  # the worker died between two stages
                return result
            return _stopped(result, stage, "the worker never started it")
        end = g["end"]
        cases = bp.stages[stage]
        why = _stage_problem(reader, stage, cases, g["cases"], end) if end is not None else None
        if end is None and why is None:
            result["running_stage"] = stage
            return _stopped(result, stage, "the worker stopped during this stage", verdict="CRASH")
        if why:
            return _failed(result, stage, why, end)
        result["stages"].append({"name": stage, "status": "pass", "detail": _detail(stage, cases, reader),
                                 "seconds": end.get("seconds", 0.0)})
    if bp.around:
        recs = (groups.get(backward.AROUND) or {}).get("cases", [])
        result["around"] = {"shapes": reader.around(bp.around, recs)}
    # the grad_out layouts every passing backward was judged under: a served op hands them on uncopied
    result["grad_out_layouts"] = list(GRAD_OUT_LAYOUTS)
    return _with_rest(result)


def _stage_problem(reader: _Reader, stage: str, cases: list[Case], recs: list[dict], end: dict) -> str | None:
    failed = end.get("detail") if end.get("status") == "fail" else None
    if stage == "compile":  # a refused signature records no call: the worker's words are the contract's
        return failed or reader.stage(stage, cases[:1], recs, end)
    if stage == "integrity":
        return reader.integrity(cases, recs) or failed
    if stage == "determinism":
        return reader.determinism(cases, recs, end)
    return reader.stage(stage, cases, recs, end)


def _detail(stage: str, cases: list[Case], reader: _Reader) -> str:
    if stage == "integrity":
        return ("replay, grad_out and inputs unchanged, no gradient aliasing grad_out, out or an input, "
                "no PyTorch compute, kernel launches: ok")
    if stage == "accumulation":
        summed = reader.kt.summed_grads
        what = f"gradients of {', '.join(summed)} summed over every row" if summed else "gradients"
        return (f"{len(cases)} cases under a gradient correlated with the output "
                f"({', '.join(c.label() for c in cases)}): {what} within tolerance")
    if stage == "determinism":
        return f"{backward.DETERMINISM_CALLS} calls on identical inputs, allocations between them: bitwise equal"
    if stage == "compile":
        return "backward_fn matches the contract and ran its first case"
    return f"{len(cases)} cases within the gradient tolerance"


def _failed(result: dict, stage: str, why: str, end: dict | None, verdict: str = "FAIL") -> dict:
    result["stages"].append({"name": stage, "status": "fail", "detail": why, "seconds": (end or {}).get("seconds", 0.0)})
    result.update(verdict=verdict, failed_stage=stage)
    return _with_rest(result)


def _stopped(result: dict, stage: str, why: str, verdict: str = "FAIL") -> dict:
    return _failed(result, stage, why, None, verdict)


def _with_rest(result: dict) -> dict:
    done = {s["name"] for s in result["stages"]}
    why = "not run: an earlier backward stage failed" if result["failed_stage"] else "not run"
    result["stages"] += [_skip(s, why) for s in STAGES if s not in done]
    return result


def replace_stage(result: dict, stage: str, status: str, detail: str) -> dict:
    """`result` with `stage` decided: a failure fails the backward there."""
    for s in result["stages"]:
        if s["name"] == stage:
            s.update(status=status, detail=detail)
    if status == "fail":
        result.update(verdict="FAIL", failed_stage=stage, timing=None, memory=None)
    return result


def died(result: dict, stage: str, child, timeout_s: float) -> dict:
    """A worker that hung or died in the backward decides the backward's verdict (the forward's stands)."""
    result["stages"] = [s for s in result["stages"] if s["name"] != stage and s["status"] != "skip"]
    result["verdict"], result["failed_stage"] = "FAIL", None
    if child.timed_out:
        why = f"no result after {timeout_s:.0f} s during the backward's {stage}; the worker's process group was killed"
        return _failed(result, stage, why, None, "TIMEOUT")
    tail = child.stderr_tail()
    how = child.signal_name or f"exit status {child.returncode}"
    return _failed(result, stage, f"the worker died ({how}) during the backward's {stage}"
                   + (f":\n{tail}" if tail else ""), None, "CRASH")
