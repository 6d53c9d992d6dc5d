"""Layers for the Hugging Face `kernels` library: this package's kernels behind the
kernel-aware layers of a transformers model.

Written by `autokernel export --format hf-kernels` as the package's `layers.py` (inside autokernel
itself only LAYERS is read, by the exporter). `kernels.kernelize` replaces the `forward` of each module whose class
is registered under a layer name mapped to one of these classes:

    RMSNorm     "RMSNorm"         transformers' RMSNorm modules (LlamaRMSNorm, MistralRMSNorm...)
    SwiGLUMLP   "SwiGLUMLP"       a SwiGLU MLP of three bias-free nn.Linear (LlamaMLP), registered by hand:
                                  a fused_mlp kernel, or the silu_mul chain's between its projections
    RotaryPosEmb "rotary_pos_emb" transformers' apply_rotary_pos_emb, where it is kernel-aware: the
                                  rotary_qk chain's kernel (q and k in one launch), or rotary_embedding's

A layer that computes a chain serves the chain's kernel or its member's, whichever the package
carries: export binds one of the two (the one whose winner measured the larger end-to-end gain).

Each forward runs bound to the module it replaces. It decides whether to serve a call exactly as
the package's `patch()` does, through the same router (routing/, as `autokernel verify` used it):
the module is bound on its first call (the kernel type's reference must reproduce the module's own
output), then every call that a winner serves runs the kernel, and every other call runs the
module's own forward (its class's: transformers' own) and is counted with its reason. `tally()`
says what was served and what fell back.

Training: a layer's `has_backward` is True when a kernel it carries has a backward the judge
passed (the manifest's "backward"); kernelize in a training mode binds only such layers. Under
autograd such a kernel serves as a differentiable custom op; a call of a forward-only kernel
falls back, counted with its reason, so the gradients are PyTorch's wherever no backward serves.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Callable

import torch

from . import routing
from .routing.sites import FormSite

# layer class -> (the kernel types it serves, first found first; the layer name it is mapped under)
LAYERS = {"RMSNorm": (("rmsnorm",), "RMSNorm"), "SwiGLUMLP": (("silu_mul", "fused_mlp"), "SwiGLUMLP"),
          "RotaryPosEmb": (("rotary_qk", "rotary_embedding"), "rotary_pos_emb")}
_state: dict[str, Any] = {}  # "router": the layers' router, built on the first call of any layer
_stand_ins: "weakref.WeakKeyDictionary[torch.nn.Module, Callable]" = weakref.WeakKeyDictionary()


def _has_backward(layer: str) -> bool:
    """Whether a kernel the layer serves in the package has a judged backward (inside autokernel
    itself, which reads only LAYERS here, there is no package: False)."""
    try:
        from . import KERNELS
    except ImportError:
        return False
    return any(k["kernel_type"] in LAYERS[layer][0] and k.get("backward") for k in KERNELS)


def router() -> "routing.Router":
    """The router of the kernels these layers can serve (loaded on first use)."""
    if "router" not in _state:
        from . import KERNELS, winners  # the package's (autokernel itself reads only LAYERS here)
        types = {kernel_type for served, _ in LAYERS.values() for kernel_type in served}
        found = routing.Router(winners([k["target"] for k in KERNELS if k["kernel_type"] in types]))
        for w in found.winners:
            w.registered()  # each winner a custom op, for a model compiled after its first forward
        _state["router"] = found
    return _state["router"]


def tally() -> dict:
    """Per kernel: calls served, fallbacks and why; per op: the same (the router's tally)."""
    return router().tally.to_json()


def _serve(layer: str, module: torch.nn.Module, *args: Any) -> Any:
    stand_in = _stand_ins.get(module)
    if stand_in is None:
        stand_in = _stand_ins[module] = _stand_in(layer, module)
    return stand_in(*args)


def _stand_in(layer: str, module: torch.nn.Module) -> Callable:
    """The module's stand-in: patch()'s own site for a hand-written form, with the module's own
    forward (its class's; kernelize replaced only the instance's) as the original."""
    r = router()
    original = type(module).forward.__get__(module)
    types = LAYERS[layer][0]
    found = next((r.by_type[t] for t in types if r.by_type.get(t)), None)
    if not found:
        warnings.warn(f"{type(module).__name__} is mapped to this repository's {layer} layer, but the "
                      f"repository has no {' or '.join(types)} kernel that runs here: its own forward runs",
                      RuntimeWarning, stacklevel=4)
        return original
    site = FormSite(r, found[0], original, module, f"{type(module).__name__}.forward", uninstall=lambda: None)
    r.tally.sites.append(site)
    return site.stand_in()


class RMSNorm(torch.nn.Module):
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim, by an rmsnorm kernel."""

    can_torch_compile = False
    has_backward = _has_backward("RMSNorm")

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return _serve("RMSNorm", self, hidden_states)


class SwiGLUMLP(torch.nn.Module):
    """down(silu(gate(x)) * up(x)) with three bias-free nn.Linear children, by a silu_mul kernel
    between the module's own projections, or a fused_mlp kernel for the whole."""

    can_torch_compile = False
    has_backward = _has_backward("SwiGLUMLP")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _serve("SwiGLUMLP", self, x)


class RotaryPosEmb(torch.nn.Module):
    """transformers' apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim) by a rotary_qk kernel (q and k
    in one launch) or a rotary_embedding kernel (one launch each)."""

    can_torch_compile = False
    has_backward = _has_backward("RotaryPosEmb")

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return _serve("RotaryPosEmb", self, q, k, cos, sin, unsqueeze_dim)
