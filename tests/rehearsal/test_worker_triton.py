"""The judge's worker, set up for a GPU, makes each Triton starter's first launch through Triton's
real NVIDIA backend to the stand-in driver (tests/rehearsal/conftest.py says what is rehearsed)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import standin_gpu
from rehearsal import assert_launched, forked_judge_workers, judge_worker, starters
from starter_kernels import starter_path


@pytest.fixture(scope="module")
def first_launches(driver, tmp_path_factory):
    """Each Triton starter's first launch in a worker of its own, forked from a process that
    preloaded what the judge's zygote does, as a judge session starts its workers."""
    return forked_judge_workers(driver, [starter_path(k, "triton") for k in starters("triton")],
                                tmp_path_factory.mktemp("first-launches"))


@pytest.mark.parametrize("kernel_type", starters("triton"))
def test_every_triton_starter_first_launches_in_the_judges_worker(first_launches, kernel_type):
    result, launched, stderr = first_launches[starter_path(kernel_type, "triton").name]
    assert_launched(result, launched, stderr)


def test_a_gcc_outside_usr_builds_tritons_launcher_support_inside_the_sandbox(driver, tmp_path):
    """An H200 image keeps gcc in /opt/gcc: the sandbox must let the worker run a compiler from where
    it is installed (harness/isolation/sandbox.py, _compiler_roots). The worker is spawned, as
    without a zygote (AUTOKERNEL_JUDGE_FORK=0): Triton imported inside it, nothing preloaded."""
    elsewhere = standin_gpu.gcc_elsewhere(tmp_path / "opt")
    result, launched, stderr = judge_worker(driver, starter_path("softmax", "triton"), tmp_path / "judgement",
                                            path_first=elsewhere)
    assert_launched(result, launched, stderr)


TRITON36 = os.environ.get("AUTOKERNEL_TRITON36")
NO_TRITON36 = ("no Triton 3.6 named by AUTOKERNEL_TRITON36 (.ci/run installs one: "
               "pip install --no-deps --target DIR triton==3.6.0)")


@pytest.fixture(scope="module")
def first_launches_3_6(driver, tmp_path_factory):
    return forked_judge_workers(driver, [starter_path(k, "triton") for k in starters("triton")],
                                tmp_path_factory.mktemp("first-launches-3.6"), Path(TRITON36))


@pytest.mark.skipif(not TRITON36, reason=NO_TRITON36)
@pytest.mark.parametrize("kernel_type", starters("triton"))
def test_every_triton_starter_first_launches_under_triton_3_6(first_launches_3_6, kernel_type):
    """Triton 3.6, a GPU image's today: it also builds a launcher per kernel with gcc, at the first
    launch, under the rules."""
    result, launched, stderr = first_launches_3_6[starter_path(kernel_type, "triton").name]
    assert result["triton"].startswith("3.6"), result["triton"]
    assert_launched(result, launched, stderr)


@pytest.mark.skipif(not TRITON36, reason=NO_TRITON36)
def test_a_spawned_worker_first_launches_under_triton_3_6(driver, tmp_path):
    """A worker spawned, not forked (AUTOKERNEL_JUDGE_FORK=0, or a zygote that failed): Triton's
    imports and its version key happen inside the process, after nothing preloaded them (the
    venv's Triton is spawned by the test of gcc outside /usr above)."""
    result, launched, stderr = judge_worker(driver, starter_path("softmax", "triton"), tmp_path, Path(TRITON36))
    assert result["triton"].startswith("3.6"), result["triton"]
    assert_launched(result, launched, stderr)
