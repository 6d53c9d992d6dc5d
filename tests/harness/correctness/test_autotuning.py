"""@triton.autotune under the interpreter (harness/correctness/autotuning.py): a launch of an autotune
over several configs fails saying why and what to do, however pruning would leave them, and a
kernel_fn that catches the refusal still fails its checked call; one config runs as Triton runs it.
The judge's verdicts on such kernels: tests/attacks/test_gpu_semantics.py."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

from harness.correctness import autotuning, launches
from harness.correctness.candidate import observed_call

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
def monitor():
    """The process's launch monitor, its refusal cleared after each test: it stands for the rest of
    a judged process, and this one runs other tests."""
    monitor = launches.install()
    assert getattr(Autotuner.run, "refuses", False) and monitor.refused is None
    yield monitor
    monitor.refused = None


def test_a_launch_of_several_configs_fails_saying_what_to_do_however_pruning_would_leave_them(monitor):
    kernel = triton.autotune(configs=CONFIGS, key=["n"])(_scaled)
    with pytest.raises(autotuning.AutotuneNotJudged, match=r"over 3 configs \(_scaled\).*one config \(CONFIG"):
        _launch(kernel)
    # Triton 3.9 would run a sole survivor unbenchmarked, 3.6 (a GPU image's) benchmarks it
    pruned = triton.autotune(configs=CONFIGS, key=["n"],
                             prune_configs_by={"early_config_prune": lambda configs, named_args, **kw: configs[2:]})(_scaled)
    with pytest.raises(autotuning.AutotuneNotJudged, match=r"over 3 configs"):
        _launch(pruned)


def test_one_config_runs_as_triton_runs_it(monitor):
    one = triton.autotune(configs=CONFIGS[1:2], key=["n"])(_scaled)
    assert _launch(one).tolist() == [2.0] * 5 + [0.0] * 3
    assert monitor.refused is None


def test_a_refusal_the_candidate_catches_still_fails_its_call_and_every_call_after(monitor):
    tuned = triton.autotune(configs=CONFIGS, key=["n"])(_scaled)
    one = triton.autotune(configs=CONFIGS[:1], key=["n"])(_scaled)

    def kernel_fn(x):  # the autotuned kernel where it runs, a plain one where it is refused
        out = torch.empty_like(x)
        try:
            tuned[(1,)](out, x, x.numel(), BLOCK=8)
        except RuntimeError:
            one[(1,)](out, x, x.numel(), BLOCK=8)
        return out

    first = observed_call(kernel_fn, [torch.ones(8)], {}, monitor)
    assert "AutotuneNotJudged (caught by the candidate; it stands): @triton.autotune over 3 configs" in first.error
    later = observed_call(lambda x: _launch(one), [torch.ones(8)], {}, monitor)
    assert "AutotuneNotJudged" in (later.error or "")
