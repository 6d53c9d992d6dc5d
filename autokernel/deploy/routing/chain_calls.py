"""The chain types' dims and meanings in plain PyTorch, for the router (calls.DIMS and
calls.REFERENCES take them in). The exported package has no harness, so these are copies; tests
hold them equal to harness/kernel_types/types/chains.py."""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F


def _up(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _add_rmsnorm(x, residual, weight, eps=1e-6):
    s = _up(x) + _up(residual)
    return torch.stack([s, s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * _up(weight)])


def _rotary_qk(q, k, cos, sin):
    cos, sin = _up(cos), _up(sin)
    return torch.cat([_up(t) * cos + _rotate_half(_up(t)) * sin for t in (q, k)], dim=1)


def _linear_ce(x, weight, targets, ignore_index=-100, reduction="mean"):
    return F.cross_entropy(_up(x) @ _up(weight).T, targets, ignore_index=ignore_index, reduction=reduction)


DIMS: dict[str, Callable[..., dict]] = {
    "add_rmsnorm": lambda x, *rest, **kw: {"M": math.prod(x.shape[:-1]), "N": x.shape[-1]},
    "silu_mul": lambda gate, up: {"M": math.prod(gate.shape[:-1]), "N": gate.shape[-1]},
    "rotary_qk": lambda q, k, *rest: {"B": q.shape[0], "HQ": q.shape[1], "HK": k.shape[1], "S": q.shape[2],
                                      "D": q.shape[3]},
    "linear_cross_entropy": lambda x, weight, *rest, **kw: {"N": x.shape[0], "D": x.shape[-1], "V": weight.shape[0]},
}

REFERENCES: dict[str, Callable[..., torch.Tensor]] = {
    "add_rmsnorm": _add_rmsnorm,
    "silu_mul": lambda gate, up: F.silu(_up(gate)) * _up(up),
    "rotary_qk": _rotary_qk,
    "linear_cross_entropy": _linear_ce,
}
