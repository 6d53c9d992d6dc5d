"""The scheduler, the strategy rotation and the population: pure functions of the targets' states."""
import pytest

from autokernel.search import population, schedule
from autokernel.search.run import TargetState


def target(name="softmax[8x128:float32]", share=0.5, ceiling=4.0, eager=100.0, best=None, history=(), **kw):
    t = TargetState(name=name, kernel_type="softmax", dims={"M": 8, "N": 128}, dtype="float32", share=share,
                    ceiling_speedup=ceiling, eager_median_us=eager, best_median_us=best, **kw)
    t.history = [{"decision": "BASELINE", "verdict": "PASS"}, *history]
    return t


def reverts(n, verdict="PASS"):
    return [{"decision": "REVERT", "verdict": verdict}] * n


def test_amdahl_on_the_whole_model():
    a, b = target(share=0.6, best=50.0), target(share=0.2, best=100.0)  # a at 2x of 4x, b at 1x
    targets = [a, b]
    assert schedule.model_time(targets) == pytest.approx(1 - 0.6 * 0.5)
    assert schedule.left_share(a) == pytest.approx(0.6 * (0.5 - 0.25))
    assert schedule.e2e_gain_left(targets, a) == pytest.approx(0.7 / (0.7 - 0.15))
    assert schedule.e2e_gain_left(targets, b) == pytest.approx(0.7 / (0.7 - 0.2 * 0.75))


def test_a_kernel_slower_than_pytorch_wins_nothing_end_to_end():
    # a best of 0.5x is not served: the model runs PyTorch's op there, as with no kernel at all
    slow, quick = target("slow", share=0.4, best=200.0), target("quick", share=0.4, best=50.0)
    assert schedule.model_time([slow, quick]) == pytest.approx(1 - 0.4 * 0.5)
    assert schedule.left_share(slow) == pytest.approx(0.4 * (1 - 0.25))  # from 1x, not from 0.5x, to 4x
    # below 1x with a ceiling at 1x: climbing back to PyTorch's speed wins nothing
    stuck = target("stuck", share=0.6, ceiling=1.0, best=200.0)
    assert schedule.left_share(stuck) == 0.0 and schedule.gain_per_min([stuck], stuck) == 0.0
    assert schedule.choose([stuck, target("small", share=0.05, best=100.0)]).index == 1


def test_the_next_experiment_goes_where_the_gain_per_minute_is_largest():
    big, small = target("big", share=0.6), target("small", share=0.1)
    assert schedule.choose([small, big]).index == 1 and "60% of the model" in schedule.choose([small, big]).why
    # a record of failures and reverts discounts a target; a slow one is worth less per minute
    failing = target("failing", share=0.3, history=reverts(12, "FAIL"))
    assert schedule.choose([target("fresh", share=0.3), small]).index == 0
    assert schedule.choose([failing, small]).index == 1
    slow = target("slow", share=0.2, seconds=6000.0)
    assert schedule.choose([slow, target("quick", share=0.15, seconds=60.0)]).index == 1
    # at its ceiling: nothing left, it is never chosen over a target with headroom
    assert schedule.choose([target("top", share=0.9, best=25.0), small]).index == 1


def test_the_current_target_keeps_its_turn_until_a_plateau_parks_it():
    a, b = target("a", share=0.5), target("b", share=0.45)
    assert schedule.choose([a, b]).index == 0
    c = target("c", share=0.05)
    assert schedule.choose([a, c], current=1).index == 0  # its baseline alone: the baseline round is over
    c.history += reverts(1)
    assert schedule.choose([a, c], current=1).index == 1  # round robin's visits, kept until a plateau


def test_a_target_behind_its_minimum_of_turns_comes_first():
    tried = target("tried", share=0.6, history=reverts(10) + [{"decision": "KEEP", "verdict": "PASS"}] * 30)
    behind = target("behind", share=0.01, history=reverts(4))
    even = (len(tried.history) + len(behind.history)) / 2
    assert len(behind.history) < schedule.FLOOR * even
    choice = schedule.choose([tried, behind])
    assert choice.index == 1 and "minimum of turns" in choice.why
    level = target("level", share=0.01, history=reverts(40))
    assert schedule.choose([tried, level]).index == 0  # past its minimum, the gain per minute decides


def test_a_target_that_stopped_paying_is_left_whatever_its_roofline_promised():
    # most of the model and a roofline of 4x, but small keeps and then forty passes without one
    small = {"decision": "KEEP", "verdict": "PASS", "speedup_vs_best": 1.02}
    dry = target("dry", share=0.6, best=95.0, history=[small] * 3 + reverts(40))
    kept = {"decision": "KEEP", "verdict": "PASS", "speedup_vs_best": 1.1}
    paying = target("paying", share=0.1, best=60.0, history=(reverts(3) + [kept]) * 11)
    assert schedule.choose([dry, paying]).index == 1
    drier = target("drier", share=0.6, best=95.0, history=[small] * 3 + reverts(80))
    assert schedule.gain_per_min([drier, paying], drier) < schedule.gain_per_min([dry, paying], dry) / 1.3


def test_done_and_blocked_targets_are_not_eligible():
    assert schedule.choose([target(status="done"), target(blocked="no prompt fits")]) is None
    assert schedule.choose([target(status="parked"), target(status="done")]).index == 0  # parked comes back


def test_within_noise_of_the_ceiling_is_done():
    assert schedule.at_ceiling(target(best=25.5, best_iqr_us=0.1, best_reps=20))  # 3.92x of 4x: within 3%
    assert not schedule.at_ceiling(target(best=30.0, best_iqr_us=0.1, best_reps=20))
    assert schedule.at_ceiling(target(best=28.0, best_iqr_us=20.0, best_reps=4))  # a noisy best: within noise
    assert not schedule.at_ceiling(target(ceiling=None, best=10.0))  # no ceiling known: never done by it


def test_a_best_beyond_the_roofline_shows_it_wrong_and_the_search_goes_on():
    beyond = target(ceiling=2.0, best=40.0, best_iqr_us=0.1, best_reps=20)  # 2.5x where the roofline says 2x
    assert schedule.roofline_disproved(beyond) and not schedule.at_ceiling(beyond)
    assert schedule.at_roofline(beyond)  # round robin's plain rule trusts the plan and stops it
    assert schedule.ceiling_of(beyond) == pytest.approx(1.5 * 2.5)  # a guess above its best, not the roofline
    within = target(ceiling=2.0, best=50.5, best_iqr_us=0.1, best_reps=20)
    assert schedule.at_ceiling(within) and not schedule.roofline_disproved(within)


def test_the_strategy_rotation_and_the_stronger_model():
    assert [schedule.strategy_for("llm", p) for p in range(6)] == [
        "refine", "next_tier", "different_algorithm", "ideas_first", "next_tier", "different_algorithm"]
    assert [schedule.strategy_for("tune", p) for p in range(3)] == ["tune", "reseed", "reseed"]
    assert schedule.model_for(["cheap", "strong"], 0) == "cheap"
    assert schedule.model_for(["cheap", "strong"], 1) == "strong" and schedule.model_for(["only"], 3) == "only"


def elite(number, median_us, sha=None):
    return {"number": number, "median_us": median_us, "iqr_us": 0.0, "reps": 20, "sha256": sha or f"h{number}",
            "description": ""}


def test_elites_are_the_best_few_distinct_kernels():
    elites = []
    for e in (elite(0, 100), elite(1, 80), elite(2, 90), elite(3, 80, sha="h1"), elite(4, 70), elite(5, 95),
              elite(6, 120)):
        elites = population.admit(elites, e)
    assert [e["number"] for e in elites] == [4, 1, 2, 5]  # fastest first, no text twice, at most 4


def test_a_parent_is_usually_the_best_and_inspirations_are_the_others():
    elites = [elite(4, 70), elite(1, 80), elite(2, 90)]
    parents = [population.choose_parent(elites, 4, f"t:{n}")["number"] for n in range(200)]
    assert 0.6 < parents.count(4) / 200 < 0.8 and {1, 2} <= set(parents)
    assert parents == [population.choose_parent(elites, 4, f"t:{n}")["number"] for n in range(200)]  # seeded
    assert [e["number"] for e in population.inspirations(elites, elites[1])] == [4, 2]
    assert population.choose_parent([], None, "x") is None


def test_with_little_time_left_the_parent_is_the_best():
    elites = [elite(4, 70), elite(1, 80), elite(2, 90)]
    assert {population.choose_parent(elites, 4, f"t:{n}", explore=False)["number"] for n in range(200)} == {4}
    # another elite's line must catch up with the best and then pay back, over the experiments after
    # it (60 of them): a night holds them, the last hour of a run at a minute an experiment does not
    t = paced("t", share=0.5, seconds_per_experiment=60.0, experiments=5)
    assert schedule.explores_parents([t], t, 8 * 3600) and schedule.explores_parents([t], t, float("inf"))
    assert schedule.explores_parents([t], t, 61 * 60)
    assert not schedule.explores_parents([t], t, 60 * 60) and not schedule.explores_parents([t], t, 30 * 60)
    slow = paced("slow", share=0.5, seconds_per_experiment=600.0, experiments=5)  # ten minutes a verdict
    assert not schedule.explores_parents([slow], slow, 8 * 3600) and schedule.explores_parents([slow], slow, 12 * 3600)


def test_the_chosen_line_says_the_baseline_round_and_on_the_cpu_promises_no_ceiling():
    fresh = [target("a", share=0.6), target("b", share=0.3)]
    for t in fresh:
        t.history = []
    why = schedule.choose(fresh).why
    assert why.startswith("the baseline round") and "0 of 2 measured" in why and "/min" not in why
    measured = [target("a", share=0.6, best=50.0), target("b", share=0.3)]
    on_gpu, on_cpu = schedule.choose(measured).why, schedule.choose(measured, cpu=True).why
    assert "roofline 4x" in on_gpu and "end to end" in on_gpu and "its record suggests up to" in on_gpu
    assert "interpreter" in on_cpu and "roofline" not in on_cpu and "up to" not in on_cpu


def paced(name, share, seconds_per_experiment, experiments=3, **kw):
    """A target with a record: `experiments` entries (its baseline first), each taking this long."""
    t = target(name, share=share, history=reverts(experiments - 1), **kw)
    t.seconds = seconds_per_experiment * experiments
    return t


def test_a_target_whose_next_experiment_cannot_end_before_the_budget_is_not_visited():
    slow = paced("slow", share=0.8, seconds_per_experiment=600.0)  # ten minutes a verdict, most of the model
    quick = paced("quick", share=0.04, seconds_per_experiment=60.0)
    assert schedule.choose([slow, quick]).index == 0  # a night ahead: the largest gain per minute
    assert schedule.choose([slow, quick], left_s=8 * 3600).index == 0
    assert schedule.choose([slow, quick], left_s=300.0).index == 1  # five minutes left
    assert schedule.choose([slow, quick], current=0, left_s=300.0).index == 1  # nor does its visit go on
    assert schedule.choose([slow], left_s=300.0) is None  # nothing can end in time: nothing is chosen
    assert schedule.choose([slow], left_s=600.0).index == 0


def test_a_first_baseline_that_took_minutes_sets_the_pace_of_the_next():
    """Before any target is searched, the baselines measured so far are the least a verdict costs:
    a run whose first baseline took seven minutes (a fused loss in the Triton interpreter) starts no
    second one with two minutes left, where the prior minute let it start one and end minutes past
    its budget."""
    first = paced("first", share=0.6, seconds_per_experiment=420.0, experiments=1)
    fresh = target("fresh", share=0.3)
    fresh.history = []
    assert not schedule.fits([first, fresh], fresh, left_s=120.0)
    assert schedule.choose([first, fresh], left_s=120.0) is None
    assert schedule.choose([first, fresh], left_s=8 * 3600).index == 1  # a night: its baseline is measured


def baselines_measured(left_s, cpu=False):
    """The baselines the baseline round measures with `left_s` left, at a minute an experiment,
    every one taking its minute from the time left."""
    done = paced("measured", share=0.05, seconds_per_experiment=60.0, experiments=12, status="parked")
    fresh = [target(f"f{i}", share=0.9 * (0.8 ** i) / 4, ceiling=4.0) for i in range(8)]
    for t in fresh:
        t.history = []
    world, measured = [done, *fresh], []
    while (choice := schedule.choose(world, cpu=cpu, left_s=left_s)) and choice.why.startswith("the baseline round"):
        world[choice.index].history = [{"decision": "BASELINE", "verdict": "PASS"}]
        world[choice.index].seconds = 60.0
        measured.append(world[choice.index].name)
        left_s -= 60.0
    return measured


def test_a_baseline_is_measured_only_where_the_time_left_can_pay_it_back():
    everyone = [f"f{i}" for i in range(8)]
    assert baselines_measured(8 * 3600) == everyone  # a night ahead: every baseline, the largest first
    assert baselines_measured(25 * 60) == ["f0"]  # a lunch break: the largest share x gap alone can pay back
    assert baselines_measured(60 * 60) == everyone[:3]
    # each target is given what its gap would take at its expected pace (15-30 experiments here)
    assert 15 <= schedule.visit_experiments([], target("x", share=0.2)) <= schedule.PAYBACK_MAX


def test_on_the_cpu_every_starter_that_fits_is_judged_the_largest_share_first():
    """The interpreter runs a kernel hundreds of times slower than PyTorch's op, so nothing there
    pays back in any time: a CPU run spends a short budget judging each target's starter (what
    verify then serves), not on the one target a GPU's time left would pay back."""
    everyone = [f"f{i}" for i in range(8)]
    assert baselines_measured(25 * 60, cpu=True) == everyone  # the GPU rule measures f0 alone here
    assert baselines_measured(5 * 60, cpu=True) == everyone[:5]  # a verdict a minute: five fit, then none
    assert baselines_measured(30, cpu=True) == []  # a verdict takes a minute: none can end in time


def test_the_minimum_of_turns_covers_only_the_targets_the_time_left_pays_back():
    kept = {"decision": "KEEP", "verdict": "PASS", "speedup_vs_best": 1.1}
    big = paced("big", share=0.6, seconds_per_experiment=60.0, experiments=1, best=60.0)
    big.history += (reverts(2) + [kept]) * 10
    big.seconds = 60.0 * len(big.history)
    small = paced("small", share=0.02, seconds_per_experiment=60.0, experiments=2)
    assert len(small.history) < schedule.FLOOR * schedule.fair_share([big, small], [0, 1])
    assert "minimum of turns" in schedule.choose([big, small], left_s=8 * 3600).why  # a night: its turns are kept
    assert schedule.choose([big, small], left_s=12 * 60).index == 0  # twelve minutes: the large one alone pays


def test_with_minutes_left_no_baseline_is_started_but_a_run_s_first_one_is():
    def fresh(name, share):
        t = target(name, share=share)
        t.history = []
        return t
    parked = paced("parked", share=0.05, seconds_per_experiment=60.0, experiments=6, status="parked")
    # ninety seconds at a minute an experiment: a baseline and nothing after it
    choice = schedule.choose([parked, fresh("a", 0.5), fresh("b", 0.3)], left_s=90)
    assert choice.index == 0 and not choice.why.startswith("the baseline round")
    assert schedule.choose([parked, fresh("a", 0.5)], left_s=20 * 60).index == 1  # twenty: the large one's baseline
    # five minutes: four experiments after the baseline; they pay only where they beat the measured one
    assert schedule.choose([parked, fresh("a", 0.5)], left_s=5 * 60).index == 1
    strong = paced("strong", share=0.9, seconds_per_experiment=60.0, experiments=2, status="parked")
    assert schedule.choose([strong, fresh("a", 0.2)], left_s=5 * 60).index == 0
    assert schedule.choose([strong, fresh("a", 0.2)], left_s=8 * 3600).index == 1  # a night: every baseline
    gone = paced("gone", share=0.05, seconds_per_experiment=60.0, experiments=6, status="done")
    assert schedule.choose([gone, fresh("a", 0.5)], left_s=90) is None  # nothing left that can pay back
    # a three-minute run: nothing measured yet, so no pace to go by, and its largest target is measured
    assert schedule.choose([fresh("b", 0.3), fresh("a", 0.5)], left_s=3 * 60).index == 1
