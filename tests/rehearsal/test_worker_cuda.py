"""The judge's worker, set up for a GPU, builds and loads each CUDA C++ starter's launch library
under the rules, up to the call that needs a device (tests/rehearsal/conftest.py)."""
from __future__ import annotations

import shutil

import pytest

from rehearsal import NEEDS_A_DEVICE, REFUSED, judge_worker, starters
from starter_kernels import starter_path


@pytest.mark.skipif(not shutil.which("nvcc"), reason="nvcc is not installed")
@pytest.mark.parametrize("kernel_type", starters("cuda"))
def test_every_cuda_starter_builds_and_loads_in_the_judges_worker_up_to_the_device(driver, tmp_path, kernel_type):
    """Compiled for the target, then the first call: nvcc builds the launch library under the rules
    (the build cache's lock included), it is loaded, and the call stops only at the device check."""
    result, _, stderr = judge_worker(driver, starter_path(kernel_type, "cuda"), tmp_path)
    compile_stage, first_call = result["calls"]
    assert compile_stage["error"] is None, compile_stage["error"][-3000:]
    assert first_call["error"] is not None and NEEDS_A_DEVICE in first_call["error"], first_call["error"]
    assert not any(word in stderr + first_call["error"] for word in REFUSED), first_call["error"][-3000:]
