"""The judging process's reading of a timing: every timed call held to the integrity rules and its
output compared with the reference, the figures held to the judge's own clock, the reps' spread
judged, and a second look at an excessive speedup (harness/timing/spread.py).

Timed outputs. The worker recorded every timed call's observations, its output's keyed checksum
and its comparison with the reference on the device, and saved a sample of the outputs that a key
chose, secret until the timing ended (harness/timing/timed_outputs.py). Here every call's observations
are checked and every device comparison must have passed (or been skipped where this process
agrees it is unaffordable: harness/timing/device_check.py); the saved set must be exactly the one the
revealed key chooses; each saved output must have the checksum sent as its rep was recorded,
recomputed here on the CPU from its bytes; and the saved outputs are compared with the references
rebuilt from (case, rep) (harness/timing/fresh_inputs.py): all of them, or where every call's output
was saved and comparing all is dear, a sample this process draws after the worker has exited (the
first, the last and more at random: chosen_reps). A kernel wrong on a fraction f of the reps
survives s random checks with probability about (1 - f)^s, and it must be wrong on more than half
of them to move the median; the device comparisons see every rep.
"""
from __future__ import annotations

import random

from harness.timing import spread
from harness.timing.fresh_inputs import perturbed, scales
from harness.kernel_types.registry import Case

# the reps' input elements, summed, under which every timed output is compared (the attacks' tiny
# targets; the CPU's default timing shapes are sampled, as a GPU's are: the judge's wall time stays flat)
CHECK_ALL_ELEMENTS = 2**20
MAX_CHECKED = 12
_draw = random.SystemRandom()  # drawn after the worker has exited: nothing of it is in the worker's process


def expected_reps(warmup: int, reps: int) -> list[int]:
    return [-1 - i for i in range(warmup)] + list(range(reps))


def rep_name(rep: int) -> str:
    return f"timed rep {rep}" if rep >= 0 else f"warm-up call {-rep}"


def chosen_reps(reps: list[int], elements: int) -> list[int]:
    """Every rep where that is cheap; else more than half of them (at most MAX_CHECKED), the first
    and last always: a kernel wrong on enough reps to move the median is wrong on more than half,
    so where more than half are checked it is caught for certain, elsewhere all but surely."""
    if len(reps) * elements <= CHECK_ALL_ELEMENTS:
        return list(reps)
    k = min(len(reps), max(len(reps) // 2 + 1, 2), MAX_CHECKED)
    middle = _draw.sample(reps[1:-1], k - 2)
    return [reps[0], *sorted(middle), reps[-1]]


def timed_calls_problem(recs: list[dict], case: Case, limits: dict, end: dict, checker) -> str | None:
    """Why the timed calls of `case` fail integrity, or None: every call's observations and device
    comparison, the saved outputs' set and checksums, and the saved outputs against the reference of
    their fresh values, compared by `checker` (a harness.verdict.verdict_checks._Checker). `limits`: the
    timing's budget; `end`: its final record (rounds, noise_salt, output_key, held_outputs)."""
    from harness.correctness.integrity import observation_problem
    device, warmup = checker.device, int(limits.get("warmup", 0))
    rounds = [int(r.get("reps", 0)) for r in (end.get("rounds") or [end.get("kernel") or {}])]
    by_rep: dict[int, dict] = {}
    for r in recs:
        if r.get("role") != "timed":
            continue
        if Case.from_json(r["case"]) != case:
            return f"the worker's timed record of {r.get('label')} is not the judge's timing case {case.label()}"
        by_rep.setdefault(int(r.get("rep", -10**9)), r)
    expected = expected_reps(warmup, sum(rounds))
    missing = [rep for rep in expected if rep not in by_rep]
    if missing:
        # an unrecorded call is an unchecked one: a kernel wrong there would go unseen
        return f"the worker recorded no output for {len(missing)} timed call(s) (reps {missing[:5]}): every timed call is checked"
    for rep in expected:
        # the integrity rules on every timed call: one that computes with PyTorch when timed is caught here
        problem = observation_problem(f"{rep_name(rep)} at {case.label()}", by_rep[rep].get("obs", {}), device) \
            or device_check_problem(by_rep[rep], rep, case, device)
        if problem:
            return problem
    return saved_outputs_problem(by_rep, case, limits, end, rounds, checker)


def device_check_problem(rec: dict, rep: int, case: Case, device: str) -> str | None:
    """Why the worker's comparison of one timed output on the device fails it, or None."""
    from harness.timing.device_check import unaffordable
    check = rec.get("device_check")
    if not isinstance(check, dict):
        return f"the worker did not compare the output of {rep_name(rep)} on the device: every timed call is checked"
    if "skipped" in check:
        if unaffordable(case, device) is None:
            # a comparison skipped where the judge plans one: an unseen rep
            return f"the worker skipped comparing the output of {rep_name(rep)} on the device, where the judge plans it"
        return None
    if not check.get("ok"):
        # right only when saved: a rep that never leaves the device, wrong there
        return (f"a timed call gave a wrong result ({rep_name(rep)}), compared on the device "
                f"({check.get('how')}): {check.get('detail')}")
    return None


def saved_outputs_problem(by_rep: dict[int, dict], case: Case, limits: dict, end: dict, rounds: list[int],
                          checker) -> str | None:
    """The saved outputs: the set the revealed key chose, each with its rep's checksum, each right."""
    from harness.kernel_types import registry
    from harness.timing.timed_outputs import keyed_checksum, save_policy, saved_reps
    key, salt = end.get("output_key"), int(end.get("noise_salt") or 0)
    if not isinstance(key, int):
        return "the worker did not reveal the key that chose its saved timed outputs"
    held = {int(rep): name for rep, name in (end.get("held_outputs") or {}).items()}
    saved = {rep: rec["output"] for rep, rec in by_rep.items() if rec.get("output")}
    if set(saved) & set(held):
        return "the worker saved a timed output twice"
    saved.update(held)
    base, kwargs = registry.build_inputs(case, checker.device)  # once: every rep's values are made from it
    policy = save_policy(case, base, kwargs, checker.device, limits)
    chosen = saved_reps(policy, key, int(limits.get("warmup", 0)), rounds)
    if sorted(saved) != sorted(chosen):
        # a rep saved because it came out right, or one the key chose left unsaved
        return (f"the timed outputs saved (reps {sorted(saved)[:12]}) are not the ones the judge's key chose "
                f"(reps {chosen[:12]})")
    tables: dict = {}  # the key's tables, drawn once for every saved output
    for rep in chosen:
        told = by_rep[rep].get("checksum")
        if keyed_checksum(checker.load(saved[rep]), key, tables) != told:
            # an output swapped after its rep (on the device while held, or on the way to the file)
            return (f"the saved output of {rep_name(rep)} differs from the one checksummed on the device as its rep "
                    "was recorded: replaced after the rep")
    spread_of = scales(base)
    elements = sum(a.numel() for a in base if hasattr(a, "numel"))
    for rep in (chosen_reps(chosen, elements) if policy.every else chosen):
        inputs = ([registry.to_device(a, "cpu") for a in perturbed(base, spread_of, case, rep, checker.device, salt)],
                  kwargs)
        rec = {**by_rep[rep], "output": saved[rep]}
        problem = checker.check_output(rec, case, inputs, trivial=False)  # counting is the stages' job
        if problem:
            # right only when checked: a timed call whose answer is wrong, whichever rep it was
            return f"a timed call gave a wrong result ({rep_name(rep)}): {problem}"
    return None


def witnessed_rounds(end: dict, witnessed, device: str, phase: str) -> tuple[str | None, dict]:
    """The timing record with every round's figures as the judge witnessed them (the reps it was told
    of as they ended, rechecked against its own clock), or why they cannot be trusted."""
    from harness.timing.witness import agreement, disagreement_text
    problem = channel_problem(witnessed, device)
    if problem:
        return problem, end
    kernel = witnessed.reps(phase)
    if kernel is None or not kernel.samples_us:
        return "the worker timed the kernel without reporting its reps to the judge as they ended", end
    rounds = end.get("rounds") or [end["kernel"]]
    reported = [x for r in rounds for x in r.get("samples_us", [])]
    if kernel.samples_us != reported or len(rounds) > 2:
        # a sample rewritten after it was sent: the record disagrees with what the judge was told
        return "the worker's timing record differs from the reps it reported to the judge as they ended", end
    check = agreement(kernel, witnessed.reps("null"))
    if not check["agrees"]:
        # a clock swapped for one call, samples shrunk through a frame: the judge's clock disagrees
        return disagreement_text(check), end
    cut = len(kernel.samples_us) - len(rounds[-1]["samples_us"])
    seen = [_round(kernel, 0, cut, device)] if cut else []
    seen.append(_round(kernel, cut, len(kernel.samples_us), device))
    end = {**end, "kernel": seen[-1], "rounds": seen, "witness": check}
    return None, end


def channel_problem(witnessed, device: str) -> str | None:
    """Why the candidate's witness channel cannot be read as the timing loop's, or None."""
    from harness.timing.measurement import NULL_REPS
    from harness.timing.witness import baseline_line
    forged = baseline_line(witnessed)
    if forged:
        # baselines are timed in a clean worker: a baseline line from the candidate's process is forged
        return forged
    if witnessed.problem:
        # lines the timing loop never sends: written by someone else into the worker's descriptor
        return f"the witness socket carried what the timing loop does not send: {witnessed.problem}"
    null = witnessed.reps("null")
    planned = NULL_REPS.get(device, 20)
    if null is not None and len(null.samples_us) != planned:
        # the null call is calibrated before the import, rep by planned rep: more is a forgery that
        # would make the judge's overhead look larger and the candidate's bound looser
        return (f"the witness socket carried {len(null.samples_us)} null-call reps where the judge planned "
                f"{planned}: lines the timing loop does not send")
    return None


def _round(kernel, first: int, stop: int, device: str) -> dict:
    """One round's figures from the reps the judge witnessed, with the share of it during which some
    task on the machine waited for a CPU (cpu_wait_pct, where the kernel keeps that figure)."""
    from harness.timing.timer import summary
    figures = summary(kernel.samples_us[first:stop], device).to_json()
    wait = kernel.cpu_wait(first, stop)
    return figures if wait is None else {**figures, "cpu_wait_pct": round(100 * wait, 1)}


def busy_note(last: dict) -> str:
    """The machine's part in an untrusted round: said where the judge measured it oversubscribed."""
    wait = last.get("cpu_wait_pct")
    if wait is None or wait < 100 * spread.BUSY_SHARE:
        return ""
    return (f"; the machine was oversubscribed: some task waited for a CPU {wait:.0f}% of the round "
            "(/proc/pressure/cpu): time on a machine with a core free for each judge")


def spread_verdict(rounds: list[dict], device: str) -> dict:
    """{"spread_ok", "spread_note"}: may the search rest a decision on the last round's median?"""
    limit = 100 * spread.SPREAD_LIMIT.get(device, 0.5)
    pct = [100 * spread.ratio(r["median_us"], r["iqr_us"]) for r in rounds]
    untrusted = _untrusted(rounds, device, pct, limit)
    if untrusted:
        return {"spread_ok": False, "spread_note": untrusted + busy_note(rounds[-1])}
    again = f"; measured again after a first round at {pct[0]:.0f}%" if len(rounds) == 2 else ""
    return {"spread_ok": True, "spread_note": f"the reps' IQR is {pct[-1]:.0f}% of the median (limit {limit:.0f}%)"
                                              + again}


def _untrusted(rounds: list[dict], device: str, pct: list[float], limit: float) -> str | None:
    """Why the last round's median means nothing, or None."""
    last = rounds[-1]
    if len(rounds) == 1 and spread.too_wide(last["median_us"], last["iqr_us"], device):
        return (f"the reps' IQR is {pct[0]:.0f}% of the median (limit {limit:.0f}%) "
                "and the timing was not measured again: the median means nothing")
    if spread.too_wide(last["median_us"], last["iqr_us"], device):
        return (f"measured twice and both times too wide: the reps' IQR was {pct[0]:.0f}% then {pct[1]:.0f}% "
                f"of the median (limit {limit:.0f}%): the median means nothing, do not keep on it")
    if len(rounds) == 2 and max(rounds[0]["median_us"], last["median_us"]) > 2 * min(rounds[0]["median_us"],
                                                                                  last["median_us"]):
        return (f"measured twice, the medians disagree by more than 2x "
                f"({rounds[0]['median_us']:.4g} then {last['median_us']:.4g} us)")
    return None


def second_look_problem(case: Case, end: dict, device: str) -> tuple[str | None, dict | None]:
    """KernelBench's flag: a speedup over eager above spread.EXCESSIVE_SPEEDUP is re-timed and the
    re-timed median held to the physical floor with spread.SECOND_LOOK_FLOOR_MARGIN. (why it fails,
    the record)."""
    from harness.device.roofline import physical_floor_us
    rounds, eager = end["rounds"], (end.get("eager") or {}).get("median_us")
    first = rounds[0]["median_us"]
    if not eager or first <= 0 or eager / first <= spread.EXCESSIVE_SPEEDUP:
        return None, None
    if len(rounds) < 2:
        return (f"{eager / first:.3g}x faster than PyTorch eager and not re-timed: an excessive speedup gets a "
                "second look"), None
    final = rounds[-1]["median_us"]
    floor = physical_floor_us(case, device)
    record = {"reason": f"{eager / first:.3g}x faster than eager (above {spread.EXCESSIVE_SPEEDUP:g}x)",
              "first_median_us": first, "median_us": final, "speedup_vs_eager": eager / final if final > 0 else None,
              "floor_us": floor["floor_us"] if floor else None}
    if floor and final < floor["floor_us"] * spread.SECOND_LOOK_FLOOR_MARGIN:
        # an excessive speedup that also beats the hardware's measured peaks: the time is not real
        return (f"excessive speedup ({eager / final:.3g}x eager) re-timed at {final:.3g} us, below the physical floor "
                f"of {floor['floor_us']:.3g} us for {case.label()} at the measured peaks"), record
    return None, record
