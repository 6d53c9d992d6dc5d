"""Where a model's time goes, by kernel type, measured.

torch.profiler records every aten op with its input shapes and dtypes; forward hooks open a
record_function range around each module call, so every op knows the module it ran in. The ops, on
every device, come from these CPU-side records; each op's own time is its self CPU time on a CPU,
and on a GPU the time of the device kernels it launched, joined to it by correlation id
(autokernel.profile.records). That time is attributed exactly once, to a kernel type, a module
target or `other` (autokernel.profile.attribution).
"""
from __future__ import annotations

import functools
import os
import re
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.autograd.profiler import record_function

from autokernel.profile import chain_graph, chain_plan, generic_chains, module_targets, training
from autokernel.profile.attribution import ROOT, _best_us, attribute, dims_of, optimizer_ms  # noqa: F401
from autokernel.profile.records import from_kineto
from harness.kernel_types import registry


@dataclass
class Profile:
    device: str
    device_name: str
    dtype: str
    total_ms: float  # op time of one forward (and its backward, in training): the sum of the groups
    forward_ms: float  # wall time of one plain forward, or training step (median of forward_samples_ms)
    profiled_forward_ms: float  # the same under the profiler and module hooks (median)
    iters: int
    warmup: int
    groups: list[dict]  # kernel_type, op, shapes, dtype, dims, target, route, calls, time_ms, share,
    # modules, ops; causal (attention), parts (recognised forms), other_ops (other); module, flops, bytes,
    # work ("counted" or "floor"), work_note, and where they ran products or data-dependent shapes,
    # matmuls and data_dependent (module targets)
    module_inputs: dict = field(default_factory=dict)  # qualified name -> what its first call took
    # a training step's: its loss (step), optimizer and optimizer_ms (timed apart, no group's), last loss
    train: Optional[dict] = None
    # runs of ops whose intermediates go only to the next (autokernel.profile.chain_plan.entries)
    chains: dict = field(default_factory=dict)

    forward_samples_ms: list[float] = field(default_factory=list)  # raw, unrounded
    profiled_samples_ms: list[float] = field(default_factory=list)

    @property
    def coverage(self) -> float:
        """The share of the time in typed or module targets."""
        return sum(g["share"] for g in self.groups if g["kernel_type"] != "other")

    @property
    def typed_coverage(self) -> float:
        """The share of the time in the nine kernel types alone."""
        return sum(g["share"] for g in self.groups if g["kernel_type"] not in ("other", module_targets.KERNEL_TYPE))


# ---------------------------------------------------------------- measuring
def profile_model(loaded: Any, iters: int = 10, warmup: int = 3, seed: int = 0,
                  trace_path: Optional[str] = None, records_path: Optional[str] = None) -> Profile:
    """Profile `iters` forwards of a modelfile.LoadedModel after `warmup` plain ones, or, when it is
    profiled for training (`loaded.training`), as many training steps (forward, loss, backward,
    optimizer step; at least one warm-up: the optimizer makes its state on its first step).
    `records_path` keeps the raw op and kernel records (JSON) for attributing them again elsewhere."""
    device = loaded.spec.device
    inputs = loaded.make_inputs(seed)
    modules = dict(loaded.model.named_modules())
    # what each module is called with, captured outside the profiler (its ops would be timed)
    module_inputs = module_targets.capture_inputs(loaded.model, lambda: loaded.forward(inputs))
    with (training.training(loaded, inputs) if loaded.training else nullcontext()) as step:
        if step is not None:
            warmup = max(warmup, 1)
            run = functools.partial(step.run, inputs)
        else:
            run = functools.partial(_forward, loaded, inputs)
        for _ in range(warmup):
            run(False)
        plain_s = [_timed(run, device, False) for _ in range(3)]
        prof, profiled_s = _profiled(run, device, modules, iters)
        graph = _graph(loaded, inputs, step)
    if trace_path:
        prof.export_chrome_trace(str(trace_path))
    records = from_kineto(prof.profiler.kineto_results, device)
    if records_path:
        records.save(records_path)
    groups = attribute(records, modules, module_inputs, _model_dtype(loaded.model))
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"
    train = None if step is None else {"step": step.how, "optimizer": step.optimizer_name,
                                       "optimizer_ms": optimizer_ms(records), "loss": step.last_loss}
    total_ms = sum(g["time_ms"] for g in groups)
    found, rejected = generic_chains.find_all(graph)
    return Profile(device=device, device_name=name, dtype=_model_dtype(loaded.model),
                   chains=chain_plan.entries(graph, found, rejected, records, total_ms), total_ms=total_ms, forward_ms=statistics.median(plain_s) * 1e3,
                   profiled_forward_ms=statistics.median(profiled_s) * 1e3, iters=iters, warmup=warmup,
                   groups=groups, module_inputs=module_inputs, train=train,
                   forward_samples_ms=[t * 1e3 for t in plain_s], profiled_samples_ms=[t * 1e3 for t in profiled_s])


def _graph(loaded: Any, inputs: list, step: Any) -> chain_graph.OpGraph:
    """The step's data-flow graph (the forward, and the loss when training), for finding chains;
    without gradients, so nothing is kept for a backward that never runs."""
    with torch.no_grad():
        if step is not None:
            return chain_graph.capture(loaded.model, lambda: step.loss(inputs))
        return chain_graph.capture(loaded.model, lambda: loaded.forward(inputs))


def _forward(loaded: Any, inputs: list, ranged: bool) -> None:
    with training.profiled_range(ROOT, ranged):
        loaded.forward(inputs)


def _profiled(run: Callable[[bool], None], device: str, modules: dict, iters: int) -> tuple[Any, list[float]]:
    """`iters` runs under the profiler, each module call in a range of its own."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    handles = _hook_modules(modules)
    try:
        with without_profiler_chatter(), torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            profiled_s = [_timed(run, device, True) for _ in range(iters)]
    finally:
        for h in handles:
            h.remove()
    return prof, profiled_s


# What torch's profiler library (kineto) prints on every start and stop, straight to fd 2.
PROFILER_CHATTER = re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\] ")


@contextmanager
def without_profiler_chatter():
    """Hold the process's stderr while the profiler runs and pass on every line but kineto's
    'USDT: ... profiler_start' chatter: its errors (CUPTI's among them) and the model's own output
    still reach the terminal, after the profile."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr to hold
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode("utf-8", "replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not PROFILER_CHATTER.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


def _timed(run: Callable[[bool], None], device: str, ranged: bool) -> float:
    t0 = time.perf_counter()
    run(ranged)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _hook_modules(modules: dict[str, torch.nn.Module]) -> list:
    """A record_function range around every module call, named after the module: the profiler
    then knows which module each op ran in (with_modules only does this for TorchScript)."""
    names = {id(m): f"module::{q or '<root>'}::{type(m).__name__}" for q, m in modules.items()}
    stack: list = []

    def enter(module, args):
        rf = record_function(names[id(module)])
        rf.__enter__()
        stack.append(rf)

    def leave(module, args, output):
        stack.pop().__exit__(None, None, None)

    handles = []
    for m in modules.values():
        handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    return handles


def _model_dtype(model: torch.nn.Module) -> str:
    dtypes = [p.dtype for p in model.parameters() if p.is_floating_point()]
    return registry.DTYPE_NAMES.get(max(set(dtypes), key=dtypes.count), "float32") if dtypes else "float32"


