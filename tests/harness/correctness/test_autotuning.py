"""@triton.autotune under the interpreter (harness/correctness/autotuning.py): a launch that would
benchmark several configs fails saying why and what to do; one config, or configs pruned to one, run
as Triton runs them. The judge's verdict on one: tests/attacks/test_gpu_semantics.py."""
from __future__ import annotations

import inspect

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

from harness.correctness import autotuning, launches

CONFIGS = [triton.Config({"SCALE": s}) for s in (1, 2, 3)]


@triton.jit
def _scaled(out_ptr, x_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * SCALE, mask=offs < n)


def _launch(kernel, n: int = 5) -> torch.Tensor:
    out = torch.zeros(8)
    kernel[(1,)](out, torch.ones(8), n, BLOCK=8)
    return out


@pytest.fixture(autouse=True)
def _installed():
    launches.install()
    assert getattr(triton.runtime.autotuner.Autotuner._bench, "refuses", False)


def test_a_launch_that_would_benchmark_several_configs_fails_saying_what_to_do():
    kernel = triton.autotune(configs=CONFIGS, key=["n"])(_scaled)
    with pytest.raises(autotuning.AutotuneNotJudged, match=r"over 3 configs \(_scaled\).*one config \(CONFIG"):
        _launch(kernel)


def test_one_config_runs_as_triton_runs_it_and_one_left_by_pruning_where_triton_would_not_benchmark_it():
    one = triton.autotune(configs=CONFIGS[1:2], key=["n"])(_scaled)
    assert _launch(one).tolist() == [2.0] * 5 + [0.0] * 3
    pruned = triton.autotune(configs=CONFIGS, key=["n"],
                             prune_configs_by={"early_config_prune": lambda configs, named_args, **kw: configs[2:]})(_scaled)
    if "len(pruned_configs) == 1" in inspect.getsource(Autotuner.run):  # this Triton runs a sole survivor as is
        assert _launch(pruned).tolist() == [3.0] * 5 + [0.0] * 3
    else:  # it benchmarks it: its calls would leave in the arguments what the judge cannot count
        with pytest.raises(autotuning.AutotuneNotJudged):
            _launch(pruned)
