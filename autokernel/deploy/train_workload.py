"""verify --train's second workload: the inputs and weights of a real training step that neither the
judge's cases nor the first workload (the profiled inputs, the weights as found) give a kernel.

One step (forward, loss, backward) on
- a ragged batch: one sequence more than profiled, each one token shorter, (B+1) x (S-1) for token
  ids [B, S] or activations [B, S, ...], B+1 rows for inputs [B, D]. Its row count is neither the
  target's nor a multiple of it, and lies inside what the judge's shapes around a target prove
  (half of it to twice it), so the winners serve it where their serving range reaches;
- padded labels, where the model takes token ids and returns logits over them: the sequences have
  different lengths (S-1, S-3, ... down to 2), the rest of each is padding (token 0) labelled -100,
  and the loss is the next-token cross-entropy that ignores those positions (F.cross_entropy's
  default ignore_index), whatever loss the file declares: a padded batch is how such a model trains.
  A model that computes that loss itself from `labels` (a transformers causal LM) is given them.
  Any other model keeps its file's own step (or the default loss) at the ragged inputs;
- zero-initialised norm weights: the weight of every norm (a module whose class name says Norm,
  holding a 1-D `weight`) set to exact zeros, all of it but in the last norm, whose even channels
  alone are zeroed (the last usually feeds the head: zeroed whole, no gradient would reach any
  other parameter). A backward that rebuilds the normalised input as out / weight gives NaN there.

verify_train.py compares the loss and every parameter's gradient of this step, eager against patched.
"""
from __future__ import annotations

from typing import Any, Optional

from autokernel.deploy.fine_tune import Workload
from autokernel.errors import UserError

SEED = 1000  # the step's inputs: not one of the first workload's seeds (0 .. steps - 1)
PAD_ID, IGNORE = 0, -100


def ragged_shape(x: Any, sequence: bool) -> tuple[int, ...]:
    """(B+1, S-1) for a [B, S, ...] input (S kept below 3: a shorter sequence has no next token to
    score), (B+1,) for a [B, ...] one."""
    if sequence:
        b, s = x.shape[:2]
        return (b + 1, s - 1 if s >= 3 else s)
    return (x.shape[0] + 1,)


def lengths(batch: int, seq: int) -> list[int]:
    """Each sequence's length before its padding: seq, seq - 2, ... never under 2."""
    return [max(seq - 2 * i, min(2, seq)) for i in range(batch)]


def norm_weights(model: Any) -> list[tuple[str, Any]]:
    """(name, module) of every norm holding a 1-D weight, in module order."""
    import torch
    return [(name, m) for name, m in model.named_modules()
            if "norm" in type(m).__name__.lower() and isinstance(getattr(m, "weight", None), torch.nn.Parameter)
            and m.weight.dim() == 1]


def zero_norm_weights(model: Any) -> None:
    """Exact zeros in every norm weight: all of each, but the last norm's even channels alone."""
    norms = norm_weights(model)
    for i, (_, m) in enumerate(norms):
        if i < len(norms) - 1:
            m.weight.zero_()
        else:
            m.weight[::2] = 0


def second_workload(loaded: Any) -> tuple[Optional[Workload], dict]:
    """The workload and what it is in verify.json's words, or (None, {"skipped": why})."""
    from autokernel.deploy.workload import leading, resized
    first = leading(loaded.make_inputs(SEED))
    if first is None:
        return None, {"skipped": "the model takes no tensor input whose batch could be made ragged"}
    x, sequence = first
    shape = ragged_shape(x, sequence)

    def inputs(seed: int) -> list:
        return resized(loaded, SEED + seed, shape)
    try:
        out = loaded.forward(inputs(0))
    except UserError as e:  # a model that takes one shape only: said, not failed
        return None, {"skipped": f"the model does not run at {'x'.join(map(str, shape))}: "
                                 f"{str(e).splitlines()[0]}"}
    norms = norm_weights(loaded.model)
    about = {"name": "x".join(map(str, shape)) + " ragged", "shape": list(shape),
             "zeroed_norm_weights": [f"{n}.weight ({'even channels' if i == len(norms) - 1 else 'all'})"
                                     for i, (n, _) in enumerate(norms)], "lengths": None, "padded_labels": 0}
    workload = Workload(about["name"], inputs, prepare=zero_norm_weights)
    if _token_logits(inputs(0), out):
        about["lengths"] = lengths(*shape[:2])
        about["padded_labels"] = sum(shape[1] - n for n in about["lengths"])
        workload.inputs = lambda seed: _padded(inputs(seed), about["lengths"])
        workload.loss = lambda model, xs: padded_loss(model, xs, about["lengths"])
        workload.how = ("cross-entropy of the logits against the next token, padded positions labelled "
                        f"{IGNORE} and ignored")
    return workload, about


def _token_logits(inputs: list, out: Any) -> bool:
    """Token ids [B, S] in, logits [B, S, vocabulary] over them out: the default next-token loss fits."""
    import torch
    from autokernel.profile.training import tensor_of
    ids, logits = (inputs[0] if inputs else None), tensor_of(out)
    return (isinstance(ids, torch.Tensor) and isinstance(logits, torch.Tensor) and ids.dim() == 2
            and not ids.is_floating_point() and logits.is_floating_point()
            and tuple(logits.shape[:-1]) == tuple(ids.shape))


def _padded(inputs: list, lengths_: list[int]) -> list:
    ids = inputs[0].clone()
    for i, n in enumerate(lengths_):
        ids[i, n:] = PAD_ID
    return [ids, *inputs[1:]]


def padded_loss(model: Any, inputs: list, lengths_: list[int]) -> Any:
    """The next-token cross-entropy of a padded batch: the positions past each sequence's length
    (its padding) are labelled -100 and ignored."""
    from autokernel.profile.training import next_token_loss, takes_labels, tensor_of
    labels = inputs[0].clone()
    for i, n in enumerate(lengths_):
        labels[i, n:] = IGNORE
    if takes_labels(model):  # the same loss, computed by the model from its labels (it shifts them)
        return model(*inputs, labels=labels).loss
    return next_token_loss(tensor_of(model(*inputs)), labels)
