"""Timed outputs that never leave the device: each compared there, checksummed there, and only the
key's sample saved (harness/timing/timed_calls.py, device_check.py, timed_outputs.py), and the judging
process's reading of them (harness/verdict/timing_checks.py). The worker's timing code runs in this
process on a Triton softmax (the interpreter), with a save budget small enough that only a sample
of the outputs is saved, as at a large target on a GPU."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch

import judge_kernels
from harness.correctness import launches
from harness.kernel_types.registry import Case
from harness.timing import device_check, measurement, timed_outputs
from harness.timing.fresh_inputs import fresh_args
from harness.verdict import timing_checks
from harness.verdict.verdict_checks import _Checker
from harness.workers.worker import Log

CASE = Case.make("softmax", {"M": 4, "N": 64}, "float32", seed=5)  # an output of 1 KiB
LIMITS = dict(budget_ms=0.0, warmup=1, min_reps=8, max_reps=8)
KEY = 271828


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture
def sampled(monkeypatch):
    """Room for six outputs of CASE: not every call's (17 at most), so the first, the last and three drawn."""
    monkeypatch.setattr(timed_outputs, "SAVE_BYTES", {"cpu": 6 * 1024, "cuda": 6 * 1024})
    policy = timed_outputs.save_policy(CASE, fresh_args(CASE, 0, "cpu")[0], {}, "cpu", LIMITS)
    assert (policy.every, policy.sample) == (False, 3)
    return policy


def _kernel(tmp_path, wrong_call: int | None = None):
    """A Triton softmax, its output off by 0.5 on call `wrong_call` (counting from 1) and right on every other."""
    shift = "0.0" if wrong_call is None else f"(0.5 if _calls[0] == {wrong_call} else 0.0)"
    text = judge_kernels.source(body=judge_kernels.BODY + "\n    y = y + jitter", prelude=judge_kernels.COUNTER,
                                wrapper=judge_kernels.COUNT + judge_kernels.WRAPPER.replace(", 0.0,\n", f", {shift},\n"))
    path = tmp_path / f"softmax_{wrong_call}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel_fn


def _timed(tmp_path, kernel_fn, key: int = KEY, device: str = "cpu") -> tuple[dict[int, dict], dict]:
    """Time kernel_fn as the worker does; its timed records by rep and its final record."""
    monitor, log = launches.install(), Log(tmp_path)
    run = measurement.time_kernel(kernel_fn, CASE, device, None, monitor, log, "timing", limits=LIMITS,
                                  second_look=False, key=key)
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    timed = {e["rep"]: e for e in events if e.get("role") == "timed"}
    end = {"rounds": [r.to_json() for r in run.rounds], "noise_salt": 0, "output_key": key,
           "held_outputs": {str(rep): name for rep, name in run.held_outputs.items()}}
    return timed, end


def _problem(tmp_path, timed: dict[int, dict], end: dict, device: str = "cpu") -> str | None:
    return timing_checks.timed_calls_problem(list(timed.values()), CASE, LIMITS, end, _Checker(tmp_path, None, device))


def _saved(timed: dict[int, dict], end: dict) -> set[int]:
    return {rep for rep, r in timed.items() if r["output"]} | {int(rep) for rep in end["held_outputs"]}


@pytest.mark.parametrize("device", DEVICES)
def test_an_honest_kernel_passes_with_only_the_keys_sample_saved(tmp_path, sampled, device):
    timed, end = _timed(tmp_path, _kernel(tmp_path), device=device)
    assert _problem(tmp_path, timed, end, device) is None
    chosen = timed_outputs.saved_reps(sampled, KEY, 1, [8])
    assert _saved(timed, end) == set(chosen) and len(chosen) < len(timed) == 9
    assert len(list((tmp_path / "tensors").iterdir())) == len(chosen)  # nothing else left the device
    assert all(r["device_check"]["ok"] and r["device_check"]["worst_ratio"] < 1 for r in timed.values())


def test_an_honest_kernel_passes_with_every_output_saved_where_all_fit(tmp_path):
    timed, end = _timed(tmp_path, _kernel(tmp_path))
    assert _problem(tmp_path, timed, end) is None
    assert all(r["output"] for r in timed.values()) and not end["held_outputs"]


@pytest.mark.parametrize("device", DEVICES)
def test_a_kernel_wrong_on_one_unsaved_rep_is_caught_by_the_device_comparison(tmp_path, sampled, device):
    chosen = timed_outputs.saved_reps(sampled, KEY, 1, [8])
    wrong = next(rep for rep in range(8) if rep not in chosen)
    timed, end = _timed(tmp_path, _kernel(tmp_path, wrong_call=wrong + 2), device=device)  # the warm-up is call 1
    assert wrong not in _saved(timed, end) and not timed[wrong]["device_check"]["ok"]
    problem = _problem(tmp_path, timed, end, device)
    assert problem.startswith(f"a timed call gave a wrong result ({timing_checks.rep_name(wrong)}), compared on "
                              f"the device (float64 on {device})"), problem
    # the saved sample alone would not have seen it: only the device comparison did
    unchecked = {rep: {**r, "device_check": {"ok": True}} for rep, r in timed.items()}
    assert _problem(tmp_path, unchecked, end, device) is None


def _drawn_key(policy) -> tuple[int, int]:
    """A key whose sample holds a rep on the device until the end (neither the first nor a last)."""
    for key in range(KEY, KEY + 50):
        held = [rep for rep in timed_outputs.saved_reps(policy, key, 1, [8]) if rep not in (-1, 7)]
        if held:
            return key, held[0]
    raise AssertionError("no key in 50 drew a middle rep")


def test_a_held_output_swapped_after_its_rep_fails_its_checksum(tmp_path, sampled, monkeypatch):
    key, rep = _drawn_key(sampled)
    close = timed_outputs.SavedOutputs.close

    def swapped(keeper):  # a right answer written over the held copy: not what the device comparison saw
        for slot in keeper._slots:
            if slot[0] == rep:
                args, _ = fresh_args(CASE, rep, "cpu")
                slot[1].copy_(torch.softmax(args[0].double(), -1).float())
        return close(keeper)
    monkeypatch.setattr(timed_outputs.SavedOutputs, "close", swapped)
    timed, end = _timed(tmp_path, _kernel(tmp_path), key=key)
    assert str(rep) in end["held_outputs"]
    problem = _problem(tmp_path, timed, end)
    assert problem == (f"the saved output of {timing_checks.rep_name(rep)} differs from the one checksummed on the "
                       "device as its rep was recorded: replaced after the rep"), problem
    # right for its inputs, so the comparison alone passes it: only the checksum sees the swap
    from harness.verdict.records import load_output
    told = {r: {**t, "checksum": timed_outputs.keyed_checksum(load_output(tmp_path, end["held_outputs"][str(r)]), key)}
            if str(r) in end["held_outputs"] else t for r, t in timed.items()}
    assert _problem(tmp_path, told, end) is None


def test_a_saved_set_that_is_not_the_keys_choice_fails(tmp_path, sampled):
    timed, end = _timed(tmp_path, _kernel(tmp_path))
    chosen = timed_outputs.saved_reps(sampled, KEY, 1, [8])
    first_saved = next(rep for rep in chosen if timed[rep]["output"])
    dropped = {**timed, first_saved: {**timed[first_saved], "output": None}}
    assert "are not the ones the judge's key chose" in _problem(tmp_path, dropped, end)
    # an unchosen rep's output saved besides the sample (a rep kept because it came out right)
    extra_rep = next(rep for rep in range(8) if rep not in chosen)
    log = Log(tmp_path)
    log._n = 100
    out = torch.softmax(fresh_args(CASE, extra_rep, "cpu")[0][0], -1)
    added = {**timed, extra_rep: {**timed[extra_rep], "output": log.save(out),
                                  "checksum": timed_outputs.keyed_checksum(out, KEY)}}
    assert "are not the ones the judge's key chose" in _problem(tmp_path, added, end)
    other_keys = [k for k in range(KEY + 1, KEY + 20) if timed_outputs.saved_reps(sampled, k, 1, [8]) != chosen]
    assert "are not the ones the judge's key chose" in _problem(tmp_path, timed, {**end, "output_key": other_keys[0]})
    assert "did not reveal the key" in _problem(tmp_path, timed, {**end, "output_key": None})


def test_a_device_comparison_skipped_passes_only_where_the_judge_agrees_it_is_unaffordable(tmp_path, sampled,
                                                                                        monkeypatch):
    monkeypatch.setattr(device_check, "CHECK_FLOPS", {**device_check.CHECK_FLOPS, "cpu": 1.0})
    timed, end = _timed(tmp_path, _kernel(tmp_path))
    assert all("above the 1 a device check may spend" in r["device_check"]["skipped"] for r in timed.values())
    assert _problem(tmp_path, timed, end) is None
    monkeypatch.undo()
    monkeypatch.setattr(timed_outputs, "SAVE_BYTES", {"cpu": 6 * 1024, "cuda": 6 * 1024})
    assert "skipped comparing the output of warm-up call 1 on the device" in _problem(tmp_path, timed, end)
    missing = {rep: {k: v for k, v in r.items() if k != "device_check"} for rep, r in timed.items()}
    assert "did not compare the output of warm-up call 1 on the device" in _problem(tmp_path, missing, end)
