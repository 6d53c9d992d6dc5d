"""compute-sanitizer's output read as the judge reads it (harness/verdict/sanitizer.py): a clean run,
a memcheck out-of-bounds store, a racecheck hazard, warnings alone, a tool that did not finish; the
command it builds; skipped cleanly where the tool is missing; and on a GPU the real tool catching
the attack suite's out-of-bounds store while the softmax starter is clean."""
from __future__ import annotations

import json
import sys

import pytest

from harness.verdict import sanitizer
from harness.kernel_types.registry import Case
from paths import ROOT

CLEAN = """========= COMPUTE-SANITIZER
sanitize: returned softmax.py
========= ERROR SUMMARY: 0 errors
"""

OUT_OF_BOUNDS = """========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at _softmax_rows+0x3d0 in /tmp/ak-judge-x/src/candidate.py:25
=========     by thread (31,0,0) in block (63,0,0)
=========     Address 0x7f3c42e0fa00 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3c42e00000 of size 256000 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernelEx [0x2b3a1f] in libcuda.so.1
=========         Host Frame: launch [0x1b2c] in __triton_launcher.so
=========
sanitize: returned stores_past_the_end.py
========= ERROR SUMMARY: 1 error
"""

RACE = """========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at block_sum(const float *, float *, int)+0x1f0 in reduce.cu:31
=========     and Read access at block_sum(const float *, float *, int)+0x2a0 in reduce.cu:35 [96 hazards]
=========
========= Warning: Race reported between Read access at block_sum(const float *, float *, int)+0x300
=========     and Write access at block_sum(const float *, float *, int)+0x310 [4 hazards]
=========
sanitize: returned reduce.py
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""

WARNINGS_ONLY = """========= COMPUTE-SANITIZER
========= Warning: Race reported between Read access at warp_reduce(float)+0x70
=========     and Write access at warp_reduce(float)+0x90 [4 hazards]
=========
sanitize: returned softmax.py
========= RACECHECK SUMMARY: 1 hazard displayed (0 errors, 1 warning)
"""

NO_RUN = """========= COMPUTE-SANITIZER
========= Error: Target application returned an error
Traceback (most recent call last):
RuntimeError: No CUDA GPUs are available
"""


def test_a_clean_run_is_clean():
    report = sanitizer.parse(CLEAN, "memcheck")
    assert (report.errors, report.findings, report.returned) == (0, [], ["softmax.py"])
    record = sanitizer.outcome(report, 0, False, CLEAN, 1)
    assert record["status"] == "clean" and record["detail"] == "compute-sanitizer memcheck: 0 errors"


def test_an_out_of_bounds_store_fails_in_the_tools_words():
    report = sanitizer.parse(OUT_OF_BOUNDS, "memcheck")
    assert report.errors == 1 and len(report.findings) == 1
    words = report.findings[0]
    assert words.startswith("Invalid __global__ write of size 4 bytes; at _softmax_rows+0x3d0")
    assert "is 1 bytes after the nearest allocation" in words and "Host Frame" not in words
    record = sanitizer.outcome(report, sanitizer.ERROR_EXIT, False, OUT_OF_BOUNDS, 1)
    assert record["status"] == "finding"
    assert record["detail"].startswith("compute-sanitizer memcheck found 1 error(s): Invalid __global__ write")


def test_a_shared_memory_race_fails_and_its_warnings_come_after_its_errors():
    report = sanitizer.parse(RACE, "racecheck")
    assert (report.errors, report.warnings) == (1, 1)
    assert report.findings[0].startswith("Error: Race reported between Write access at block_sum")
    assert "[96 hazards]" in report.findings[0] and report.findings[1].startswith("Warning:")
    assert sanitizer.outcome(report, sanitizer.ERROR_EXIT, False, RACE, 1)["status"] == "finding"


def test_warnings_alone_are_noted_not_failed():
    report = sanitizer.parse(WARNINGS_ONLY, "racecheck")
    record = sanitizer.outcome(report, 0, False, WARNINGS_ONLY, 1)
    assert record["status"] == "clean" and "1 warning(s): Warning: Race reported" in record["detail"]


def test_a_run_the_tool_did_not_finish_is_a_failure_to_check_not_a_finding():
    report = sanitizer.parse(NO_RUN, "memcheck")
    assert report.errors is None and report.problem() is None
    record = sanitizer.outcome(report, 1, False, NO_RUN, 1)
    assert record["status"] == "failed" and "No CUDA GPUs are available" in record["detail"]
    cut = sanitizer.outcome(sanitizer.parse(CLEAN, "memcheck"), 0, False, CLEAN, 2)  # one of two never returned
    assert cut["status"] == "failed"


def test_the_command_runs_the_child_under_the_tool_with_the_allocator_off():
    cmd = sanitizer.command("/opt/cuda/bin/compute-sanitizer", "racecheck", ["k.py", "{}"], python="py")
    assert cmd[:3] == ["/opt/cuda/bin/compute-sanitizer", "--tool", "racecheck"]
    assert cmd[cmd.index("--error-exitcode") + 1] == str(sanitizer.ERROR_EXIT)
    assert cmd[-5:] == ["py", "-m", "harness.workers.sanitize_child", "k.py", "{}"]
    assert sanitizer.child_env({"A": "1"}) == {"A": "1", "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    with pytest.raises(ValueError, match="use one of memcheck, racecheck"):
        sanitizer.command("cs", "leakcheck", [])


def test_without_the_tool_the_check_is_skipped_and_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(sanitizer, "executable", lambda: None)
    record = sanitizer.check(tmp_path / "k.py", {}, {}, 10.0)
    assert record["problem"] is None
    assert [record[t]["status"] for t in sanitizer.TOOLS] == ["skipped", "skipped"]
    assert record["memcheck"]["detail"] == "compute-sanitizer is not installed here"


@pytest.mark.gpu
def test_on_a_gpu_the_tool_catches_a_store_past_the_end_and_passes_the_starter(tmp_path):
    if sanitizer.executable() is None:
        pytest.skip("compute-sanitizer is not installed on this GPU machine")
    sys.path.insert(0, str(ROOT / "tests" / "attacks"))
    import gpu_semantics_kernels
    bad = tmp_path / "stores_past_the_end.py"
    bad.write_text(gpu_semantics_kernels.STORES_PAST_THE_END)
    case = Case.make("softmax", {"M": 64, "N": 1000}, "float32").to_json()
    from harness.isolation.process import child_env
    caught = sanitizer.run("memcheck", [(str(bad), case)], child_env("cuda"), 300)
    assert caught["status"] == "finding" and "Invalid __global__ write" in caught["detail"], json.dumps(caught)
    clean = sanitizer.run("memcheck", [(str(ROOT / "starter_kernels/triton/softmax.py"), case)], child_env("cuda"), 300)
    assert clean["status"] == "clean", json.dumps(clean)


def test_the_child_runs_each_kernel_once_confined_and_says_it_returned(tmp_path):
    """What the tool watches, run here without it (the CPU's interpreter for the GPU): confined as
    the judge's worker, the starter's kernel_fn called at its case; its line is what the parser reads."""
    import subprocess
    from harness.isolation.process import child_env
    scratch = tmp_path / "scratch"
    (scratch / "cwd").mkdir(parents=True)
    case = json.dumps(Case.make("softmax", {"M": 4, "N": 100}, "float32").to_json())
    starter = scratch / "src" / "softmax.py"  # the judge's own copy, in its scratch folder, as judged
    starter.parent.mkdir()
    starter.write_text((ROOT / "starter_kernels" / "triton" / "softmax.py").read_text())
    proc = subprocess.run([sys.executable, "-m", "harness.workers.sanitize_child", str(starter), case, "--device", "cpu",
                           "--sandbox-write", str(scratch)], env={**child_env("cpu"), "TMPDIR": str(scratch)},
                          cwd=scratch / "cwd", capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sanitizer.parse(proc.stdout + "========= ERROR SUMMARY: 0 errors\n", "memcheck").returned == ["softmax.py"]
    # confined: the project's own folder is not readable from it
    outside = subprocess.run([sys.executable, "-m", "harness.workers.sanitize_child",
                              str(ROOT / "starter_kernels" / "triton" / "softmax.py"), case, "--device", "cpu",
                              "--sandbox-write", str(scratch)], env={**child_env("cpu"), "TMPDIR": str(scratch)},
                             cwd=scratch / "cwd", capture_output=True, text=True, timeout=300)
    assert outside.returncode != 0 and "Permission denied" in outside.stderr
