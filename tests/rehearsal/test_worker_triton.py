"""The judge's worker, set up for a GPU, makes each Triton starter's first launch through Triton's
real NVIDIA backend to the stand-in driver (tests/rehearsal/conftest.py says what is rehearsed)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import standin_gpu
from rehearsal import assert_launched, judge_worker, starters
from starter_kernels import starter_path


@pytest.mark.parametrize("kernel_type", starters("triton"))
def test_every_triton_starter_first_launches_in_the_judges_worker(driver, tmp_path, kernel_type):
    result, launched, stderr = judge_worker(driver, starter_path(kernel_type, "triton"), tmp_path)
    assert_launched(result, launched, stderr)


def test_a_gcc_outside_usr_builds_tritons_launcher_support_inside_the_sandbox(driver, tmp_path):
    """An H200 image keeps gcc in /opt/gcc: the sandbox must let the worker run a compiler from where
    it is installed (harness/isolation/sandbox.py, _compiler_roots)."""
    elsewhere = standin_gpu.gcc_elsewhere(tmp_path / "opt")
    result, launched, stderr = judge_worker(driver, starter_path("softmax", "triton"), tmp_path / "judgement",
                                            path_first=elsewhere)
    assert_launched(result, launched, stderr)


TRITON36 = os.environ.get("AUTOKERNEL_TRITON36")
NO_TRITON36 = ("no Triton 3.6 named by AUTOKERNEL_TRITON36 (.ci/run installs one: "
               "pip install --no-deps --target DIR triton==3.6.0)")


@pytest.mark.skipif(not TRITON36, reason=NO_TRITON36)
@pytest.mark.parametrize("kernel_type", starters("triton"))
def test_every_triton_starter_first_launches_under_triton_3_6(driver, tmp_path, kernel_type):
    """Triton 3.6, a GPU image's today: it also builds a launcher per kernel with gcc, at the first
    launch, under the rules."""
    result, launched, stderr = judge_worker(driver, starter_path(kernel_type, "triton"), tmp_path, Path(TRITON36))
    assert result["triton"].startswith("3.6"), result["triton"]
    assert_launched(result, launched, stderr)
