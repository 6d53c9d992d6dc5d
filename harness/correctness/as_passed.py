"""Inputs as a model passes them: weights as nn.Parameters, in each grad mode a model is run in.

A served kernel never sees the plain tensors the judge builds: a model passes its weights as
nn.Parameters with requires_grad=True, under torch.no_grad() and torch.inference_mode() as well
as outside them (training, where the activations require grad too and are not leaves). A kernel
that behaves on plain tensors and misbehaves on a Parameter (`if weight.requires_grad:` write
something back into it) would pass a judge that never passes one. So every checked call of the
forward's stages is made in one of three modes, chosen per case from its seed (`mode_for`: both
processes compute it, and the judging process holds the worker's record to it):

- "grad": weights are Parameters, activations require grad (views of a leaf that does, as a
  layer's output is), the call runs with grad enabled;
- "no_grad": weights are Parameters, activations plain, under torch.no_grad();
- "inference": weights are Parameters (made outside the mode, as a model's are), activations
  inference tensors (their buffers made under the mode), under torch.inference_mode().
A model's constants (rotary's cos and sin tables, registered buffers) and integer inputs stay
plain tensors. The timed calls run as served inference does: weights as Parameters, under
torch.no_grad(). Nothing is canonicalised when served: what was judged is what a model passes.
"""
from __future__ import annotations

import contextlib

import torch

MODES = ("grad", "no_grad", "inference")
# per type, the parameters a model passes as its own nn.Parameters (matmul's b: a weight, as in
# x @ W; an nn.Linear's transposed weight is a view of one, requires_grad included)
WEIGHTS = {"rmsnorm": ("weight",), "layernorm": ("weight", "bias"), "fused_mlp": ("w_gate", "w_up", "w_down"),
           "matmul": ("b",)}
CONSTANTS = {"rotary_embedding": ("cos", "sin")}  # a model's buffers: plain, never requiring grad

WORDS = {"grad": "with grad enabled", "no_grad": "under torch.no_grad()", "inference": "under torch.inference_mode()"}


def mode_for(seed: int) -> str:
    """The mode a case is called in: a mix of the seed's digits, so that each stage's cases and
    each dtype meet every mode (seeds step by one per case, by three per dtype)."""
    return MODES[(seed * 2654435761 >> 16) % len(MODES)]


def role(kernel_type: str, name: str) -> str:
    if name in WEIGHTS.get(kernel_type, ()):
        return "weight"
    if name in CONSTANTS.get(kernel_type, ()):
        return "constant"
    return "activation"


def inference_positions(kernel_type: str, params: tuple[str, ...], mode: str) -> frozenset:
    """Where the inputs are inference tensors in `mode` (a model's activations, never its weights)."""
    if mode != "inference":
        return frozenset()
    return frozenset(i for i, p in enumerate(params) if role(kernel_type, p) == "activation")


def wrap(args: list, kernel_type: str, params: tuple[str, ...], mode: str) -> list:
    """The tensors a model would pass, sharing storage with `args` (so the judge's refills, guards
    and snapshots of `args` see what the kernel does to them)."""
    out = []
    for a, p in zip(args, params):
        if not isinstance(a, torch.Tensor) or not a.is_floating_point():
            out.append(a)
        elif role(kernel_type, p) == "weight":
            out.append(torch.nn.Parameter(a, requires_grad=True))
        elif role(kernel_type, p) == "activation" and mode == "grad":
            leaf = a.detach().requires_grad_(True)
            out.append(leaf.view_as(leaf))  # a layer's output: not a leaf, requires grad
        else:
            out.append(a)
    return out + list(args[len(params):])


def calling(mode: str):
    """The grad mode the call runs in."""
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference":
        return torch.inference_mode()
    return contextlib.nullcontext()


def describe(kernel_type: str, name: str, mode: str) -> str:
    """How an input was passed, in words (for a failure that names it)."""
    kind = role(kernel_type, name)
    if kind == "weight":
        return f"passed as an nn.Parameter with requires_grad=True, {WORDS[mode]}, as a model passes its weights"
    if kind == "activation" and mode == "grad":
        return "passed requiring grad, with grad enabled, as a layer's output is in training"
    if kind == "activation" and mode == "inference":
        return "passed as an inference tensor under torch.inference_mode()"
    return f"passed {WORDS[mode]}"
