"""The judge, both directions: wrong and cheating kernels are rejected at the right stage, and
correct kernels written differently from the starters are accepted. All on the CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import judge_kernels
from harness.correctness.cases import STAGES
from judge_kernels import GOOD
from processes import judge_workers, killed_scratch, still_alive
VERDICT_KEYS = {"kernel_file", "kernel_type", "backend", "verdict", "failed_stage", "stages", "timing",
                "roofline", "resources", "device", "versions"}
TIMING_KEYS = {"median_us", "iqr_us", "reps", "baseline_median_us", "speedup_vs_eager", "method",
               "representative_of_gpu"}


@pytest.fixture
def verdicts(judged):
    """Every variant and good kernel, judged once per session (tests/conftest.py)."""
    return judged.verdicts


def _detail(verdict: dict) -> str:
    return next((s["detail"] for s in verdict["stages"] if s["name"] == verdict["failed_stage"]), "")


@pytest.mark.parametrize("name", list(judge_kernels.VARIANTS))
def test_variant_gets_its_verdict(verdicts, name):
    _, want_verdict, want_stage = judge_kernels.VARIANTS[name]
    v = verdicts[name]
    assert (v["verdict"], v["failed_stage"]) == (want_verdict, want_stage), _detail(v)
    if want_stage:
        assert _detail(v).strip(), "a failure must say why"


@pytest.mark.parametrize("name", sorted(p.stem for p in GOOD.glob("*.py")))
def test_correct_kernels_written_differently_pass(verdicts, name):
    v = verdicts[f"good/{name}"]
    assert v["verdict"] == "PASS", _detail(v)


def test_verdict_json_has_the_design_shape(verdicts):
    v = verdicts["correct"]
    assert VERDICT_KEYS <= set(v)
    assert [s["name"] for s in v["stages"]] == list(STAGES)
    assert all(s["status"] == "pass" for s in v["stages"])
    assert TIMING_KEYS <= set(v["timing"])
    assert v["timing"]["representative_of_gpu"] is False
    assert "interpreter" in v["timing"]["method"].lower()
    assert v["timing"]["median_us"] > 0 and v["timing"]["reps"] >= 3
    assert v["roofline"]["cpu_figures"] is True
    sweep = next(s for s in v["stages"] if s["name"] == "shape_sweep")
    # the interpreter runs bf16 loads, stores and reductions: a softmax is checked in bf16 too (bf16
    # dot products, which it gets wrong, are a labelled skip: tests/harness/correctness/test_cases.py)
    assert "bfloat16: skip" not in sweep["detail"]


def test_failure_messages_name_the_hack(verdicts):
    assert "calls_reference.py:27: not on the kernel allow-list: torch.softmax" in _detail(verdicts["calls_reference"])
    assert "PyTorch compute" in _detail(verdicts["operator_compute"])
    assert "aten::mul" in _detail(verdicts["operator_compute"])
    assert "state: _replay" in _detail(verdicts["result_cache"])
    assert "numpy_no_launch.py:" in _detail(verdicts["numpy_no_launch"])
    assert "import not allowed: import numpy" in _detail(verdicts["numpy_no_launch"])
    assert "state: .setdefault() changes _buffers" in _detail(verdicts["reused_output_buffer"])
    assert "SIGSEGV" in _detail(verdicts["segfault"])
    assert "illegal memory access" in _detail(verdicts["cuda_error"]), "the stderr tail names the CUDA error"
    assert "state: _calls[0]" in _detail(verdicts["jitter"])
    assert "process group was killed" in _detail(verdicts["hang"])


def test_later_stages_are_skipped_after_a_failure(verdicts):
    stages = verdicts["wrong_math"]["stages"]
    assert [s["status"] for s in stages] == ["pass", "fail"] + ["skip"] * (len(STAGES) - 2)
    assert verdicts["wrong_math"]["timing"] is None


def _bench(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autokernel", "bench", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def _bench_here(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`autokernel bench ARGS` through the CLI's own entry point, in this process (its worker still
    a process of its own): exit status, stdout and stderr as a user sees them."""
    from autokernel.cli import main
    monkeypatch.setattr(sys, "argv", ["autokernel", "bench", *args])
    with pytest.raises(SystemExit) as ended:
        main()
    out = capsys.readouterr()
    return ended.value.code, out.out, out.err


def test_bench_json_is_one_object_and_exit_codes(tmp_path, monkeypatch, capsys):
    paths = judge_kernels.write_variants(tmp_path, {"wrong_math"})
    wrong = _bench(str(paths["wrong_math"]), "--json", "--device", "cpu")  # a real worker, a real exit
    assert wrong.returncode == 1
    assert json.loads(wrong.stdout)["failed_stage"] == "smoke"
    code, _, err = _bench_here(monkeypatch, capsys, str(tmp_path / "nope.py"), "--json")
    assert code == 2 and "no such kernel file" in err
    unknown = tmp_path / "unknown.py"
    unknown.write_text("KERNEL_TYPE = 'conv9d'\nBACKEND = 'triton'\ndef kernel_fn(x):\n    return x\n")
    code, out, err = _bench_here(monkeypatch, capsys, str(unknown), "--json", "--device", "cpu")
    assert code == 2 and "unknown KERNEL_TYPE 'conv9d'" in err
    assert json.loads(out)["failed_stage"] == "compile"
    no_fn = tmp_path / "no_fn.py"
    no_fn.write_text("KERNEL_TYPE = 'softmax'\nBACKEND = 'triton'\n")
    assert _bench_here(monkeypatch, capsys, str(no_fn), "--device", "cpu")[0] == 2


def test_bench_table_labels_cpu_timing(monkeypatch, capsys):
    code, out, err = _bench_here(monkeypatch, capsys, str(GOOD / "softmax_rows.py"), "--device", "cpu")
    assert code == 0, out + err
    assert "PASS" in out and "CPU interpreter time" in out


def test_timeout_kills_the_whole_process_group(tmp_path):
    # a candidate cannot start processes past the static check; whatever runs in the child's group
    # (a compiler it started, a process reached some other way) still dies with it at the deadline
    from harness.isolation.process import run_isolated
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, pathlib, time\n"
              "p = subprocess.Popen(['sleep', '600'])\n"
              f"pathlib.Path({str(pid_file)!r}).write_text(str(p.pid))\n"
              "time.sleep(600)\n")
    child = run_isolated([sys.executable, "-c", script], timeout_s=2.5)  # a bare interpreter starts in a fraction of that, busy or not
    assert child.timed_out
    pid = int(pid_file.read_text())
    assert not still_alive([pid], timeout_s=10), "the child's own child outlived the timeout"


def test_worker_dies_with_a_killed_judge(tmp_path):
    """kill -9 of the judging process (e.g. of `autokernel optimize`) must not orphan its worker."""
    kernel = tmp_path / "hangs.py"
    kernel.write_text("KERNEL_TYPE = 'softmax'\nBACKEND = 'triton'\ndef kernel_fn(x):\n    while True:\n        pass\n")
    code = "import sys\nfrom harness.judge import judge\njudge(sys.argv[1], device='cpu', timeout_s=600)\n"
    # spawned (outside a session judge() would fork it from a zygote of its own: test_forkserver.py)
    parent = subprocess.Popen([sys.executable, "-c", code, str(kernel)],
                              env={**os.environ, "TMPDIR": killed_scratch(tmp_path), "AUTOKERNEL_JUDGE_FORK": "0"})
    try:
        deadline = time.time() + 60
        workers: list[int] = []
        while time.time() < deadline and not workers:
            time.sleep(0.5)
            workers = list(judge_workers(f"/{kernel.name}", parent=parent.pid))
        assert workers, "the worker never started"
    finally:
        parent.kill()
        parent.wait()
    assert not still_alive(workers, timeout_s=10)


def test_the_parent_rechecks_outputs_instead_of_trusting_the_worker(tmp_path):
    """A worker whose records claim success still fails when a saved output is wrong: the verdict
    comes from the judging process's own float64 recheck."""
    import torch

    from harness.correctness.cases import Capabilities, build_plan
    from harness.judge import child_env, read_events
    from harness.verdict.verdict_checks import assess
    out = tmp_path / "out"
    # TMPDIR as the judge sets it: the worker counts its temporary folder as the candidate's, and
    # /tmp itself would hold this checkout where it is cloned there
    subprocess.run([sys.executable, "-m", "harness.workers.worker", str(GOOD / "softmax_rows.py"), str(out),
                    "--device", "cpu"], env={**child_env("cpu"), "TMPDIR": str(tmp_path)}, check=True, timeout=300,
                   cwd=tmp_path)
    events, plan = read_events(out), build_plan("softmax", Capabilities("cpu", False))
    first = assess(events, out, plan, "cpu")
    assert first.verdict == "PASS", (first.failed_stage, first.stages, first.notes)
    record = [e for e in events if e.get("event") == "case" and e["stage"] == "shape_sweep"][3]
    saved = out / "tensors" / record["output"]
    tampered = torch.load(saved, weights_only=True)
    tampered.view(-1)[0] += 0.01
    torch.save(tampered, saved)
    again = assess(events, out, plan, "cpu")
    assert (again.verdict, again.failed_stage) == ("FAIL", "shape_sweep")
    assert "out of tolerance" in again.stages["shape_sweep"]["detail"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux's")
def test_behind_the_static_check_the_stages_catch_the_stateful_variants(tmp_path):
    """Keeping state is refused before import; with the check switched off, the determinism stage
    and the integrity checks (replay, an earlier output changed) must still catch each."""
    from judge_batch import judge_batch
    from harness.kernel_types.registry import Case
    paths = judge_kernels.write_variants(tmp_path, set(judge_kernels.RUN_TIME))
    verdicts = judge_batch(paths, Case.make("softmax", {"M": 4, "N": 64}, "float32", seed=7), static_check=False)
    words = {"jitter": "bitwise", "unordered_sum": "bitwise", "result_cache": "replay",
             "reused_output_buffer": "earlier output changed"}
    for name, want in judge_kernels.RUN_TIME.items():
        v = verdicts[name]
        assert (v["verdict"], v["failed_stage"]) == want, (name, _detail(v))
        assert words[name] in _detail(v), (name, _detail(v))
