"""The magnitude of the terms a gradient is a sum of, where they cancel: the scale its error is
measured against (harness/kernel_types/gradients.py).

A gradient's true value can be far smaller than the terms an honest backward adds up to get it.
A saturated softmax row (one probability near 1) has dx = y * (g - sum(g * y)) near zero
everywhere: g_j - sum(g * y) cancels to 1e-15 from terms of size 1, and an fp32 backward,
PyTorch's included, answers 0. A row norm of one column, or any row whose xhat is near +-1, has
dx = rstd * (w*g - xhat * mean(xhat * w*g)) cancel the same way. Measured against the row's rms
of the true gradient, such rows would reject every correct kernel; measured against the rms of
the terms (|y| * (|g| + |sum(g * y)|) for the softmax), they hold a kernel to the rounding its
arithmetic cannot avoid, and a gradient off by a factor, or missing a term, is still off by the
size of the terms.

Each function takes the float64 inputs (as the type's params, tensors first), kwargs, and the
float64 upstream gradient; it returns one magnitude tensor per differentiable parameter, shaped
like its gradient. Types whose gradients do not cancel within a row (reduce, rotary, matmul,
the MLP) have none here: their reference's own rms is the scale.
"""
from __future__ import annotations

import math

import torch


def _row_stats(x: torch.Tensor, eps: float, centred: bool) -> tuple[torch.Tensor, torch.Tensor]:
    mean = x.mean(-1, keepdim=True) if centred else torch.zeros_like(x[..., :1])
    var = (x - mean).pow(2).mean(-1, keepdim=True)
    rstd = torch.rsqrt(var + eps)
    return (x - mean) * rstd, rstd


def _over_rows(terms: torch.Tensor) -> torch.Tensor:
    """A weight gradient's terms summed in magnitude over every row: its sum's rounding scale."""
    return terms.reshape(-1, terms.shape[-1]).sum(0)


def softmax(x, g, **_):
    y = torch.softmax(x, -1)
    return [y.abs() * (g.abs() + (g * y).sum(-1, keepdim=True).abs())]


def rmsnorm(x, weight, g, eps=1e-6):
    xhat, rstd = _row_stats(x, eps, centred=False)
    wg = weight * g
    c = (xhat * wg).mean(-1, keepdim=True)
    return [rstd * (wg.abs() + xhat.abs() * c.abs()), _over_rows((g * xhat).abs())]


# PyTorch's float64 layer_norm rounds x - mean at about 2^-52 of |x| + |mean|; where x - mean is
# exactly 0 (a one-column row) the true weight gradient is 0 and the reference's is that rounding
# times rstd (2.5e-14 at eps=1e-5): the reference's own error, held apart with room (2^-36)
REFERENCE_ROUNDING = 2.0 ** -36


def layernorm(x, weight, bias, g, eps=1e-5):
    xhat, rstd = _row_stats(x, eps, centred=True)
    wg = weight * g
    c1, c2 = wg.mean(-1, keepdim=True), (xhat * wg).mean(-1, keepdim=True)
    rounding = REFERENCE_ROUNDING * (x.abs() + x.mean(-1, keepdim=True).abs()) * rstd
    return [rstd * (wg.abs() + c1.abs() + xhat.abs() * c2.abs()), _over_rows((g * (xhat.abs() + rounding)).abs()),
            _over_rows(g.abs())]


def cross_entropy(logits, targets, g, **_):
    # a target of -100 (ignore_index) takes no part: its row's gradient is exactly 0, and the mean
    # is over the rows that count
    counted = (targets != -100).unsqueeze(-1)
    p = torch.softmax(logits, -1)
    onehot = torch.zeros_like(p).scatter_(-1, targets.clamp_min(0).view(-1, 1), 1.0)
    return [(p + onehot) * counted * g.abs() / counted.sum().clamp_min(1)]


def flash_attention(q, k, v, g, causal=False, sm_scale=None):
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    p = torch.softmax(s, -1)
    d = (g * (p @ v)).sum(-1, keepdim=True)
    ds = p * ((g.abs() @ v.abs().transpose(-1, -2)) + d.abs())  # |P| * (|dP| + |D|): dS's terms
    return [ds @ k.abs() * scale, ds.transpose(-1, -2) @ q.abs() * scale, p.transpose(-1, -2) @ g.abs()]


MAGNITUDES = {"softmax": softmax, "rmsnorm": rmsnorm, "layernorm": layernorm, "cross_entropy": cross_entropy,
              "flash_attention": flash_attention}


def magnitudes(kernel_type: str, args: list, kwargs: dict, grad_out: torch.Tensor,
               device: str | torch.device = "cpu") -> list[torch.Tensor] | None:
    """Per differentiable parameter, the magnitude of its gradient's terms (float64, on `device`), or None."""
    fn = MAGNITUDES.get(kernel_type)
    if fn is None:
        return None
    a64 = [a.to(device, torch.float64) if isinstance(a, torch.Tensor) and a.is_floating_point()
           else a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    with torch.no_grad():
        return [torch.nan_to_num(m.double(), nan=0.0, posinf=0.0, neginf=0.0)
                for m in fn(*a64, grad_out.to(device, torch.float64), **kwargs)]
