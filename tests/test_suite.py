"""`autokernel bench --suite starters`, cut to one kernel type so it stays quick on a CPU."""
from __future__ import annotations

import json

from autokernel.suite import judge_suite, run_suite


def test_suite_judges_both_backends_with_both_baselines():
    triton, cuda = judge_suite("cpu", "sm_90", None, types=["reduce"])
    assert (triton["backend"], triton["verdict"]) == ("triton", "PASS")
    assert triton["target"] == "reduce[64x4096:float32]"
    t = triton["timing"]
    assert t["representative_of_gpu"] is False and t["baseline_median_us"] > 0
    # torch.compile is the second baseline: timed, or missing with the reason, never silently absent
    assert (t["speedup_vs_compile"] or 0) > 0 or t["compile_note"]
    assert triton["roofline"]["gbps"] > 0 and triton["resources"]["registers"] > 0
    assert (cuda["backend"], cuda["verdict"]) == ("cuda", "COMPILE_ONLY")
    assert cuda["resources"]["arch"] == "sm_90" and cuda["resources"]["registers"] > 0


def test_suite_json_is_one_list(capsys):
    code = run_suite("starters", json_out=True, timeout_s=None, device="cpu", arch="sm_80", types=["softmax"])
    verdicts = json.loads(capsys.readouterr().out)
    assert code == 0 and [v["verdict"] for v in verdicts] == ["PASS", "COMPILE_ONLY"]
    assert all(v["resources"]["arch"] == "sm_80" for v in verdicts)
