"""The worker's backward stages: run after the forward's, in the same process, only when the file
defines backward_fn and its forward passed every stage here.

As for the forward, nothing here decides the verdict: every call's gradients are saved, its
observations recorded, and the judging process (harness/verdict/backward_checks.py) rebuilds
inputs, upstream gradients and float64 references and decides. The worker's own checks only
stop a failing stage early.
"""
from __future__ import annotations

import inspect

from harness.correctness import backward
from harness.correctness.backward import BackwardCall, event_stage
from harness.correctness.candidate import error_text
from harness.correctness.cases import Plan
from harness.kernel_types import registry
from harness.kernel_types.registry import Case


def signature_problem(fn, kt) -> str | None:
    want = ("grad_out", "out", *kt.params)
    try:
        names = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return "backward_fn has no inspectable signature"
    if names != want:
        defaults = [f"{p}={kt.defaults[p]!r}" if p in kt.defaults else p for p in want]
        return (f"backward_fn{names} does not match the {kt.name} contract: "
                f"def backward_fn({', '.join(defaults)})")
    return None


def run(w, plan: Plan) -> bool:
    """Every backward stage in order; False at the first that fails (the rest are not run)."""
    bp = backward.build(plan)
    steps = [("compile", lambda: compile_stage(w, bp.stages["compile"]))]
    steps += [(s, lambda s=s: checked_stage(w, s, bp.stages[s]))
              for s in ("shape_sweep", "stability", "edge_cases", "accumulation")]
    steps += [("integrity", lambda: integrity_stage(w, bp.stages["integrity"])),
              ("timing", lambda: timing_stage(w, bp.timing))]
    for stage, step in steps:
        if not step() or not w.untouched(f"after {event_stage(stage)}"):
            return False
    return True


def record(w, stage: str, role: str, case: Case, bc: BackwardCall, **extra) -> None:
    res = bc.result
    w.log.event(event="case", stage=event_stage(stage), role=role, case=case.to_json(), label=case.label(),
                grads=[w.log.save(g) for g in bc.grads()], error=bc.forward_error or (res.error if res else None),
                forward_error=bc.forward_error, obs=backward.observations(res) if res else {},
                seconds=res.seconds if res else 0.0, **extra)


def one_case(w, stage: str, case: Case, role: str = "check") -> tuple[BackwardCall, str | None]:
    args, kwargs = registry.build_inputs(case, w.device)
    bc = backward.call(w.module, case, args, kwargs, w.device, w.monitor)
    w.clocks_untouched(f"right after a call of backward_fn in {event_stage(stage)}")
    record(w, stage, role, case, bc)
    return bc, problem(case, bc)


def problem(case: Case, bc: BackwardCall) -> str | None:
    if bc.forward_error:
        return f"{case.label()}: kernel_fn raised before the backward\n{bc.forward_error}"
    if bc.result.error:
        return f"{case.label()}: backward_fn raised\n{bc.result.error}"
    return backward.check(case, backward.observations(bc.result)["returned"], bc.grads(),
                          registry.build_inputs(case, "cpu"))


def checked_stage(w, stage: str, cases: list[Case]) -> bool:
    w.log.start(event_stage(stage))
    for case in cases:
        _, why = one_case(w, stage, case)
        if why:
            w.log.end(event_stage(stage), "fail", why)
            return False
    w.log.end(event_stage(stage), "pass", f"{len(cases)} cases")
    return True


def compile_stage(w, cases: list[Case]) -> bool:
    """The contract (backward_fn's signature) and its first call."""
    w.log.start(event_stage("compile"))
    why = signature_problem(w.module.backward_fn, w.kt)
    if why is None:
        try:
            _, why = one_case(w, "compile", cases[0])
        except Exception as e:  # our own failure to build its inputs is reported, not hidden
            why = f"the first backward call could not be made:\n{error_text(e)}"
    w.log.end(event_stage("compile"), "fail" if why else "pass", why or "backward_fn ran its first case")
    return why is None


def integrity_stage(w, cases: list[Case]) -> bool:
    """Replay: a first call, then the same input buffers refilled in place with the second case's
    values; the backward must answer for the new values (no result cached by address)."""
    import torch
    stage = event_stage("integrity")
    w.log.start(stage)
    first, second = cases
    args, kwargs = registry.build_inputs(first, w.device)
    a = backward.call(w.module, first, args, kwargs, w.device, w.monitor)
    w.clocks_untouched(f"right after a call of backward_fn in {stage}")
    after = [w.log.save(t) for t in (a.grad_out, *args)] if a.result is not None else []
    record(w, "integrity", "replay_first", first, a, inputs_after=after)
    with torch.no_grad():
        for dst, src in zip(args, registry.build_inputs(second, w.device)[0]):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
    b = backward.call(w.module, second, args, kwargs, w.device, w.monitor)
    w.clocks_untouched(f"right after a call of backward_fn in {stage}")
    record(w, "integrity", "replay_second", second, b)
    error = (a.forward_error or (a.result.error if a.result else None)
             or b.forward_error or (b.result.error if b.result else None))
    w.log.end(stage, "fail" if error else "pass", error or "observations recorded")
    return not error


def timing_stage(w, case: Case) -> bool:
    """Forward, backward and forward+backward at the timing case, every rep reported to the judge's
    witness (phase bwd:<step>) and run under the op recorder; peak memory of one forward+backward.
    The eager and torch.compile figures are the clean worker's (harness/timing/backward_timing.py)."""
    from harness.correctness.integrity import ComputeRecorder
    from harness.timing import backward_timing
    stage = event_stage("timing")
    w.log.start(stage)
    recorders: list = []

    def recorder():
        recorders.append(ComputeRecorder(w.monitor))
        return recorders[-1]
    salt = w.noise.salt(stage)  # revealed in the stage's final record, after its last timed call
    try:
        # the process's one launch monitor is installed before the import and always on
        steps = backward_timing.CandidateSteps(case, w.device, w.module, recorder, salt)
        memory = backward_timing.peak_memory(steps)
        reps = {step: backward_timing.time_step(steps, step, w.report, f"bwd:{step}").reps
                for step in backward_timing.STEPS}
    except Exception as e:
        w.log.end(stage, "fail", f"kernel_fn or backward_fn raised while being timed:\n{error_text(e)}")
        return False
    w.log.end(stage, "pass", "timed", case=case.to_json(), reps=reps, memory=memory, noise_salt=salt,
              forbidden=sorted({op for r in recorders for op in r.forbidden}),
              host_reads=sorted({op for r in recorders for op in r.host_reads}))
    return True
