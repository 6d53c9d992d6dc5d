"""The chains' Triton starters (add+RMSNorm, SiLU x up, rotary on q and k, projection +
cross-entropy) judged as any starter is, forward and backward: a file of its own so that a second
test process judges them while tests/harness/test_starters_triton.py judges the single operators'
(their second CONFIGs are checked there, with the others')."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.judge import judge
from harness.workers.judge_session import judge_session
from starter_kernels import CHAIN_TYPES, starter_path
from starter_verdicts import assert_starter_passes

PARALLEL_JOBS = 2  # the CI machine has two cores


@pytest.fixture(scope="module")
def verdicts() -> dict:
    with judge_session(fork=True), ThreadPoolExecutor(PARALLEL_JOBS) as pool:
        futures = {t: pool.submit(judge, starter_path(t), device="cpu", backward=True) for t in CHAIN_TYPES}
        return {t: f.result() for t, f in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("kernel_type", CHAIN_TYPES)
def test_judge_passes_the_chain_starter_forward_and_backward(verdicts, kernel_type):
    assert_starter_passes(verdicts[kernel_type], kernel_type)
