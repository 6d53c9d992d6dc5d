"""The exported package's selftest runs confined: it reports the kernels' errors and the sandbox,
and a kernel that writes outside its scratch folder during the selftest is stopped."""
from __future__ import annotations

import pytest

from autokernel.deploy.export_check import selftest_confined
from harness.isolation.sandbox import abi_version

LANDLOCK = pytest.mark.skipif(abi_version() < 1, reason="Landlock is not available here")


def _package(root, body: str):
    package = root / "autokernel_kernels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("def selftest(device=None):\n" + body)
    return root


@LANDLOCK
def test_the_selftest_reports_errors_and_the_sandbox(tmp_path):
    parent = _package(tmp_path / "out", "    return {'softmax[8x32:float32]': 1e-7}\n")
    result = selftest_confined(parent, device="cpu")
    assert result["ok"] is True and result["errors"] == {"softmax[8x32:float32]": 1e-7}
    assert result["sandbox"]["kind"] == "landlock"


@LANDLOCK
def test_a_kernel_writing_outside_its_scratch_during_the_selftest_is_stopped(tmp_path):
    target = tmp_path / "records" / "leaderboard.tsv"
    target.parent.mkdir()
    parent = _package(tmp_path / "out", f"    open({str(target)!r}, 'w').write('forged')\n    return {{}}\n")
    result = selftest_confined(parent, device="cpu")
    assert result["ok"] is False and "Permission denied" in result["failure"]
    assert not target.exists()


def test_without_the_sandbox_the_same_write_lands_and_the_result_says_so(tmp_path):
    target = tmp_path / "written.txt"
    parent = _package(tmp_path / "out", f"    open({str(target)!r}, 'w').write('x')\n    return {{}}\n")
    result = selftest_confined(parent, device="cpu", sandbox=False)
    assert result["ok"] is True and target.read_text() == "x"
    assert result["sandbox"]["kind"] == "none"
