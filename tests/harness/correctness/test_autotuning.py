"""@triton.autotune in the interpreter, run as a GPU runs it (harness/correctness/autotuning.py):
each config's kernel called on the launch's own arguments while it is benchmarked, hooks included;
the pick turning over the keys, so every config computes some outputs; a key seen before keeping
its config. The judge's verdicts on an autotuned kernel: tests/attacks/test_gpu_semantics.py."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from harness.correctness import autotuning, launches

CONFIGS = [triton.Config({"SCALE": s}) for s in (1, 2, 3)]


@triton.jit
def _scaled_add(out_ptr, x_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.atomic_add(out_ptr + offs, x * SCALE, mask=offs < n)


def _launches(kernel, sizes) -> list[float]:
    """What one launch leaves in an output of zeros, for each size in turn (each a key)."""
    left = []
    for n in sizes:
        out = torch.zeros(8)
        kernel[(1,)](out, torch.ones(8), n, BLOCK=8)
        assert torch.all(out[n:] == 0)
        left.append(out[0].item())
    return left


@pytest.fixture(autouse=True)
def _installed():
    launches.install()
    assert getattr(triton.runtime.autotuner.Autotuner._bench, "turns", False)


def test_each_config_runs_on_the_launchs_output_while_benchmarked_and_the_pick_turns():
    kernel = triton.autotune(configs=CONFIGS, key=["n"])(_scaled_add)
    benchmarked = autotuning.BENCH_CALLS * (1 + 2 + 3)  # every config, BENCH_CALLS times, adds into it
    # keys 4, 5, 6, 7 pick the first, second, third and first config again; key 4 again: its own pick,
    # nothing benchmarked
    assert _launches(kernel, [4, 5, 6, 7, 4]) == [benchmarked + 1, benchmarked + 2, benchmarked + 3, benchmarked + 1, 1]
    assert [c.kwargs["SCALE"] for c in kernel.cache.values()] == [1, 2, 3, 1]


def test_reset_to_zero_clears_the_output_before_every_call_as_on_a_gpu():
    kernel = triton.autotune(configs=CONFIGS, key=["n"], reset_to_zero=["out_ptr"])(_scaled_add)
    assert _launches(kernel, [4, 5, 6, 7]) == [1, 2, 3, 1]


def test_a_config_a_gpu_could_not_launch_is_never_picked():
    pruned = []

    def first_out(configs, named_args, **kwargs):
        pruned.append(len(configs))
        return configs[1:]  # as the judge's compile for the target leaves one out
    kernel = triton.autotune(configs=CONFIGS, key=["n"], reset_to_zero=["out_ptr"],
                             prune_configs_by={"early_config_prune": first_out})(_scaled_add)
    assert _launches(kernel, [4, 5, 6]) == [2, 2, 3] and pruned == [3, 3, 3]
