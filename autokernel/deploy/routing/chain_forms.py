"""Chains whose ops sit in one module's forward with no function between them: the module is the form.

- `decoder_layer` (add_rmsnorm): a pre-norm decoder layer with transformers' names
  (`input_layernorm`, `self_attn`, `post_attention_layernorm`, `mlp`). Its forward is
  h = x + attn(norm1(x)); out = h + mlp(norm2(h)). Read as one add_rmsnorm call for the first
  residual add and norm2, which gives back both the sum h (the second residual) and norm2(h). The
  layer's attention, first norm and MLP are called as they are, so the forms bound inside them
  (rotary_qk, an rmsnorm winner, silu_mul) still serve. Unfused stay the second residual add (its
  sum leaves the layer; the norm it feeds is the next layer's input_layernorm, another module's
  call, or the model's final norm) and the first norm (it has no add before it inside the layer).
- `causal_lm_loss` (linear_cross_entropy): a causal LM with an `lm_head` Linear whose forward
  takes `labels` (transformers' *ForCausalLM and its `loss_function`). Its base model runs as it
  is; lm_head + the shifted next-token cross-entropy become one linear_cross_entropy call, so the
  [tokens, vocabulary] logits never exist. Served only in training mode with labels; the output's
  `logits` is then None (what Liger Kernel returns there): the loss is what a training step reads.
  Without labels, or in eval mode, the caller may read the logits: the call is the module's own
  (a fallback, counted with its reason).

Both rules are marked `runs_model` (sites.FormSite): the module calls they make run as the model's,
so the winners inside them serve and are counted. Each rule also gives `unfused`, the module's own
ops on what it computed, for a call the router refuses (no winner at its shape): the layer's
attention is not run twice.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from .requests import EPS_NAMES, Request, is_float

LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
IGNORE = -100  # transformers' ForCausalLMLoss pads the shifted labels with it and ignores it
NO_LABELS = "no labels: the caller gets the logits (the fused loss serves a training step's loss)"
EVAL = "eval mode: the logits are returned (the fused loss serves training with labels, which returns none)"


def norm_weight(norm: torch.nn.Module, n: int) -> Optional[tuple[torch.Tensor, float]]:
    """An RMSNorm module's weight (its one 1-D parameter of length n) and eps."""
    weights = [p for p in norm._parameters.values() if p is not None and p.dim() == 1 and p.shape[0] == n]
    if len(weights) != 1:
        return None
    eps = next((float(v) for v in (getattr(norm, name, None) for name in EPS_NAMES)
                if isinstance(v, (int, float)) and not isinstance(v, bool)), 1e-6)
    return weights[0], eps


def decoder_layer(owner: Any, args: tuple, kwargs: dict) -> Optional[tuple]:
    """forward(hidden_states, **kwargs) of a pre-norm decoder layer: the attention's output and the
    residual into add_rmsnorm with post_attention_layernorm's weight; every other argument goes
    to the attention untouched, as the layer passes it."""
    parts = [getattr(owner, name, None) for name in LAYER_PARTS]
    if owner is None or len(args) > 1 or not all(isinstance(p, torch.nn.Module) for p in parts):
        return None
    pre, attn, post, mlp = parts
    rest = dict(kwargs)
    x = args[0] if args else rest.pop("hidden_states", None)
    found = norm_weight(post, x.shape[-1]) if is_float(x) else None
    if found is None:
        return None
    weight, eps = found
    out = attn(hidden_states=pre(x), **rest)
    h = out[0] if isinstance(out, tuple) else out
    if not is_float(h) or h.shape != x.shape or h.dtype != x.dtype:
        return None
    dtype = x.dtype

    def assemble(outs: list) -> torch.Tensor:
        total, normed = outs[0][0], outs[0][1]  # the sum (the second residual) and norm2(sum)
        return total + mlp(normed)

    def unfused() -> torch.Tensor:
        total = x + h
        return total + mlp(post(total))
    request = Request("add_rmsnorm", (h, x, weight), {"eps": eps}, finish=lambda o: o.to(dtype))
    return [request], assemble, unfused


decoder_layer.runs_model = True


def _lm_skip(owner: Any, args: tuple, kwargs: dict) -> str:
    """Why a causal LM's call keeps its logits ('' when the fused loss may serve it)."""
    if kwargs.get("labels") is None:
        return NO_LABELS
    if not getattr(owner, "training", False):
        return EVAL
    keep = kwargs.get("logits_to_keep", 0)
    if not (keep is None or (isinstance(keep, int) and keep == 0)):
        return "logits_to_keep: the caller asked for some positions' logits"
    if kwargs.get("shift_labels") is not None:
        return "shift_labels: labels shifted by the caller"
    if kwargs.get("return_dict") is False or getattr(getattr(owner, "config", None), "return_dict", True) is False:
        return "return_dict=False: a tuple output"
    return ""


def causal_lm_loss(owner: Any, args: tuple, kwargs: dict) -> Optional[tuple]:
    """forward(input_ids, labels=..., **kwargs) of a causal LM: the base model's last hidden state,
    lm_head's weight and the labels shifted by one (padded with -100) into linear_cross_entropy."""
    head, base = getattr(owner, "lm_head", None), getattr(owner, "model", None)
    if type(head) is not torch.nn.Linear or head.bias is not None or not isinstance(base, torch.nn.Module) \
            or len(args) > 1 or not callable(getattr(owner, "loss_function", None)):
        return None
    labels = kwargs["labels"]
    rest = {k: v for k, v in kwargs.items() if k not in ("labels", "logits_to_keep")}
    if args:
        rest["input_ids"] = args[0]
    items = rest.get("num_items_in_batch")  # the module hands it to its base model too
    out = base(**rest)
    hidden = getattr(out, "last_hidden_state", None)
    if not is_float(hidden) or not isinstance(labels, torch.Tensor) or labels.dtype != torch.int64 \
            or tuple(labels.shape) != tuple(hidden.shape[:-1]):
        return None
    targets = F.pad(labels, (0, 1), value=IGNORE)[..., 1:].reshape(-1).to(hidden.device)
    x = hidden.reshape(-1, hidden.shape[-1])
    request = Request("linear_cross_entropy", (x, head.weight, targets),
                      {"ignore_index": IGNORE, "reduction": "mean" if items is None else "sum"})

    def assemble(outs: list) -> Any:
        return _lm_output(out, outs[0] if items is None else outs[0] / items, None)

    def unfused() -> Any:
        logits = head(hidden)
        extra = {} if items is None else {"num_items_in_batch": items}
        loss = owner.loss_function(logits=logits, labels=labels, vocab_size=head.out_features, **extra)
        return _lm_output(out, loss, logits)
    return [request], assemble, unfused


def _lm_output(base_out: Any, loss: torch.Tensor, logits: Optional[torch.Tensor]) -> Any:
    """The causal LM's output from its base model's: the loss, the logits (None when fused) and
    the base model's other fields (cache, hidden states, attentions) as the module passes them."""
    from transformers.modeling_outputs import CausalLMOutputWithPast  # only a transformers model gets here
    fields = {k: v for k, v in base_out.items() if k != "last_hidden_state"}
    return CausalLMOutputWithPast(loss=loss, logits=logits, **fields)


def _without_logits(out: Any) -> list:
    return [v for k, v in out.items() if k != "logits"] if hasattr(out, "items") else [out]


causal_lm_loss.runs_model = True
causal_lm_loss.skip = _lm_skip
causal_lm_loss.compared = _without_logits  # the loss and what the base model gave: logits are dropped

