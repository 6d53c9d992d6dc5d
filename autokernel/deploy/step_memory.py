"""A training step's peak memory, on the CPU too: what verify --train reports for the step with and
without the winners (a fused projection + loss never holds the logits), and what
benchmarks/fused_loss_memory.py measures by hand.

- `allocator_peak_bytes`: torch.profiler's memory events (profile_memory=True) record every
  allocation and free of PyTorch's CPU allocator during the step (forward, loss, backward,
  optimizer step); the most held at once above what was held when the step began. There is no
  torch.cuda.max_memory_allocated on the CPU; this is its counterpart for the step.
- `held_before_bytes`: what lives before the step (the weights, the optimizer's state), counted
  from the tensors (each storage once). `peak_bytes` is the two together.
- `cuda_max_memory_allocated`: on a GPU, torch.cuda.max_memory_allocated over the same step, its
  peak statistics reset when the step begins (None on the CPU).

What the allocator does not see (the Triton interpreter's numpy copies of a kernel's arguments on
the CPU) is not counted: the figures are PyTorch's tensors, as a GPU's allocator figure is.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable

HOW = ("peak_bytes = held_before_bytes (weights and optimizer state, counted from the tensors) + "
       "allocator_peak_bytes (torch.profiler memory events: the most PyTorch's CPU allocator held at once during one "
       "step above what it held when the step began); cuda_max_memory_allocated: torch.cuda.max_memory_allocated "
       "over the same step, on a GPU")


def held_bytes(tensors: Iterable[Any]) -> int:
    """The bytes of the storages behind `tensors`, each storage once."""
    seen, total = set(), 0
    for t in tensors:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def trained_tensors(model: Any, optimizer: Any) -> list:
    """The model's parameters and the optimizer's state tensors: what lives across steps."""
    import torch
    state = [t for s in getattr(optimizer, "state", {}).values() for t in s.values() if isinstance(t, torch.Tensor)]
    return list(model.parameters()) + state


def measure_step(step: Callable[[], Any], held_before: int, on_gpu: bool) -> tuple[Any, dict]:
    """Run `step()` once under the allocator's memory events; (its result, the figures)."""
    import torch
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    from autokernel.profile.profiler import without_profiler_chatter  # kineto's 'USDT: profiler_start' lines
    with without_profiler_chatter(), \
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        result = step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU)
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    cuda = None
    if on_gpu:
        torch.cuda.synchronize()
        cuda = torch.cuda.max_memory_allocated()
    return result, {"held_before_bytes": held_before, "allocator_peak_bytes": peak, "peak_bytes": held_before + peak,
                    "memory_events": len(events), "cuda_max_memory_allocated": cuda}


def compared(eager: dict, patched: dict) -> dict:
    """verify.json's `train.memory`: both steps' figures and the ratios (patched over eager)."""
    def ratio(key: str) -> Any:
        a, b = patched.get(key), eager.get(key)
        return a / b if a is not None and b else None
    return {"eager": eager, "patched": patched, "patched_over_eager_peak": ratio("peak_bytes"),
            "patched_over_eager_allocator_peak": ratio("allocator_peak_bytes"),
            "patched_over_eager_cuda_peak": ratio("cuda_max_memory_allocated"), "how": HOW}
