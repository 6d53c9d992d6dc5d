"""The fused final projection + cross-entropy in a training step, called by hand and served by the
router in the unmodified model's own loss: the same losses as eager, and a peak that never holds
the logits (measured on the CPU from PyTorch's allocator events)."""
import importlib.util

import pytest

from paths import ROOT


def _script():
    spec = importlib.util.spec_from_file_location("fused_loss_memory", ROOT / "benchmarks" / "fused_loss_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fused_loss_trains_as_eager_does_without_ever_holding_the_logits():
    pytest.importorskip("transformers")
    result = _script().run_all(batch=2, tokens=32, vocab=1000, hidden=32, layers=1,
                               modes=("eager", "fused", "served"))
    eager, fused, served = result["eager"], result["fused"], result["served"]
    # two AdamW steps: the second loss is after an update, so the gradients agreed too
    assert fused["losses"] == pytest.approx(eager["losses"], rel=1e-5)
    assert fused["held_before_bytes"] == eager["held_before_bytes"]
    assert eager["memory_events"] > 0 and fused["memory_events"] > 0
    # eager holds a whole fp32 logits tensor at least (and its log-softmax, and their gradient) more
    assert fused["allocator_peak_bytes"] + eager["logits_bytes"] <= eager["allocator_peak_bytes"], result
    assert result["fused_over_eager_peak"] < 1.0
    # the unmodified model's own loss with labels, the router serving the fused loss: the same
    # losses, the same saving, and the call counted as served
    assert served["losses"] == pytest.approx(eager["losses"], rel=1e-5)
    assert served["allocator_peak_bytes"] + eager["logits_bytes"] <= eager["allocator_peak_bytes"], result
    (kernel,) = served["served"].values()
    assert kernel["calls_served"] == 2 and kernel["fallbacks"] == 0, kernel


def test_measuring_a_step_prints_none_of_the_profilers_chatter_and_keeps_the_steps_own_output(capfd):
    """verify --train measures each step's memory under torch's profiler, whose library prints
    'USDT: ... profiler_start' lines on every start and stop; the step's own output still shows."""
    import sys
    import torch
    from autokernel.deploy.step_memory import measure_step

    def step():
        print("the step's own warning", file=sys.stderr)
        return torch.ones(1024).sum()

    result, figures = measure_step(step, held_before=0, on_gpu=False)
    err = capfd.readouterr().err
    assert result.item() == 1024 and figures["memory_events"] > 0
    assert "the step's own warning" in err and "USDT" not in err and "profiler_start" not in err


def test_on_a_gpu_the_step_reports_torch_cuda_max_memory_allocated_over_that_step_alone(monkeypatch):
    """The GPU's figure beside the allocator's: its peak statistics reset once the queue is empty,
    before the step, and read after the step's work has finished, then carried into verify.json's
    ratio and report.md's sentence. torch.cuda stands in here (no GPU on this machine), recording
    the order of the calls: a reset after the step, or a read before it, fails."""
    import torch
    from autokernel.deploy.step_memory import compared, measure_step
    from autokernel.deploy.verify_report import memory_words

    calls: list = []
    peaks = iter([3 * 2**20, 2**20])  # eager's step, then the fused one
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: calls.append("read") or next(peaks))

    def step():
        calls.append("step")
        return torch.ones(256).sum()

    _, eager = measure_step(step, held_before=10, on_gpu=True)
    assert calls == ["synchronize", "reset", "step", "synchronize", "read"]
    _, fused = measure_step(step, held_before=10, on_gpu=True)
    assert (eager["cuda_max_memory_allocated"], fused["cuda_max_memory_allocated"]) == (3 * 2**20, 2**20)
    memory = compared(eager, fused)
    assert memory["patched_over_eager_cuda_peak"] == pytest.approx(1 / 3)
    words = memory_words({"memory": memory})
    assert ("torch.cuda.max_memory_allocated over the step: eager 3.00 MiB, with the winners 1.00 MiB, "
            "0.333 of eager's") in words
    # on the CPU no GPU figure, and no sentence for one
    _, cpu = measure_step(step, held_before=10, on_gpu=False)
    assert cpu["cuda_max_memory_allocated"] is None
    assert "cuda" not in memory_words({"memory": compared(cpu, cpu)})
