"""The judge's worker, set up for a GPU, builds and loads each CUDA C++ starter's launch library
under the rules, up to the call that needs a device (tests/rehearsal/conftest.py)."""
from __future__ import annotations

import shutil

import pytest

from rehearsal import NEEDS_A_DEVICE, REFUSED, forked_judge_workers, starters
from starter_kernels import starter_path


@pytest.fixture(scope="module")
def first_calls(driver, tmp_path_factory):
    """Each CUDA C++ starter in a worker of its own, forked from a process that preloaded what the
    judge's zygote does, as a judge session starts its workers."""
    return forked_judge_workers(driver, [starter_path(k, "cuda") for k in starters("cuda")],
                                tmp_path_factory.mktemp("first-calls"))


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed")
@pytest.mark.parametrize("kernel_type", starters("cuda"))
def test_every_cuda_starter_builds_and_loads_in_the_judges_worker_up_to_the_device(first_calls, kernel_type):
    """Compiled for the target, then the first call: nvcc builds the launch library under the rules
    (the build cache's lock included), it is loaded, and the call stops only at the device check."""
    result, _, stderr = first_calls[starter_path(kernel_type, "cuda").name]
    assert result["exit"] == 0 and "calls" in result, f"the worker did not finish:\n{stderr[-4000:]}"
    compile_stage, first_call = result["calls"]
    assert compile_stage["error"] is None, compile_stage["error"][-3000:]
    assert first_call["error"] is not None and NEEDS_A_DEVICE in first_call["error"], first_call["error"]
    assert not any(word in stderr + first_call["error"] for word in REFUSED), first_call["error"][-3000:]
