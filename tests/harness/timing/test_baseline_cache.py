"""The torch.compile baseline is timed once per target in a judge session and reused: the same op on
the same inputs on the same device, whatever the candidate."""
from __future__ import annotations

from pathlib import Path

from harness.judge import _share_baseline, judge
from harness.workers.judge_session import JudgeSession, judge_session
from harness.kernel_types.registry import Case
from paths import GOOD_KERNELS

GOOD = GOOD_KERNELS


def _events(compiled: dict | None, error: str | None) -> list[dict]:
    return [{"event": "stage_end", "stage": "timing", "status": "pass", "kernel": {"median_us": 5.0},
             "compiled": compiled, "compiled_error": error, "compiled_seconds": 12.0}]


def test_the_first_timing_is_kept_and_later_ones_reuse_it():
    session = JudgeSession(fork=False)
    case = Case.make("softmax", {"M": 8, "N": 64}, "float32", seed=7).to_json()
    key = JudgeSession.baseline_key(case, "cpu", None)
    assert session.cached_baseline(key) is None
    _share_baseline(_events({"median_us": 3.0}, None), session, key, None)
    assert session.cached_baseline(key) == {"compiled": {"median_us": 3.0}, "compiled_error": None}
    later = _events(None, "not requested")
    _share_baseline(later, session, key, session.cached_baseline(key))
    assert later[0]["compiled"] == {"median_us": 3.0} and later[0]["compiled_cached"] is True
    # another device, GPU or shape is another baseline
    assert session.cached_baseline(JudgeSession.baseline_key(case, "cuda", "0")) is None


def test_a_worker_not_asked_for_the_baseline_does_not_fill_the_cache():
    session = JudgeSession(fork=False)
    key = JudgeSession.baseline_key({"k": 1}, "cpu", None)
    _share_baseline(_events(None, "not requested"), session, key, None)
    assert session.cached_baseline(key) is None
    _share_baseline(_events(None, "torch.compile failed: no compiler"), session, key, None)
    assert session.cached_baseline(key)["compiled_error"].startswith("torch.compile failed")


def test_two_candidates_of_a_target_share_one_compiled_baseline():
    case = Case.make("softmax", {"M": 16, "N": 256}, "float32", seed=7)
    with judge_session():
        first = judge(GOOD / "softmax_rows.py", target=case, device="cpu", compile_baseline=True)
        second = judge(GOOD / "softmax_rows.py", target=case, device="cpu", compile_baseline=True)
        # not asked for the baseline: none, not even the one the session holds
        alone = judge(GOOD / "softmax_rows.py", target=case, device="cpu", compile_baseline=False)
    assert first["verdict"] == second["verdict"] == "PASS"
    t1, t2 = first["timing"], second["timing"]
    assert "compile_cached" not in t1 and t2["compile_cached"] is True
    assert (t1["compile_median_us"], t1["compile_note"] if t1["compile_median_us"] is None else None) == \
        (t2["compile_median_us"], t2["compile_note"] if t2["compile_median_us"] is None else None)
    assert second["judge_seconds"]["baseline_compile"] == 0.0  # its worker compiled nothing
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
