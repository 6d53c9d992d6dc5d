"""The judging process's reading of the backward's timed calls (harness/timing/backward_timed.py):
each held to the integrity rules and each output to its reference, as the forward's timed calls
are (harness/verdict/timing_checks.py).

Per step (forward, backward, forward+backward): a record for every call the witness saw (warm-ups
and reps), the worker's count of reps the witness's own; each call's observations within the rules
(no PyTorch compute or host reads, a launch, grad_out and the inputs untouched, every gradient its
own tensor); each device comparison passed (or skipped only where this process agrees it is
unaffordable); the saved outputs exactly the reps the revealed key chose, each with the checksum sent
as its rep was recorded; and the saved outputs compared here with references rebuilt from the rep's
fresh inputs and grad_out (harness/timing/backward_timing.py's fresh_upstream): every rep where that
is cheap, else more than half of them, the first and last always.
"""
from __future__ import annotations

from pathlib import Path

import torch

from harness.correctness import backward
from harness.correctness.integrity import observation_problem
from harness.kernel_types import registry
from harness.kernel_types.registry import Case
from harness.timing.backward_timed import BACKWARD, FORWARD, policy, slots
from harness.timing.backward_timing import STEPS, fresh_upstream
from harness.timing.fresh_inputs import fresh_args
from harness.timing.timed_outputs import keyed_checksum, saved_reps
from harness.verdict.records import load_output
from harness.verdict.timing_checks import chosen_reps, expected_reps, rep_name


def timed_problem(events: list[dict], end: dict, case: Case, device: str, out_dir: Path, witnessed) -> str | None:
    """Why the backward's timed calls fail it, or None."""
    from harness.timing.measurement import budget
    limits = budget(device)
    steps = end.get("steps") if isinstance(end.get("steps"), dict) else {}
    secrets = end.get("secrets") if isinstance(end.get("secrets"), dict) else {}
    for step in STEPS:
        seen = witnessed.reps(f"bwd:{step}") if witnessed is not None else None
        reps = len(seen.samples_us) if seen is not None else 0
        told = steps.get(step) or {}
        if int(told.get("reps", -1)) != reps:
            return (f"the worker's record of the backward's {step} timing ({told.get('reps')} reps) differs from the "
                    f"{reps} reps it reported to the judge as they ended")
        recs = {int(e.get("rep", -10**9)): e for e in events if e.get("event") == "case"
                and e.get("stage") == backward.event_stage("timing") and e.get("role") == f"timed:{step}"}
        problem = _step_problem(step, recs, expected_reps(int(limits["warmup"]), reps), case, device) or \
            _saved_problem(step, recs, told, secrets.get(step) or {}, case, device, limits, reps, out_dir, witnessed)
        if problem:
            return problem
    return None


def _label(step: str, rep: int, case: Case) -> str:
    return f"{rep_name(rep)} of the backward's {step.replace('_', '+')} timing at {case.label()}"


def _step_problem(step: str, recs: dict[int, dict], expected: list[int], case: Case, device: str) -> str | None:
    """Every call recorded, within the rules, and right on the device."""
    from harness.timing.device_check import unaffordable
    kt = registry.get(case.kernel_type)
    missing = [rep for rep in expected if rep not in recs]
    if missing:
        # an unrecorded call is an unchecked one
        return (f"the worker recorded no outputs for {len(missing)} timed call(s) of the backward's {step} "
                f"(reps {missing[:5]}): every timed call is checked")
    for rep in expected:
        label, obs = _label(step, rep, case), recs[rep].get("obs") or {}
        if step in FORWARD or "forward" in obs:
            # the reference op in disguise, when timed: the forward's rules on every timed forward
            why = observation_problem(label, obs.get("forward") or {}, device)
            if why:
                return why
        if step in BACKWARD:
            why = backward.observation_problem(label, obs.get("backward") or {}, device, kt)
            if why:
                return why
        check = recs[rep].get("device_check")
        if not isinstance(check, dict):
            return f"the worker did not compare the outputs of {label} on the device: every timed call is checked"
        if "skipped" in check:
            if unaffordable(case, device) is None:
                return f"the worker skipped comparing the outputs of {label} on the device, where the judge plans it"
        elif not check.get("ok"):
            # right only when checked: a timed call that does nothing, or answers an old grad_out
            return f"a timed call gave a wrong result ({label}), compared on the device: {check.get('detail')}"
    return None


def _saved_problem(step: str, recs: dict[int, dict], told: dict, secrets: dict, case: Case, device: str,
                   limits: dict, reps: int, out_dir: Path, witnessed) -> str | None:
    """The saved outputs: the reps the revealed key chose, each with its rep's checksum, each right."""
    key, salt = secrets.get("output_key"), int(secrets.get("noise_salt") or 0)
    if not isinstance(key, int):
        return f"the worker did not reveal the key that chose the backward's saved {step} outputs"
    base, kwargs = registry.build_inputs(case, device)
    names = slots(step, len(registry.get(case.kernel_type).grad_params))
    chosen = saved_reps(policy(case, base, kwargs, device, limits, step), key, int(limits["warmup"]), [reps])
    held = told.get("held") if isinstance(told.get("held"), list) else [{} for _ in names]
    saved: list[dict[int, str]] = []
    for j, _ in enumerate(names):
        mine = {rep: (rec.get("outputs") or [None] * len(names))[j] for rep, rec in recs.items()}
        mine = {rep: name for rep, name in mine.items() if name}
        mine.update({int(rep): name for rep, name in (held[j] if j < len(held) else {}).items()})
        if sorted(mine) != sorted(chosen):
            return (f"the backward's saved {step} outputs (reps {sorted(mine)[:12]}) are not the ones the judge's key "
                    f"chose (reps {chosen[:12]})")
        saved.append(mine)
    tables: dict = {}
    loaded: dict[int, list] = {}
    for rep in chosen:
        loaded[rep] = [load_output(out_dir, s[rep], witnessed) for s in saved]
        sums = recs[rep].get("checksums") or []
        if [keyed_checksum(t, key, tables) for t in loaded[rep]] != list(sums[:len(names)]):
            return (f"a saved output of {_label(step, rep, case)} differs from the one checksummed on the device as "
                    "its rep was recorded: replaced after the rep")
    elements = sum(a.numel() for a in base if isinstance(a, torch.Tensor))
    for rep in chosen_reps(chosen, elements):
        why = _recheck(step, rep, loaded[rep], recs[rep], case, base, kwargs, device, salt)
        if why:
            return f"a timed call gave a wrong result ({_label(step, rep, case)}): {why}"
    return None


def _recheck(step: str, rep: int, outputs: list, rec: dict, case: Case, base: list, kwargs: dict, device: str,
             salt: int) -> str | None:
    """One saved rep against references rebuilt here from its fresh inputs and grad_out."""
    args, _ = fresh_args(case, rep, device, salt)
    grad_out = fresh_upstream(case, rep, base, kwargs, device, salt) if step in BACKWARD else None
    cpu = ([registry.to_device(a, "cpu") for a in args], kwargs)
    if step in FORWARD:
        why = backward.forward_problem(case, outputs[0], cpu)
        if why:
            return why
        outputs = outputs[1:]
    if step in BACKWARD:
        returned = rec.get("returned") or "nothing"
        return (backward.returned_problem(case, returned, outputs, cpu[0])
                or backward.values_problem(case, outputs, cpu, grad_out.to("cpu")))
    return None
