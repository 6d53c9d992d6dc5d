"""The judge's backward gate, both directions: honest backwards pass beside wrong ones, each wrong
one refused at its stage for its reason, the forward's verdict standing apart. All on the CPU."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from backward_kernels import BACKWARD_KERNELS, VARIANTS, write
from harness.verdict.backward_checks import STAGES


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    from harness.judge import judge
    from harness.workers.judge_session import judge_session
    paths = write(tmp_path_factory.mktemp("backward"))
    paths["softmax"] = BACKWARD_KERNELS / "softmax.py"
    paths["forward_only"] = tmp_path_factory.mktemp("forward") / "rmsnorm.py"
    paths["forward_only"].write_text(VARIANTS["honest"][0].split("\n\ndef backward_fn")[0] + "\n")
    # torch.compile's joint graph is timed on the CPU only on request: asked for the honest one alone
    with judge_session(fork=True), ThreadPoolExecutor(2) as pool:
        return dict(zip(paths, pool.map(lambda p: judge(p, device="cpu", backward=True,
                                                        compile_baseline=p == paths["honest"]), paths.values())))


def _why(back: dict) -> str:
    return next((s["detail"] for s in back["stages"] if s["name"] == back["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_backward_gets_its_verdict_and_the_forward_stands(verdicts, name):
    _, want, stage, phrase = VARIANTS[name]
    v = verdicts[name]
    assert v["verdict"] == "PASS", v["failed_stage"]  # the forward is judged apart: every one of them passes
    back = v["backward"]
    assert (back["verdict"], back["failed_stage"]) == (want, stage), _why(back)
    assert phrase in _why(back)
    assert [s["name"] for s in back["stages"]] == list(STAGES)
    if want == "PASS":
        assert v["serves"] == "training and inference"
    else:
        assert v["serves"] == f"inference only: the backward failed {stage}"


def test_an_honest_softmax_backward_passes(verdicts):
    back = verdicts["softmax"]["backward"]
    assert back["verdict"] == "PASS", _why(back)


def test_a_forward_only_file_passes_as_before(verdicts):
    v = verdicts["forward_only"]
    assert v["verdict"] == "PASS" and v["backward"] is None
    assert v["serves"] == "forward only: serves inference"
    assert not any(s["name"].startswith("backward") for s in v["stages"])


def test_a_passing_backward_is_timed_three_ways_against_eager_and_the_compiled_joint_graph(verdicts):
    back = verdicts["honest"]["backward"]
    timing = back["timing"]
    assert timing["representative_of_gpu"] is False and "interpreter" in timing["method"].lower()
    for step in ("forward", "backward", "forward_backward"):
        t = timing[step]
        assert t["median_us"] > 0 and t["reps"] >= 5
        assert t["eager_median_us"] > 0, t  # timed in the clean baseline worker
        # asked for (compile_baseline), so timed on the CPU too (or its failure said: no C++ compiler)
        assert t["compiled_median_us"] > 0 or t.get("compiled_error"), t
        assert "compiled_note" not in t, t
        # a speedup is the baseline's time over the kernel's: above 1 when the kernel is faster
        assert t["speedup_vs_eager"] == pytest.approx(t["eager_median_us"] / t["median_us"])
        if t["compiled_median_us"]:
            assert t["speedup_vs_compiled"] == pytest.approx(t["compiled_median_us"] / t["median_us"])
    assert back["memory"] == {"measured": False, "detail": back["memory"]["detail"]}
    assert "not measured on the CPU" in back["memory"]["detail"]
    assert next(s for s in back["stages"] if s["name"] == "timing")["status"] == "pass"


def test_on_the_cpu_the_compiled_joint_graph_is_timed_only_on_request(verdicts):
    # the interpreter's time compares nothing with Inductor's C++: not timed unless asked for, and said so
    timing = verdicts["softmax"]["backward"]["timing"]
    for step in ("forward", "backward", "forward_backward"):
        t = timing[step]
        assert t["eager_median_us"] > 0, t
        assert t["compiled_median_us"] is None and t["speedup_vs_compiled"] is None, t
        assert "on the CPU only on request" in t["compiled_note"], t


def test_a_failed_backward_is_not_timed(verdicts):
    back = verdicts["off_by_factor"]["backward"]
    assert back["timing"] is None and back["memory"] is None
