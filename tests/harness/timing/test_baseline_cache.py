"""The baselines are timed in a clean worker once per target and shape in a judge session and
reused (harness/workers/baselines.py): the same op on the same inputs on the same device, whatever the
candidate; re-timed after a while or after so many candidates; and the verdict says where."""
from __future__ import annotations

import pytest

from harness.judge import judge
from harness.kernel_types.registry import Case
from harness.workers import baselines
from harness.workers.judge_session import judge_session
from paths import GOOD_KERNELS

GOOD = GOOD_KERNELS
CASE = Case.make("softmax", {"M": 8, "N": 64}, "float32", seed=7)


@pytest.fixture
def timed(monkeypatch):
    """The clean worker replaced by a recorder of what it was asked to time."""
    asked = []

    def fake(jobs, device, visible_devices, timeout_s, run=None):
        asked.append([(kind, case.label(), device) for kind, case in jobs])
        return [baselines.Figure({"median_us": 3.0 + len(asked)}, None, baselines.time.time(), 1, "fork")
                for _ in jobs]
    monkeypatch.setattr(baselines, "_time_clean", fake)
    return asked


def test_a_baseline_is_timed_once_per_target_and_shape_and_reused(timed):
    store = baselines.BaselineStore()
    first = baselines.obtain([("eager", CASE)], "cpu", None, 60, store)
    second = baselines.obtain([("eager", CASE)], "cpu", None, 60, store)
    assert timed == [[("eager", CASE.label(), "cpu")]]
    assert (first[0][1], second[0][1]) == (False, True) and first[0][0] is second[0][0]
    # another shape, device, GPU or kind is another baseline; only what is missing is timed
    other = CASE.replace(shape=(("M", 16), ("N", 64)))
    baselines.obtain([("eager", CASE), ("eager", other), ("compiled", CASE)], "cpu", None, 60, store)
    baselines.obtain([("eager", CASE)], "cuda", "0", 60, store)
    assert timed[1:] == [[("eager", other.label(), "cpu"), ("compiled", CASE.label(), "cpu")],
                         [("eager", CASE.label(), "cuda")]]


def test_a_baseline_is_timed_again_when_old_or_much_used(timed, monkeypatch):
    store = baselines.BaselineStore()
    baselines.obtain([("eager", CASE)], "cpu", None, 60, store)
    for _ in range(baselines.MAX_USES - 1):
        baselines.obtain([("eager", CASE)], "cpu", None, 60, store)
    assert len(timed) == 1
    baselines.obtain([("eager", CASE)], "cpu", None, 60, store)  # served MAX_USES candidates: again
    assert len(timed) == 2
    later = baselines.time.time() + baselines.MAX_AGE_S + 1
    monkeypatch.setattr(baselines.time, "time", lambda: later)
    baselines.obtain([("eager", CASE)], "cpu", None, 60, store)  # older than MAX_AGE_S: again
    assert len(timed) == 3


def test_without_a_session_every_judgement_times_its_own(timed):
    baselines.obtain([("eager", CASE)], "cpu", None, 60, None)
    baselines.obtain([("eager", CASE)], "cpu", None, 60, None)
    assert len(timed) == 2


def test_two_candidates_of_a_target_share_one_baseline_timed_in_a_clean_worker():
    case = Case.make("softmax", {"M": 16, "N": 256}, "float32", seed=7)
    with judge_session() as session:
        first = judge(GOOD / "softmax_rows.py", target=case, device="cpu", compile_baseline=True)
        second = judge(GOOD / "softmax_rows.py", target=case, device="cpu", compile_baseline=True)
        # not asked for torch.compile: none, not even the one the session holds
        alone = judge(GOOD / "softmax_rows.py", target=case, device="cpu", compile_baseline=False)
        runs = session.baselines.runs
    assert first["verdict"] == second["verdict"] == alone["verdict"] == "PASS"
    t1, t2 = first["timing"], second["timing"]
    assert runs == 1  # one clean worker timed eager and torch.compile, for all three
    assert t1["baseline_source"]["process"] == baselines.PROCESS
    assert (t1["baseline_source"]["reused"], t2["baseline_source"]["reused"]) == (False, True)
    assert t1["baseline_source"]["timed_at"] == t2["baseline_source"]["timed_at"]
    assert t1["baseline_samples_us"] == t2["baseline_samples_us"] == alone["timing"]["baseline_samples_us"]
    assert (t1["compile_cached"], t2["compile_cached"]) == (False, True)
    assert t1["compile_median_us"] == t2["compile_median_us"]
    assert alone["timing"]["compile_median_us"] is None and "compile_cached" not in alone["timing"]


def test_the_compile_baseline_caches_are_the_kept_ones_while_it_compiles_and_only_then(tmp_path, monkeypatch):
    import os

    from torch._inductor import codecache

    from harness.timing import compile_cache
    monkeypatch.setenv("AUTOKERNEL_CACHE_DIR", str(tmp_path))
    before = (os.environ.get("TORCHINDUCTOR_CACHE_DIR"), codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR)
    kept = compile_cache.root()
    assert kept.is_relative_to(tmp_path)
    with compile_cache.baseline_caches():
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(kept / "inductor")
        assert os.environ["TRITON_CACHE_DIR"] == str(kept / "triton")
        # Inductor's precompiled C++ headers too, which it otherwise keeps under the temporary
        # folder: a worker's scratch, gone after every judgement
        assert codecache._HEADER_DIR == str(kept / "inductor" / "precompiled_headers")
        assert codecache._HEADER_LOCK_DIR == str(kept / "inductor" / "precompiled_headers" / "locks")
    assert (os.environ.get("TORCHINDUCTOR_CACHE_DIR"), codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR) == before
