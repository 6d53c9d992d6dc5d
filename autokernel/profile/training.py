"""A training step: the model's forward, a scalar loss, its backward and an optimizer step.

A model file declares its step with one of

    def loss_fn(output, inputs): ...      # the scalar loss of model(*inputs) == output
    def train_step(model, inputs): ...    # runs the forward itself and returns the scalar loss

and may build its optimizer with `get_optimizer(model)` (default: AdamW, lr 1e-4, over the
parameters that need gradients). Without either, a default where one fits: token ids in and logits
out (the ids' shape plus the vocabulary): cross-entropy of each position's logits against the next
token, the inputs shifted by one; any other floating output: its mean square. The step says which
it used (`TrainStep.how`).

Profiling a step leaves the model as it was found: its weights and buffers are restored, its
gradients cleared, and its mode (train() while stepping) put back.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import torch
from torch.autograd.profiler import record_function

from autokernel.errors import UserError
from autokernel.profile.attribution import BACKWARD, OPTIMIZER, TRAIN_ROOT
from autokernel.profile.modelfile import GET_OPTIMIZER, LOSS_FN, TRAIN_STEP, _in_user_code

DEFAULT_LR = 1e-4
SCALAR_HINT = ("return a tensor with one element that depends on the model's parameters, e.g. "
               "F.cross_entropy(logits, targets) or out.pow(2).mean()")


@dataclass
class TrainStep:
    """One training step of a loaded model (modelfile.LoadedModel) on fixed inputs."""

    loaded: Any
    loss: Callable[[list], Any]  # inputs -> the scalar loss; runs the forward
    how: str  # what the loss is, in words
    optimizer: Any  # a torch.optim.Optimizer
    last_loss: Optional[float] = None

    @property
    def optimizer_name(self) -> str:
        return type(self.optimizer).__name__

    def run(self, inputs: list, ranged: bool = False) -> None:
        """Forward and loss, backward, optimizer step; `ranged`: each in the profiler range the
        attribution reads (autokernel.profile.attribution)."""
        path = self.loaded.spec.path
        with profiled_range(TRAIN_ROOT, ranged):
            loss = checked_loss(_in_user_code(path, self.how, lambda: self.loss(inputs)), self.how, path)
        with profiled_range(BACKWARD, ranged):
            _in_user_code(path, "the backward of the loss", loss.backward)
        with profiled_range(OPTIMIZER, ranged):
            _in_user_code(path, f"{self.optimizer_name}.step()", self.optimizer.step)
            self.optimizer.zero_grad(set_to_none=True)
        self.last_loss = float(loss.detach())


@contextmanager
def profiled_range(name: str, on: bool = True) -> Iterator[None]:
    """A record_function range named `name` when `on`: the profiled runs are marked, the plain ones
    timed bare."""
    if on:
        with record_function(name):
            yield
    else:
        yield


@contextmanager
def training(loaded: Any, inputs: list) -> Iterator[TrainStep]:
    """The model's training step, in train mode; on exit the model is as it was found."""
    model = loaded.model
    trainable = check_trainable(loaded)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    was_training = model.training
    try:
        loss, how = _loss(loaded, inputs)
        model.train()
        yield TrainStep(loaded, loss, how, _optimizer(loaded, trainable))
    finally:
        model.load_state_dict(saved)
        for p in model.parameters():
            p.grad = None
        model.train(was_training)


def check_trainable(loaded: Any) -> list:
    """The parameters that need gradients; an error when there are none."""
    params = [p for p in loaded.model.parameters() if p.requires_grad]
    if not params:
        kind = "has no parameters" if not list(loaded.model.parameters()) else "has no parameter with requires_grad=True"
        raise UserError(f"{loaded.spec.path}: the model {kind}, so a training step has nothing to train",
                        "give it an nn.Parameter that requires a gradient, or profile inference without --train")
    return params


def checked_loss(value: Any, how: str, path: str) -> Any:
    """The loss if it is a scalar that a backward can start from, else an error that says why."""
    if not isinstance(value, torch.Tensor):
        raise UserError(f"{path}: {how} returned {type(value).__name__}, not a scalar loss tensor", SCALAR_HINT)
    if value.numel() != 1:
        raise UserError(f"{path}: {how} returned a tensor of shape {list(value.shape)}, not a scalar loss", SCALAR_HINT)
    if not value.is_floating_point():
        raise UserError(f"{path}: {how} returned a {value.dtype} scalar, not a floating-point loss", SCALAR_HINT)
    if not value.requires_grad:
        raise UserError(f"{path}: the loss from {how} does not depend on any parameter that needs a gradient "
                        "(computed under torch.no_grad() or detached?)", SCALAR_HINT)
    return value


def _loss(loaded: Any, inputs: list) -> tuple[Callable[[list], Any], str]:
    """The step's loss function and what it is: the file's train_step or loss_fn, else a default
    chosen by what the model returns."""
    module, model = loaded.module, loaded.model
    step = getattr(module, TRAIN_STEP, None)
    if callable(step):
        return (lambda xs: step(model, xs)), f"{TRAIN_STEP}(model, inputs) from the model file"
    loss_fn = getattr(module, LOSS_FN, None)
    if callable(loss_fn):
        return (lambda xs: loss_fn(model(*xs), xs)), f"{LOSS_FN}(output, inputs) from the model file"
    out = tensor_of(loaded.forward(inputs))
    ids = inputs[0] if inputs and isinstance(inputs[0], torch.Tensor) else None
    if out is None or not out.is_floating_point():
        raise UserError(f"{loaded.spec.path}: no default loss fits the model's output "
                        f"({type(out).__name__ if out is None else out.dtype})",
                        f"define {LOSS_FN}(output, inputs) or {TRAIN_STEP}(model, inputs) in the model file")
    if (ids is not None and not ids.is_floating_point() and not ids.is_complex() and ids.dim() >= 1
            and ids.shape[-1] >= 2 and tuple(out.shape[:-1]) == tuple(ids.shape)):
        if takes_labels(model):  # its own loss, as a training loop calls it: where a fused loss is served
            return (lambda xs: model(*xs, labels=xs[0]).loss), LABELS_LOSS
        return (lambda xs: next_token_loss(tensor_of(model(*xs)), xs[0]),
                "default: cross-entropy of the logits against the inputs shifted by one (next-token prediction)")
    return (lambda xs: tensor_of(model(*xs)).pow(2).mean()), "default: the mean square of the output"


LABELS_LOSS = ("default: the model's own loss, model(ids, labels=ids).loss (a causal LM shifts the labels "
               "itself: the next-token cross-entropy)")


def takes_labels(model: Any) -> bool:
    """Whether the model computes its own loss from `labels` (transformers' *ForCausalLM): its
    forward takes them and returns an output with a `loss` field."""
    import inspect
    try:  # the class's forward: a patched instance's stand-in takes (*args, **kwargs)
        parameters = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):
        return False
    return "labels" in parameters and hasattr(type(model), "loss_function")


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of each position's logits against the token after it. The logits are
    flattened to [tokens, vocabulary], the layout of the registry's cross_entropy."""
    vocab = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[..., :-1, :].reshape(-1, vocab), ids[..., 1:].reshape(-1))


def tensor_of(output: Any) -> Any:
    """The tensor a loss is taken of: the output itself, its `.logits` (transformers' outputs),
    or the first of a tuple, list or dict."""
    if isinstance(output, torch.Tensor) or output is None:
        return output
    if isinstance(getattr(output, "logits", None), torch.Tensor):
        return output.logits
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)) and output:
        return tensor_of(output[0])
    return None


def _optimizer(loaded: Any, trainable: list) -> Any:
    make = getattr(loaded.module, GET_OPTIMIZER, None)
    if not callable(make):
        return torch.optim.AdamW(trainable, lr=DEFAULT_LR)
    optimizer = _in_user_code(loaded.spec.path, f"{GET_OPTIMIZER}(model)", lambda: make(loaded.model))
    if not (callable(getattr(optimizer, "step", None)) and callable(getattr(optimizer, "zero_grad", None))):
        raise UserError(f"{loaded.spec.path}: {GET_OPTIMIZER}(model) returned {type(optimizer).__name__}, not an optimizer",
                        "return a torch.optim.Optimizer over the model's parameters, e.g. torch.optim.AdamW(model.parameters())")
    return optimizer
