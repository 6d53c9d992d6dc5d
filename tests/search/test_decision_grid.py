"""decide() keeps a CPU-timed candidate for speed only where its grid would fill the target GPU
(harness/verdict/grid_fill.py): the interpreter's times reward fewer, bigger programs."""
from __future__ import annotations

from autokernel.search import decision
from autokernel.search.run import TargetState
from harness.kernel_types.registry import Case
from harness.verdict import grid_fill


def _target(**kw) -> TargetState:
    return TargetState(name="softmax[16x256:float32]", kernel_type="softmax", dims={"M": 16, "N": 256},
                       dtype="float32", **kw)


def _cpu(median_us: float, programs: int) -> dict:
    case = Case.make("softmax", {"M": 16, "N": 256}, "float32")
    grid = grid_fill.assess(case, {"kernel": "_rows", "programs": programs, "launches": 5}, "sm_90")
    return {"verdict": "PASS", "timing": {"median_us": median_us, "iqr_us": 0.0, "reps": 25,
                                          "representative_of_gpu": False, "grid": grid}}


def test_a_cpu_time_won_by_a_grid_the_gpu_would_leave_idle_is_not_kept():
    assert decision.decide(_cpu(10.0, programs=1), _target(best_median_us=1000.0, best_iqr_us=0.0, best_reps=25)) == "REVERT"
    assert decision.decide(_cpu(10.0, programs=1), _target()) == "REVERT"  # not even with nothing to beat
    assert decision.decide(_cpu(10.0, programs=16), _target(best_median_us=1000.0, best_iqr_us=0.0, best_reps=25)) == "KEEP"


def _trained(forward: dict) -> dict:
    """A CPU verdict whose backward passed too, as the judge gives it for a training target."""
    step = {"median_us": 30.0, "iqr_us": 0.0, "reps": 5, "eager_median_us": 60.0, "speedup_vs_eager": 2.0}
    back = {"verdict": "PASS", "timing": {"forward_backward": step, "representative_of_gpu": False}}
    return {**forward, "backward": back}


def test_in_training_too_a_forward_grid_the_gpu_would_leave_idle_chooses_nothing():
    # a training run ranks a kernel by forward+backward; the forward's grid rule still holds
    idle, busy = (decision.ranked(_trained(_cpu(10.0, programs=n))) for n in (1, 16))
    assert idle["timing"]["median_us"] == 30.0 and idle["timing"]["grid"]["fills_target"] is False
    assert decision.decide(idle, _target()) == "REVERT"
    assert decision.decide(busy, _target()) == "KEEP"


def test_a_timing_without_a_grid_or_from_a_gpu_keeps_the_usual_rule():
    # a KernelBench module's CPU timing carries no grid (a ModelNew launches what it likes)
    bare = {"verdict": "PASS", "timing": {"median_us": 10.0, "iqr_us": 0.0, "reps": 25, "representative_of_gpu": False}}
    assert decision.decide(bare, _target()) == "KEEP"
    gpu = {"verdict": "PASS", "timing": {"median_us": 10.0, "iqr_us": 0.0, "reps": 25, "representative_of_gpu": True,
                                         "grid": {"fills_target": False}}}
    assert decision.decide(gpu, _target()) == "KEEP"  # a GPU's own time says what the grid did


def test_units_of_work_per_type_and_the_rule_in_words():
    assert grid_fill.units("softmax", {"M": 16, "N": 4096}) == 16
    assert grid_fill.units("rmsnorm", {"B": 2, "S": 3, "N": 96}) == 6
    assert grid_fill.units("cross_entropy", {"N": 8, "V": 32000}) == 8
    assert grid_fill.units("matmul", {"M": 4096, "K": 4096, "N": 4096}) == 32 * 32
    assert grid_fill.units("matmul", {"M": 64, "K": 64, "N": 64}) == 1
    assert grid_fill.units("flash_attention", {"B": 1, "H": 2, "S": 256, "D": 64}) == 4
    assert grid_fill.units("rotary_embedding", {"B": 2, "H": 32, "S": 77, "D": 128}) == 154
    big = Case.make("softmax", {"M": 4096, "N": 1024}, "float32")
    verdict = grid_fill.assess(big, {"kernel": "k", "programs": 131, "launches": 1}, "sm_90")
    assert (verdict["needed"], verdict["fills_target"]) == (132, False)  # past the SM count, the SMs decide
    assert "min(132 multiprocessors of sm_90, 4096 units of work at softmax[4096x1024:float32])" in verdict["rule"]
    assert grid_fill.assess(big, None, "sm_90")["fills_target"] is False


def test_the_heaviest_launch_decides_not_a_cheap_one_beside_it():
    grids = [("_row_loss", 16, 0.30), ("_mean", 1, 0.01), ("_row_loss", 16, 0.29), ("_mean", 1, 0.01)]
    assert grid_fill.heaviest(grids) == {"kernel": "_row_loss", "programs": 16, "launches": 2, "seconds": 0.59,
                                         "working": 16}
    assert grid_fill.heaviest([]) is None


def test_programs_that_return_without_work_do_not_fill_the_gpu():
    """A grid of one program per row where one program does every row and the rest return at once
    uses one multiprocessor: the rule counts the programs that stored anything."""
    case = Case.make("softmax", {"M": 16, "N": 256}, "float32")
    idle = grid_fill.assess(case, grid_fill.heaviest([("_rows", 16, 0.3, 1), ("_rows", 16, 0.3, 1)]), "sm_90")
    assert (idle["programs"], idle["working"], idle["fills_target"]) == (16, 1, False)
    assert "1 of which stored anything" in idle["detail"] and "does not keep it for speed" in idle["detail"]
    busy = grid_fill.assess(case, grid_fill.heaviest([("_rows", 16, 0.3, 16)]), "sm_90")
    assert (busy["working"], busy["fills_target"]) == (16, True) and "stored anything" not in busy["detail"]


def test_a_pass_not_kept_for_its_grid_tells_the_proposer_why():
    from autokernel.search.proposer import Candidate, Experiment
    experiment = Experiment.from_verdict(3, Candidate(source="", description="one program"), _cpu(10.0, programs=1),
                                         "REVERT", best_median_us=100.0)
    assert experiment.message.startswith("not kept for its CPU time: _rows ran 1 program(s) per launch")
    assert "min(132 multiprocessors of sm_90, 16 units of work" in experiment.message
    kept = Experiment.from_verdict(4, Candidate(source="", description="rows"), _cpu(10.0, programs=16), "KEEP")
    assert not kept.message
