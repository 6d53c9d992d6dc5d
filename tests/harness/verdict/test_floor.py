"""The parent's assessment of a worker's record, on synthetic records: the physical floor (a time
faster than the hardware allows) and the identity records of the clocks. No worker runs: the record
is what an honest worker would write, with the time or the identity records changed."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from harness.correctness import as_passed
from harness.kernel_types import registry
from harness.device import roofline
from harness.correctness.cases import STAGES, Capabilities, build_plan
from harness.timing.fresh_inputs import fresh_args
from harness.timing.measurement import budget
from harness.timing.timed_outputs import keyed_checksum
from harness.verdict.timing_checks import expected_reps
from harness.verdict import memory_checks
from harness.verdict.verdict_checks import assess

KEY = 12345  # the timing's revealed key: every output of a CPU timing shape is saved, checksummed with it
PEAKS = {"device": "test cpu", "copy_gbps": 20.0, "matmul_tflops": {"float32": 0.5, "float16": 0.2}}


class _Record:
    """Writes events and tensors the way harness.workers.worker does, with reference outputs as answers."""

    def __init__(self, out_dir: Path):
        self.dir, self.events, self.n = out_dir, [], 0
        (out_dir / "tensors").mkdir(parents=True)

    def save(self, t: torch.Tensor) -> str:
        self.n += 1
        torch.save(t.clone(), self.dir / "tensors" / f"t{self.n:04d}.pt")
        return f"t{self.n:04d}.pt"

    def case(self, stage: str, case, role: str = "check", digests=None, **extra) -> None:
        out = registry.reference_output(case).to(case.torch_dtype)
        # the whole of every input buffer as the judge built it, nothing stored past an allocation
        digests = digests or memory_checks.expected(case, registry.build_inputs(case, "cpu")[0])
        obs = {"launches": 1, "forbidden": [], "device_to_host": 0, "mutated": [], "aliased": False,
               "plain": True, "device": "cpu", "writes": [], "digests": digests, "strays": []}
        self.events.append({"event": "case", "stage": stage, "role": role, "case": case.to_json(),
                            "output": self.save(out), "error": None, "obs": obs,
                            "passed_as": as_passed.mode_for(case.seed), **extra})

    def timed(self, stage: str, case, reps: int, warmup: int) -> None:
        """Every timed call's record, as harness/timing/timed_calls.py writes them: right for its fresh values."""
        kt = registry.get(case.kernel_type)
        obs = {"launches": 1, "forbidden": [], "device_to_host": 0, "mutated": [], "aliased": False,
               "plain": True, "device": "cpu"}
        for rep in expected_reps(warmup, reps):
            args, kwargs = fresh_args(case, rep, "cpu")
            out = kt.reference(*args, **kwargs).to(case.torch_dtype)
            self.events.append({"event": "case", "stage": stage, "role": "timed", "rep": rep, "case": case.to_json(),
                                "output": self.save(out), "error": None, "obs": obs,
                                "checksum": keyed_checksum(out, KEY), "device_check": {"ok": True, "worst_ratio": 0.0}})

    def stage(self, name: str, cases, repeat: int = 1) -> None:
        self.events.append({"event": "stage_start", "stage": name})
        for case in cases:
            for _ in range(repeat):  # the determinism stage's repeats, as the worker records them
                self.case(name, case, "repeat" if name == "determinism" else "check")
        self.events.append({"event": "stage_end", "stage": name, "status": "pass", "detail": "ok"})


def honest_record(out_dir: Path, median_us: float, identity: tuple[str, ...] = ("after import", "after timing")):
    plan = build_plan("softmax", Capabilities("cpu", False), None)
    rec = _Record(out_dir)
    rec.events.append({"event": "stage_start", "stage": "compile"})
    rec.events.append({"event": "stage_end", "stage": "compile", "status": "pass", "detail": "ok"})
    for stage in STAGES[1:]:
        if stage == "integrity":
            first, second = plan.stages["integrity"]
            rec.events.append({"event": "stage_start", "stage": "integrity"})
            inputs = [rec.save(t) for t in registry.build_inputs(first, "cpu")[0]]
            rec.case("integrity", first, "replay_first", inputs_after=inputs)
            rec.case("integrity", second, "replay_second", earlier_output_changed=False,
                     digests=memory_checks.refilled(first, second))
            rec.events.append({"event": "stage_end", "stage": "integrity", "status": "pass", "detail": "ok"})
        else:
            rec.stage(stage, plan.stages[stage], repeat=3 if stage == "determinism" else 1)
    timing = lambda us: {"median_us": us, "iqr_us": 0.0, "reps": 3, "samples_us": [us] * 3,  # noqa: E731
                         "method": "cpu wall clock", "representative_of_gpu": False}
    rec.events.append({"event": "stage_start", "stage": "timing"})
    rec.timed("timing", plan.timing, reps=3, warmup=budget("cpu")["warmup"])
    rec.events.append({"event": "stage_end", "stage": "timing", "status": "pass", "detail": "timed",
                       "case": plan.timing.to_json(), "kernel": timing(median_us), "eager": timing(1000.0),
                       "compiled": None, "noise_salt": 0, "output_key": KEY, "held_outputs": {}})
    rec.events += [{"event": "identity", "where": w, "replaced": []} for w in identity]
    rec.events.append({"event": "done"})
    return rec.events, plan


@pytest.fixture
def fixed_peaks(monkeypatch):
    monkeypatch.setattr(roofline, "_peaks", lambda device: PEAKS)


def _floor_us(case) -> float:
    return roofline.physical_floor_us(case, "cpu", PEAKS)["floor_us"]


def test_an_honest_time_passes_and_a_faked_one_is_faster_than_the_hardware(tmp_path, fixed_peaks):
    plan = build_plan("softmax", Capabilities("cpu", False), None)
    floor = _floor_us(plan.timing)
    assert floor > 0
    events, plan = honest_record(tmp_path / "honest", median_us=floor * 50)
    a = assess(events, tmp_path / "honest", plan, "cpu")
    assert (a.verdict, a.failed_stage) == ("PASS", None), a.stages
    assert a.timing["median_us"] == floor * 50 and a.stages["integrity"]["status"] == "pass"
    events, plan = honest_record(tmp_path / "faked", median_us=floor * 0.01)
    a = assess(events, tmp_path / "faked", plan, "cpu")
    assert (a.verdict, a.failed_stage) == ("FAIL", "integrity")
    assert "faster than the hardware allows" in a.stages["integrity"]["detail"] and a.timing is None


def test_the_floor_keeps_a_margin_below_the_measured_peaks(fixed_peaks):
    case = build_plan("softmax", Capabilities("cpu", False), None).timing
    floor = roofline.physical_floor_us(case, "cpu", PEAKS)
    assert floor["limit_us"] == pytest.approx(floor["floor_us"] * roofline.FLOOR_MARGIN["cpu"])
    # a kernel at the measured copy peak itself, or even twice it on a GPU, is not refused
    assert roofline.below_floor(case, floor["floor_us"], "cpu", PEAKS) is None
    assert roofline.below_floor(case, floor["floor_us"] * 0.6, "cuda", PEAKS) is None
    assert roofline.below_floor(case, floor["floor_us"] * 0.4, "cuda", PEAKS) is not None
    assert roofline.physical_floor_us(case, "cpu", {}) is None  # no peaks measured: no floor, no refusal


def test_a_replaced_clock_recorded_by_the_worker_fails_integrity(tmp_path, fixed_peaks):
    plan = build_plan("softmax", Capabilities("cpu", False), None)
    events, plan = honest_record(tmp_path, median_us=_floor_us(plan.timing) * 50)
    events.insert(-1, {"event": "identity", "where": "after timing", "replaced": ["time.perf_counter"]})
    a = assess(events, tmp_path, plan, "cpu")
    assert (a.verdict, a.failed_stage) == ("FAIL", "integrity")
    assert a.stages["integrity"]["detail"].startswith("time.perf_counter was replaced by the candidate (seen after timing)")


@pytest.mark.parametrize("missing", ["after import", "after timing"])
def test_a_missing_identity_record_fails_integrity(tmp_path, fixed_peaks, missing):
    plan = build_plan("softmax", Capabilities("cpu", False), None)
    kept = tuple(w for w in ("after import", "after timing") if w != missing)
    events, plan = honest_record(tmp_path, median_us=_floor_us(plan.timing) * 50, identity=kept)
    a = assess(events, tmp_path, plan, "cpu")
    assert (a.verdict, a.failed_stage) == ("FAIL", "integrity")
    assert f"did not confirm its clocks and checks {missing}" in a.stages["integrity"]["detail"]
