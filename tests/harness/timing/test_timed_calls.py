"""Timed calls are watched like checked ones, on values no call has seen; the parent's rules for
the spread of the reps and for an excessive speedup. No worker process: the worker's own code
(harness/timing/timed_calls.py, harness/timing/measurement.py) run in this process on a plain Python kernel_fn."""
from __future__ import annotations

import pytest
import torch

from harness.timing import measurement
from harness.device import roofline
from harness.verdict import timing_checks
from harness.correctness.candidate import observed_call
from harness.timing.fresh_inputs import FreshInputs, fresh_args
from harness.correctness import as_passed, guards, launches
from harness.timing.timed_outputs import keyed_checksum
from harness.kernel_types.registry import Case, build_inputs
from harness.verdict.verdict_checks import _Checker
from harness.workers.worker import Log

CASE = Case.make("softmax", {"M": 4, "N": 64}, "float32", seed=5)
TINY = dict(budget_ms=0.0, warmup=1, min_reps=3, max_reps=3)


def _end(*rounds: int, key: int = 0, held: dict | None = None) -> dict:
    """A timing's final record as the worker writes it: its rounds and the secrets it reveals."""
    return {"rounds": [{"reps": n} for n in rounds], "noise_salt": 0, "output_key": key, "held_outputs": held or {}}


def test_a_kernel_sees_the_same_dispatch_stack_grad_mode_and_shapes_when_checked_and_when_timed(tmp_path):
    seen = []

    def kernel_fn(x):
        seen.append((torch._C._len_torch_dispatch_stack(), torch.is_grad_enabled(),
                     torch.is_inference_mode_enabled(), x.requires_grad, tuple(x.shape), x.dtype))
        return x.clone()

    monitor = launches.install()
    checked = set()
    for mode in as_passed.MODES:  # checked calls are made in each mode a model runs in
        args, kwargs = build_inputs(CASE, "cpu")
        placed = guards.place(args, CASE.seed, ["x"], as_passed.inference_positions("softmax", ("x",), mode))
        observed_call(kernel_fn, as_passed.wrap(placed.args, "softmax", ("x",), mode), kwargs, monitor, placed, mode)
        checked.add(seen.pop())
    run = measurement.time_kernel(kernel_fn, CASE, "cpu", None, monitor, Log(tmp_path), "timing",
                                  limits=TINY, second_look=False)
    assert run.final.reps == 3 and len(seen) == 4  # the warm-up and three reps, each watched
    # every timed call looks like the checked calls made under torch.no_grad, as served inference runs
    assert len(set(seen)) == 1 and set(seen) <= checked, (checked, seen)


def test_every_timed_call_is_recorded_with_its_observations(tmp_path):
    def kernel_fn(x):
        return torch.softmax(x, -1)  # PyTorch compute: recorded on every timed call

    monitor = launches.install()
    log = Log(tmp_path)
    measurement.time_kernel(kernel_fn, CASE, "cpu", None, monitor, log, "timing", limits=TINY, second_look=False)
    log._f.flush()
    import json
    recs = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    timed = [r for r in recs if r.get("role") == "timed"]
    assert [r["rep"] for r in timed] == [-1, 0, 1, 2]
    assert all("aten::_softmax" in r["obs"]["forbidden"] and r["output"] for r in timed)
    problem = timing_checks.timed_calls_problem(timed, CASE, TINY, _end(3), _Checker(tmp_path, None, "cpu"))
    assert "warm-up call 1 at softmax[4x64:float32]: PyTorch compute inside kernel_fn: aten::_softmax" in problem
    assert "recorded no output for 1 timed call(s) (reps [2])" in \
        timing_checks.timed_calls_problem(timed[:-1], CASE, TINY, _end(3), _Checker(tmp_path, None, "cpu"))


def test_every_rep_gets_values_no_call_has_seen_and_the_judge_rebuilds_them():
    inputs = FreshInputs(CASE, "cpu")
    base = build_inputs(CASE, "cpu")[0][0]
    values = []
    for rep in (-2, -1, 0, 1, 2, 3):
        inputs.refill(rep)
        values.append(inputs.args[0].clone())
        assert torch.equal(values[-1], fresh_args(CASE, rep, "cpu")[0][0])  # bitwise: the judge's own copy
    for i, v in enumerate(values):
        assert not torch.equal(v, base)
        assert not any(torch.equal(v, w) for w in values[i + 1:])


def _round(median_us: float, iqr_us: float, reps: int = 5) -> dict:
    return {"median_us": median_us, "iqr_us": iqr_us, "reps": reps}


def test_a_spread_too_wide_twice_is_not_trusted_and_a_wide_first_round_may_be_redeemed():
    assert timing_checks.spread_verdict([_round(100.0, 10.0)], "cpu")["spread_ok"] is True
    once = timing_checks.spread_verdict([_round(100.0, 90.0)], "cpu")
    assert once["spread_ok"] is False and "not measured again" in once["spread_note"]
    twice = timing_checks.spread_verdict([_round(100.0, 90.0), _round(100.0, 80.0)], "cpu")
    assert twice["spread_ok"] is False and "measured twice" in twice["spread_note"]
    redeemed = timing_checks.spread_verdict([_round(100.0, 90.0), _round(100.0, 5.0)], "cpu")
    assert redeemed["spread_ok"] is True and "measured again" in redeemed["spread_note"]
    apart = timing_checks.spread_verdict([_round(100.0, 90.0), _round(300.0, 5.0)], "cpu")
    assert apart["spread_ok"] is False and "disagree" in apart["spread_note"]


def test_an_untrusted_spread_says_so_when_the_judge_measured_the_machine_oversubscribed():
    busy, calm = {**_round(100.0, 80.0), "cpu_wait_pct": 97.0}, {**_round(100.0, 80.0), "cpu_wait_pct": 12.0}
    wide = timing_checks.spread_verdict([_round(100.0, 90.0), busy], "cpu")
    assert wide["spread_ok"] is False and "oversubscribed" in wide["spread_note"] and "97%" in wide["spread_note"]
    assert "oversubscribed" not in timing_checks.spread_verdict([_round(100.0, 90.0), calm], "cpu")["spread_note"]
    assert "oversubscribed" not in timing_checks.spread_verdict([_round(100.0, 90.0), _round(100.0, 80.0)],
                                                                "cpu")["spread_note"]  # not measured: not said
    trusted = timing_checks.spread_verdict([{**_round(100.0, 10.0), "cpu_wait_pct": 97.0}], "cpu")
    assert trusted["spread_ok"] is True and "oversubscribed" not in trusted["spread_note"]


def test_an_excessive_speedup_is_retimed_and_held_to_the_floor_with_a_tight_margin(monkeypatch):
    monkeypatch.setattr(roofline, "_peaks", lambda device: {"copy_gbps": 20.0, "matmul_tflops": {"float32": 0.5}})
    floor_us = roofline.physical_floor_us(CASE, "cpu")["floor_us"]
    eager = {"median_us": 1000 * floor_us}
    modest = {"eager": eager, "rounds": [_round(200 * floor_us, 0.0)]}
    assert timing_checks.second_look_problem(CASE, modest, "cpu") == (None, None)
    once = {"eager": eager, "rounds": [_round(2 * floor_us, 0.0)]}
    assert "not re-timed" in timing_checks.second_look_problem(CASE, once, "cpu")[0]
    real = {"eager": eager, "rounds": [_round(2 * floor_us, 0.0), _round(2 * floor_us, 0.0)]}
    problem, record = timing_checks.second_look_problem(CASE, real, "cpu")
    assert problem is None and record["floor_us"] == pytest.approx(floor_us)
    # 0.5x the floor passes the usual 0.1x CPU margin, never the second look's
    fake = {"eager": eager, "rounds": [_round(2 * floor_us, 0.0), _round(0.5 * floor_us, 0.0)]}
    assert roofline.below_floor(CASE, 0.5 * floor_us, "cpu") is None
    assert "below the physical floor" in timing_checks.second_look_problem(CASE, fake, "cpu")[0]


def test_the_judge_checks_every_timed_rep_where_cheap_and_more_than_half_elsewhere():
    reps = timing_checks.expected_reps(1, 6)
    assert timing_checks.chosen_reps(reps, 1000) == reps
    chosen = timing_checks.chosen_reps(reps, 10**6)
    assert len(chosen) == 4 and chosen[0] == -1 and chosen[-1] == 5 and set(chosen) <= set(reps)
    many = timing_checks.expected_reps(5, 500)
    chosen = timing_checks.chosen_reps(many, 10**6)
    assert len(chosen) == timing_checks.MAX_CHECKED and len(set(chosen)) == len(chosen)


@pytest.mark.parametrize("wrong_rep", [-1, 0, 2])
def test_a_timed_call_wrong_at_any_rep_but_the_last_is_caught(tmp_path, wrong_rep):
    from harness.kernel_types import registry
    (tmp_path / "tensors").mkdir()
    kt, recs = registry.get("softmax"), []
    obs = {"launches": 1, "forbidden": [], "device_to_host": 0, "mutated": [], "aliased": False, "plain": True,
           "device": "cpu"}
    outputs = {}
    for rep in timing_checks.expected_reps(1, 4):
        args, kwargs = fresh_args(CASE, rep, "cpu")
        outputs[rep] = kt.eager(*args) if rep != wrong_rep else torch.full((4, 64), 1 / 64)  # right only when checked
        torch.save(outputs[rep], tmp_path / "tensors" / f"r{rep}.pt")
        # a worker whose device comparison says every rep passed: the judge compares the saved outputs itself
        recs.append({"role": "timed", "rep": rep, "case": CASE.to_json(), "output": f"r{rep}.pt", "error": None,
                     "obs": obs, "checksum": keyed_checksum(outputs[rep], 0), "device_check": {"ok": True}})
    limits = {**TINY, "max_reps": 4}
    problem = timing_checks.timed_calls_problem(recs, CASE, limits, _end(4), _Checker(tmp_path, None, "cpu"))
    name = timing_checks.rep_name(wrong_rep)
    assert problem is not None and problem.startswith(f"a timed call gave a wrong result ({name})"), problem
    # another rep's answer, remembered: wrong for this rep's fresh values
    remembered = [r if r["rep"] != wrong_rep else
                  {**r, "output": f"r{wrong_rep + 1}.pt", "checksum": keyed_checksum(outputs[wrong_rep + 1], 0)}
                  for r in recs]
    assert "wrong result" in timing_checks.timed_calls_problem(remembered, CASE, limits, _end(4),
                                                               _Checker(tmp_path, None, "cpu"))


def test_a_timed_call_watcher_or_refill_replaced_by_a_candidate_is_named(monkeypatch):
    from harness.timing import fresh_inputs, timed_calls
    from harness.isolation.tamper import IdentityGuard
    guard = IdentityGuard()
    monkeypatch.setattr(timed_calls.TimedCalls, "call", lambda self: None)  # a timed call without the recorder
    monkeypatch.setattr(fresh_inputs, "perturbed", lambda base, *a: base)  # the same values every rep
    assert {"harness.timing.timed_calls.TimedCalls.call", "harness.timing.fresh_inputs.perturbed"} <= set(guard.replaced())


def test_the_parents_checks_of_a_cpu_judgement_run_on_one_thread_and_restore_it(tmp_path, monkeypatch):
    import judge_kernels
    from harness import judge as judging
    from harness.kernel_types.references import one_thread
    during = []
    assess = judging.assess

    def watched_assess(*args, **kwargs):  # the parent's checks of the worker's records, as judge() runs them
        during.append(torch.get_num_threads())
        return assess(*args, **kwargs)

    monkeypatch.setattr(judging, "assess", watched_assess)
    wrong = tmp_path / "wrong.py"
    wrong.write_text(judge_kernels.source(body="    y = x"))  # fails smoke: a short judgement
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        v = judging.judge(wrong, device="cpu", timeout_s=120)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", "smoke"), v["stages"]
    assert during == [1] and after == 2
    with one_thread("cpu"):
        with one_thread("cpu"):  # judgements that overlap
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with one_thread("cuda"):
        assert torch.get_num_threads() == before


# Rounds the judge recorded (median, IQR, reps, the share of the round some task waited for a CPU):
# honest kernels judged with the machine oversubscribed (load average about 8 on two cores), and the
# wild_spread attack's two rounds (spread.py's docstring). The rule must trust the first whatever
# the load, and never the last.
RECORDED_HONEST_ON_A_LOADED_MACHINE = [
    [{"median_us": 120603.97, "iqr_us": 8422.085, "reps": 5, "cpu_wait_pct": 99.7}],  # tests/data/kernels/good/softmax_rows.py
    [{"median_us": 61586.2785, "iqr_us": 5934.237, "reps": 6, "cpu_wait_pct": 99.9}],  # the softmax starter
    [{"median_us": 106643.896, "iqr_us": 28730.079, "reps": 5, "cpu_wait_pct": 97.8}],  # the starter, bench
]
RECORDED_WILD = [{"median_us": 1000.0, "iqr_us": 9470.0, "reps": 5, "cpu_wait_pct": 99.0},
                 {"median_us": 1000.0, "iqr_us": 940.0, "reps": 5, "cpu_wait_pct": 99.0}]


@pytest.mark.parametrize("rounds", RECORDED_HONEST_ON_A_LOADED_MACHINE)
def test_recorded_honest_rounds_on_a_loaded_machine_are_trusted(rounds):
    verdict = timing_checks.spread_verdict(rounds, "cpu")
    assert verdict["spread_ok"] is True and "oversubscribed" not in verdict["spread_note"], verdict


def test_recorded_wild_rounds_are_never_trusted_and_the_busy_machine_is_named():
    verdict = timing_checks.spread_verdict(RECORDED_WILD, "cpu")
    assert verdict["spread_ok"] is False and "measured twice" in verdict["spread_note"]
    assert "oversubscribed" in verdict["spread_note"]
