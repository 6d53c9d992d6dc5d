"""False refusals of the closed surface: every honest kernel and ModelNew the project holds passes
the static check (tests/support/honest_kernels.py says which they are)."""
from __future__ import annotations

import pytest

from harness.isolation.static_check import check_source
from honest_kernels import count_by_kind, honest_kernels

HONEST = honest_kernels()


def test_the_corpus_covers_both_backends_and_modelnew():
    kinds = count_by_kind(HONEST)
    # the nine starters of each backend at least, and KernelBench's solutions with its few-shot example
    assert kinds["triton"] >= 9 and kinds["cuda"] >= 9 and kinds["model"] >= 4, kinds
    assert any("fewshot" in name for name in HONEST)


@pytest.mark.parametrize("name", sorted(HONEST))
def test_every_honest_kernel_is_accepted(name):
    text, backend, model = HONEST[name]
    refused = [v.text(name) for v in check_source(text, backend, model=model)]
    assert refused == []
