"""The shapes around a target: which ones the judge takes, that it checks and times a kernel there
(and says where it was wrong), that a slow candidate is spared the work, and that the search asks
for them and keeps them in the winner's record."""
import json

import pytest

from autokernel.search import loop, run_search
from autokernel.search import run as runs
from autokernel.search.run import RunState, TargetState
from harness.verdict import around
from harness.kernel_types.registry import Case
from judge_kernels import source, wrap


def test_rows_are_halved_plus_odd_doubled_and_one_and_attention_also_doubles_the_batch():
    rows = around.cases(Case.make("rmsnorm", {"M": 128, "N": 384}, "bfloat16"), "bfloat16")
    assert [c.dims for c in rows] == [{"M": 67, "N": 384}, {"M": 256, "N": 384}, {"M": 1, "N": 384}]
    assert len({c.seed for c in rows}) == 3 and all(c.dtype == "bfloat16" for c in rows)
    attention = around.cases(Case.make("flash_attention", {"B": 1, "H": 6, "S": 128, "D": 64}, "float16", causal=True),
                             "float16")
    assert [(c.dims["B"], c.dims["S"]) for c in attention] == [(1, 67), (1, 256), (1, 1), (2, 128)]
    assert all(c.options == {"causal": True} and c.dims["H"] == 6 for c in attention)
    decode = around.cases(Case.make("matmul", {"M": 1, "K": 256, "N": 256}, "float32"), "float32")
    assert [c.dims["M"] for c in decode] == [3, 2]  # a decode target: no shape twice
    assert around.cases(None, "float32") == []


class Timing:
    median_us = 50.0


def test_a_candidate_not_faster_than_the_best_at_its_target_is_not_timed_around():
    events, timed = [], []

    class Log:
        def event(self, **fields):
            events.append(fields)

    class W:
        log, device, target = Log(), "cpu", Case.make("softmax", {"M": 8, "N": 64}, "float32")
    around.time_around(W, "float32", Timing, 40.0, lambda *a, **k: timed.append(a))
    assert timed == [] and events[0]["event"] == "around_skipped" and "not below the best" in events[0]["reason"]
    assert around.assess(events, None, [], "cpu") == {"shapes": [], "skipped": events[0]["reason"]}


# a correct softmax, except at 16 rows: a shape no stage of the judge runs (its sweep, stability,
# edge and integrity cases have 1 to 24 rows, never 16), only the shapes around 8 rows do
WRONG_AT_16_ROWS = source(wrapper=wrap(
    "_softmax_row[(x2.shape[0],)](x2, y, x2.shape[1], x2.stride(0), y.stride(0), 0.5 if x2.shape[0] == 16 else 0.0,",
    "                             BLOCK=triton.next_power_of_2(x2.shape[1]))",
    "return y.view(shape)"), body='''    e = tl.exp(x - tl.max(x, 0))
    y = e / tl.sum(e, 0) + jitter''')


@pytest.mark.slow
def test_the_judge_checks_and_times_the_shapes_around_and_names_where_the_kernel_is_wrong(tmp_path):
    from harness.judge import judge
    path = tmp_path / "wrong_at_16.py"
    path.write_text(WRONG_AT_16_ROWS)
    target = Case.make("softmax", {"M": 8, "N": 64}, "float32")
    verdict = judge(path, target=target, device="cpu", time_around=True)
    assert verdict["verdict"] == "PASS", verdict["stages"]  # right at every shape the stages run
    shapes = {s["dims"]["M"]: s for s in verdict["timing_around"]["shapes"]}
    assert sorted(shapes) == [1, 7, 16]
    assert shapes[7]["ok"] and shapes[1]["ok"] and shapes[7]["median_us"] > 0 and shapes[7]["baseline_median_us"] > 0
    assert not shapes[16]["ok"] and shapes[16]["failed"] and shapes[16]["detail"].startswith("wrong result")
    assert shapes[7]["representative_of_gpu"] is False  # the interpreter's time


def test_the_search_asks_for_the_shapes_around_with_the_time_to_beat_and_not_for_module_targets(tmp_path):
    asked = []

    def judge(kernel_file, *, target, device, arch, timeout_s, **around_options):
        asked.append(around_options)
        median_us = 100.0 - 10 * len(asked)
        return {"verdict": "PASS", "failed_stage": None, "stages": [], "device": {"type": "cpu"},
                "timing": {"median_us": median_us, "iqr_us": 0.0, "reps": 20, "baseline_median_us": 100.0},
                "timing_around": {"shapes": [], "skipped": None}}
    run = runs.RunDir(tmp_path / "run")
    run.create()
    t = TargetState(name="softmax[8x128:float32]", kernel_type="softmax", dims={"M": 8, "N": 128}, dtype="float32",
                    share=1.0)
    state = RunState(run_id="run", agent="tune", budget_s=3600.0, targets=[t])
    settings = loop.SearchSettings(max_experiments=2, plateau=9, time_around=True)
    run_search.search_all(run, state, settings, run_search.proposer_factory("tune", seed=0),
                          starter_source=run_search.starter_sources(run), judge=judge)
    assert asked == [{"time_around": True, "around_below_us": None},  # the baseline: always
                     {"time_around": True, "around_below_us": 90.0}, {"time_around": True, "around_below_us": 80.0}]
    best = json.loads(run.experiment_file(t, t.best_experiment, ".json").read_text())
    assert best["timing_around"] == {"shapes": [], "skipped": None}  # the winner's record carries them
    module = TargetState(name="module[M.f:1x8:float32]", kernel_type="module", dims={}, dtype="float32")
    assert loop.TargetSearch.around(type("S", (), {"settings": settings, "target": module})()) == {}

