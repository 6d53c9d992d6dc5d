"""One fine-tuning run of a loaded model, eager or with winners patched in (and compiled): what
verify --train compares (verify_train.py) and times (train_figures.py).

`steps` optimizer steps of the model file's training step (autokernel/profile/training.py), step i
on the inputs of seed i, from the model's weights as found, under RNG seed 0, with a fresh
optimizer; the model is left as it was found. A `Workload` may give other inputs, its own loss and
weights set before the first step (verify --train's second workload: train_workload.py). Kept per
run: the loss per step, every parameter's gradient after the first backward and its dtype, every
parameter's change over the run, each step's wall time, peak memory on a GPU, and what the
winners served (the router's tally).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional


@dataclass
class Workload:
    """What a run steps on, where it is not the model file's own step at its profiled inputs."""

    name: str
    inputs: Callable[[int], list]  # seed -> the inputs of that step
    loss: Optional[Callable[[Any, list], Any]] = None  # (model, inputs) -> the scalar loss; None: the file's step
    how: str = ""  # the loss in words, when it is the workload's own
    prepare: Optional[Callable[[Any], None]] = None  # sets weights before the first step (the model is restored after)


@dataclass
class Trajectory:
    """One fine-tuning run: the loss per step, the first step's gradients, the parameters' change,
    the wall time of each step, peak memory (GPU) and what the winners served."""

    losses: list = field(default_factory=list)
    grads: dict = field(default_factory=dict)
    dtypes: dict = field(default_factory=dict)  # parameter name -> its dtype's name
    change: dict = field(default_factory=dict)  # parameter name -> end minus start
    step_s: list = field(default_factory=list)
    peak_bytes: Optional[int] = None
    step_memory: Optional[dict] = None  # one step's peak memory (step_memory.py), when asked for
    tally: Optional[dict] = None
    error: str = ""  # what raised, when the run could not finish
    how: str = ""
    optimizer: str = ""


def fine_tune(loaded: Any, winners: Optional[list], steps: int, compiled: bool = False,
              catch: bool = False, workload: Optional[Workload] = None, memory: bool = False) -> Trajectory:
    """`steps` training steps of `loaded` (with `winners` patched in, when given; on `workload`, when
    given); the model is left as it was found. `catch`: an error becomes Trajectory.error (a
    winner's) instead of raising. `memory`: the peak memory of the second step (the first, when
    there is one step), after the optimizer made its state, into Trajectory.step_memory."""
    import torch
    from autokernel.deploy import routing
    from autokernel.profile.training import training
    batches = [(workload.inputs if workload else loaded.make_inputs)(seed) for seed in range(steps)]
    router = routing.Router(winners) if winners is not None else None
    run = Trajectory()
    on_gpu = loaded.spec.device.startswith("cuda")
    with torch.random.fork_rng(devices=[torch.device(loaded.spec.device)] if on_gpu else []):
        torch.manual_seed(0)  # dropout and anything random in the step: the same in every run
        with training(loaded, batches[0]) as step:
            if workload is not None and workload.loss is not None:
                own = workload.loss
                step.loss, step.how = (lambda xs: own(loaded.model, xs)), workload.how
            if workload is not None and workload.prepare is not None:
                with torch.no_grad():
                    workload.prepare(loaded.model)
            run.how, run.optimizer = step.how, step.optimizer_name
            start = {n: p.detach().clone() for n, p in loaded.model.named_parameters() if p.requires_grad}
            run.dtypes = {n: str(p.dtype).replace("torch.", "") for n, p in loaded.model.named_parameters()}
            try:
                with router.patched(loaded.model) if router else contextlib.nullcontext():
                    with _compiled(loaded, step, batches[0], compiled):
                        _steps(loaded, step, batches, run, on_gpu, memory)
            except Exception as e:  # noqa: BLE001 (a winner's error is a finding, not a crash)
                if not catch:
                    raise
                run.error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            params = dict(loaded.model.named_parameters())
            run.change = {n: (params[n].detach() - p0).double() for n, p0 in start.items()}
    run.tally = router.tally.to_json() if router else None
    return run


def _steps(loaded: Any, step: Any, batches: list, run: Trajectory, on_gpu: bool, memory: bool = False) -> None:
    import torch
    from autokernel.deploy import step_memory
    from autokernel.profile.modelfile import _in_user_code
    from autokernel.profile.training import checked_loss
    path = loaded.spec.path
    measured = min(1, len(batches) - 1) if memory else -1
    peak = 0

    def one(i: int, inputs: list) -> Any:
        loss = checked_loss(_in_user_code(path, step.how, lambda: step.loss(inputs)), step.how, path)
        _in_user_code(path, "the backward of the loss", loss.backward)
        if i == 0:
            run.grads = {n: p.grad.detach().double().clone() for n, p in loaded.model.named_parameters()
                         if p.grad is not None}
        _in_user_code(path, f"{step.optimizer_name}.step()", step.optimizer.step)
        step.optimizer.zero_grad(set_to_none=True)
        return loss
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    for i, inputs in enumerate(batches):
        began = time.perf_counter()
        if i == measured:  # its own peak statistics: the run's peak so far is kept apart
            peak = max(peak, torch.cuda.max_memory_allocated()) if on_gpu else 0
            held = step_memory.held_bytes(step_memory.trained_tensors(loaded.model, step.optimizer))
            loss, run.step_memory = step_memory.measure_step(lambda: one(i, inputs), held, on_gpu)
        else:
            loss = one(i, inputs)
        run.losses.append(float(loss.detach()))
        if on_gpu:
            torch.cuda.synchronize()
        run.step_s.append(time.perf_counter() - began)
    if on_gpu:
        run.peak_bytes = max(peak, torch.cuda.max_memory_allocated())


@contextlib.contextmanager
def _compiled(loaded: Any, step: Any, first: list, on: bool):
    """torch.compile of the model's call while inside (when `on`), after one plain forward under
    no_grad, which binds the winners' hand-written forms (they bind in eager, not while tracing)."""
    if not on:
        yield
        return
    import torch
    with torch.no_grad():
        step.loss(first)
    model = loaded.model
    model.compile()
    try:
        yield
    finally:
        model._compiled_call_impl = None  # what nn.Module.compile set: the model is eager again
