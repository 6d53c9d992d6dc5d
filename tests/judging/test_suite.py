"""`autokernel bench --suite starters`, cut to one kernel type so it stays quick on a CPU. The tests
share one judge session, as the rows of one suite do: the reduce target's torch.compile baseline
is compiled once, and later rows say it was reused."""
from __future__ import annotations

import json

import pytest

from autokernel.errors import UsageError
from autokernel.judging.suite import judge_suite, run_suite
from harness.workers.judge_session import judge_session
from toolchain import needs_nvcc


@pytest.fixture(scope="module", autouse=True)
def one_session():
    with judge_session() as session:
        yield session


@needs_nvcc  # the CUDA C++ row is compiled for the target
def test_suite_judges_both_backends_with_both_baselines():
    triton, cuda = judge_suite("cpu", "sm_90", None, types=["reduce"])
    assert (triton["backend"], triton["verdict"]) == ("triton", "PASS")
    assert triton["target"] == "reduce[16x4096:float32]"
    t = triton["timing"]
    assert t["representative_of_gpu"] is False and t["baseline_median_us"] > 0
    # torch.compile is the second baseline: timed, or missing with the reason, never silently absent
    assert (t["speedup_vs_compile"] or 0) > 0 or t["compile_note"]
    assert triton["roofline"]["gbps"] > 0 and triton["resources"]["registers"] > 0
    assert (cuda["backend"], cuda["verdict"]) == ("cuda", "COMPILE_ONLY")
    assert cuda["resources"]["arch"] == "sm_90" and cuda["resources"]["registers"] > 0


@needs_nvcc  # the CUDA C++ row is compiled for the target
def test_suite_json_is_one_list(capsys):
    code = run_suite("starters", json_out=True, timeout_s=None, device="cpu", arch="sm_80", types=["reduce"])
    verdicts = json.loads(capsys.readouterr().out)
    assert code == 0 and [v["verdict"] for v in verdicts] == ["PASS", "COMPILE_ONLY"]
    assert all(v["resources"]["arch"] == "sm_80" for v in verdicts)


def test_suite_streams_each_row_as_a_json_line_and_a_stderr_row(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    out.write_text('{"earlier": "run"}\n', encoding="utf-8")  # appended to, never truncated
    code = run_suite("starters", json_out=False, timeout_s=None, device="cpu", arch="sm_90", types=["reduce"],
                     backend="triton", dtype="bfloat16", jsonl=str(out))
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert code == 0 and lines[0] == {"earlier": "run"} and len(lines) == 2
    assert (lines[1]["backend"], lines[1]["target"]) == ("triton", "reduce[16x4096:bfloat16]")
    err = capsys.readouterr().err
    assert "reduce[16x4096:bfloat16] | triton | PASS" in err


def test_suite_rejects_an_unknown_backend_or_type():
    with pytest.raises(UsageError, match="unknown backend"):
        run_suite("starters", json_out=True, timeout_s=None, device="cpu", arch="sm_90", backend="opencl")
    with pytest.raises(UsageError, match="unknown kernel type"):
        run_suite("starters", json_out=True, timeout_s=None, device="cpu", arch="sm_90", types=["conv9"])
