"""The worker's backward stages: run after the forward's, in the same process, only when the file
defines backward_fn and its forward passed every stage here.

As for the forward, nothing here decides the verdict: every call's gradients are saved, its
observations recorded, and the judging process (harness/verdict/backward_checks.py) rebuilds
inputs, upstream gradients and float64 references and decides. The worker's own checks only
stop a failing stage early.
"""
from __future__ import annotations

import inspect

import torch

from harness.correctness import backward
from harness.correctness.backward import DETERMINISM_CALLS, BackwardCall, event_stage
from harness.correctness.candidate import error_text
from harness.correctness.cases import Plan
from harness.correctness.compare import bitwise_equal
from harness.kernel_types.registry import Case

CHECKED = ("shape_sweep", "stability", "values", "edge_cases", "accumulation")


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


def around_cases(w, plan: Plan, timing) -> list[Case]:
    """The shapes around the target where the forward's were timed (a candidate that may be kept):
    the backward is checked there too, and its training serving range is where it was right."""
    from harness.verdict import around
    if w.around is None or w.target is None or timing is None:
        return []
    below = w.around.get("below_us")
    if below is not None and timing.median_us >= below:
        return []
    return around.cases(w.target, plan.timing.dtype)


def run(w, plan: Plan, timing=None) -> bool:
    """Every backward stage in order; False at the first that fails (the rest are not run).
    `timing`: the forward's TimedRun at the target (whether the shapes around it are checked)."""
    bp = backward.build(plan, w.caps, around_cases(w, plan, timing))
    steps = [("compile", lambda: compile_stage(w, bp.stages["compile"]))]
    steps += [(s, lambda s=s: checked_stage(w, s, bp.stages[s], bp)) for s in CHECKED]
    steps += [("determinism", lambda: determinism_stage(w, bp.stages["determinism"])),
              ("integrity", lambda: integrity_stage(w, bp.stages["integrity"])),
              ("timing", lambda: timing_stage(w, bp.timing))]
    if bp.around:
        steps.append((backward.AROUND, lambda: around_stage(w, bp.around, bp)))
    for stage, step in steps:
        if not step() or not w.untouched(f"after {event_stage(stage)}"):
            return False
    return True


def record(w, stage: str, role: str, case: Case, bc: BackwardCall, keep_out: bool = True, **extra) -> None:
    """One call's record; `keep_out`: the forward's output saved too (a case the forward was not judged at)."""
    res = bc.result
    w.log.event(event="case", stage=event_stage(stage), role=role, case=case.to_json(), label=case.label(),
                grads=[w.log.save(g) for g in bc.grads()], out=w.log.save(bc.out) if res and keep_out else None,
                error=bc.forward_error or (res.error if res else None),
                forward_error=bc.forward_error, obs=backward.observations(res) if res else {},
                seconds=res.seconds if res else 0.0, **extra)


def one_case(w, stage: str, case: Case, role: str = "check", keep_out: bool = True) -> tuple[BackwardCall, str | None]:
    args, kwargs = backward.inputs(case, w.device)
    bc = backward.call(w.module, case, args, kwargs, w.device, w.monitor)
    w.clocks_untouched(f"right after a call of backward_fn in {event_stage(stage)}")
    record(w, stage, role, case, bc, keep_out)
    return bc, problem(case, bc)


def problem(case: Case, bc: BackwardCall) -> str | None:
    if bc.forward_error:
        return f"{case.label()}: kernel_fn raised before the backward\n{bc.forward_error}"
    if bc.result.error:
        return f"{case.label()}: backward_fn raised\n{bc.result.error}"
    return backward.check(case, backward.observations(bc.result)["returned"], bc.grads(),
                          backward.inputs(case, "cpu"))


def checked_stage(w, stage: str, cases: list[Case], bp) -> bool:
    w.log.start(event_stage(stage))
    for case in cases:
        _, why = one_case(w, stage, case, keep_out=bp.checks_forward(case))
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
            _, why = one_case(w, "compile", cases[0], keep_out=False)  # the smoke case: the forward's
        except Exception as e:  # our own failure to build its inputs is reported, not hidden
            why = f"the first backward call could not be made:\n{error_text(e)}"
    w.log.end(event_stage("compile"), "fail" if why else "pass", why or "backward_fn ran its first case")
    return why is None


def _spacers(device: str, call: int) -> list:
    """Allocations between two calls, kept until the stage ends: whatever the next call allocates
    lands at other addresses (a sum whose order follows an address, as atomics' does, shows). One of
    them grows by 64 bytes a call: six that each grew so would move the next allocation by 384 bytes
    a call, which leaves an address's 64-byte line the same modulo 2, 3 or 6."""
    return [torch.empty(2 ** k, dtype=torch.uint8, device=device) for k in range(8, 24, 3)] + \
        [torch.empty(64 * (call + 1), dtype=torch.uint8, device=device)]


def determinism_stage(w, cases: list[Case]) -> bool:
    """Each case called DETERMINISM_CALLS times on identical inputs, everything of every call held
    (no address reused) and allocations between calls: every gradient bitwise the same each time."""
    stage = event_stage("determinism")
    w.log.start(stage)
    held: list = []
    for case in cases:
        first = None
        for i in range(DETERMINISM_CALLS):
            held.append(_spacers(w.device, i))
            args, kwargs = backward.inputs(case, w.device)
            bc = backward.call(w.module, case, args, kwargs, w.device, w.monitor)
            w.clocks_untouched(f"right after a call of backward_fn in {stage}")
            record(w, "determinism", "repeat", case, bc, call=i)
            held.append((args, bc))
            why = problem(case, bc) if i == 0 else (bc.forward_error or (bc.result.error if bc.result else None))
            if why is None and first is not None and not _same(first, bc.grads()):
                why = (f"{case.label()}: {DETERMINISM_CALLS} calls on identical inputs gave gradients that "
                       "differ bitwise")
            if why:
                w.log.end(stage, "fail", why)
                return False
            first = first if first is not None else bc.grads()
    w.log.end(stage, "pass", f"{DETERMINISM_CALLS} calls on identical inputs bitwise equal")
    return True


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)
                                    and bitwise_equal(x.cpu(), y.cpu()) for x, y in zip(a, b))


def integrity_stage(w, cases: list[Case]) -> bool:
    """Replay: a first call, then the same input buffers refilled in place with the second case's
    values; the backward must answer for the new values (no result cached by address)."""
    stage = event_stage("integrity")
    w.log.start(stage)
    first, second = cases
    args, kwargs = backward.inputs(first, w.device)
    a = backward.call(w.module, first, args, kwargs, w.device, w.monitor)
    w.clocks_untouched(f"right after a call of backward_fn in {stage}")
    after = [w.log.save(t) for t in (a.grad_out, *args)] if a.result is not None else []
    record(w, "integrity", "replay_first", first, a, keep_out=False, inputs_after=after)
    with torch.no_grad():
        for dst, src in zip(args, backward.inputs(second, w.device)[0]):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)
    b = backward.call(w.module, second, args, kwargs, w.device, w.monitor)
    w.clocks_untouched(f"right after a call of backward_fn in {stage}")
    record(w, "integrity", "replay_second", second, b, keep_out=False)
    error = (a.forward_error or (a.result.error if a.result else None)
             or b.forward_error or (b.result.error if b.result else None))
    w.log.end(stage, "fail" if error else "pass", error or "observations recorded")
    return not error


def around_stage(w, cases: list[Case], bp) -> bool:
    """The shapes around the target, each called and recorded whatever the last gave: the judging
    process decides at which the backward was right (its training serving range)."""
    stage = event_stage(backward.AROUND)
    w.log.start(stage)
    for case in cases:
        one_case(w, backward.AROUND, case, keep_out=bp.checks_forward(case))
    w.log.end(stage, "pass", f"{len(cases)} shapes recorded")
    return True


def timing_stage(w, case: Case) -> bool:
    """Forward, backward and forward+backward at the timing case, every rep reported to the judge's
    witness (phase bwd:<step>), every timed call recorded and checked like a checked call
    (harness/timing/backward_timed.py); peak memory of one forward+backward. The eager and
    torch.compile figures are the clean worker's (harness/timing/backward_timing.py)."""
    from harness.correctness.integrity import ComputeRecorder
    from harness.timing import backward_timing, measurement
    from harness.timing.backward_timed import TimedStep
    from harness.timing.timer import time_fn
    stage = event_stage("timing")
    w.log.start(stage)
    limits = measurement.budget(w.device)
    # revealed in the stage's final record, after its last timed call: each step's salt and key
    secrets = {step: (w.noise.salt(f"{stage}:{step}"), w.noise.salt(f"{stage}:{step}:outputs"))
               for step in backward_timing.STEPS}
    steps: dict = {}
    try:
        memory = backward_timing.peak_memory(backward_timing.CandidateSteps(  # values of its own, never revealed
            case, w.device, w.module, lambda: ComputeRecorder(w.monitor), w.noise.salt(f"{stage}:memory")))
        for step, (salt, key) in secrets.items():
            timed = TimedStep(w.module, case, w.device, step, w.monitor, w.log, stage, salt, key, limits,
                              check=lambda: w.clocks_untouched("right after a timed call of backward_fn"))
            run = time_fn(timed.call, device=w.device, before_each=timed.before, report=w.report,
                          phase=f"bwd:{step}", **limits)
            timed.finish(last=True)
            w.clocks_untouched(f"right after the timed calls of {step} in {stage}")
            steps[step] = {"reps": run.reps, "held": [{str(r): n for r, n in h.items()} for h in timed.close()]}
    except Exception as e:
        w.log.end(stage, "fail", f"kernel_fn or backward_fn raised while being timed:\n{error_text(e)}")
        return False
    w.log.end(stage, "pass", "timed", case=case.to_json(), memory=memory, steps=steps,
              secrets={step: {"noise_salt": salt, "output_key": key} for step, (salt, key) in secrets.items()})
    return True
