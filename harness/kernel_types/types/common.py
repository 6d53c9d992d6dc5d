"""Input-making helpers shared by the kernel-type modules."""
from __future__ import annotations

import math

import torch

from harness.kernel_types.kernel_type import Case


def randn(gen: torch.Generator, shape, std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float32) * std + mean


def uniform(gen: torch.Generator, shape, low: float, high: float) -> torch.Tensor:
    return torch.rand(tuple(shape), generator=gen, dtype=torch.float32) * (high - low) + low


def activation(case: Case, gen: torch.Generator, shape=None) -> torch.Tensor:
    """The main input of a case in float32, shaped by its dims, with the case's stability variant
    applied; the caller casts it to the case dtype."""
    shape = tuple(case.dims.values()) if shape is None else tuple(shape)
    x = randn(gen, shape)
    v = case.variant
    if v.startswith("scale:"):
        x = x * float(v.split(":", 1)[1])
    elif v.startswith("offset_mean:"):
        x = x + float(v.split(":", 1)[1])
    elif v == "fp16max":
        # values spread up to the top of fp16's range: max-subtraction and sums must not overflow
        x = uniform(gen, shape, -6.0e4, 6.0e4)
    elif v == "mixed_rows":
        rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
        scales = torch.tensor([10.0 ** ((i % 7) - 3) for i in range(rows)], dtype=torch.float32)
        x = x * scales.view(*shape[:-1], 1) if len(shape) > 1 else x * scales
    elif v == "masked":
        # attention-style masking: about a quarter of each row at -inf, never a whole row
        drop = torch.rand(shape, generator=gen) < 0.25
        drop[..., 0] = False
        x = x.masked_fill(drop, float("-inf"))
    elif v == "overflow_rows":
        # every other row sums past fp16's maximum: the reference has inf exactly there
        x = x.abs() * 10.0 + 2.0e4
        x[..., 1::2, :] = randn(gen, x[..., 1::2, :].shape)
    elif v == "cancel":
        # large values that cancel: a low-precision accumulator loses the small remainder
        half = shape[-1] // 2
        big = randn(gen, (*shape[:-1], half), std=3.0e3)
        x[..., :half] += big
        x[..., half:2 * half] -= big
    return x


def cast(t: torch.Tensor, case: Case) -> torch.Tensor:
    return t.to(case.torch_dtype)


def rows_cols(dims: dict[str, int]) -> tuple[int, int]:
    values = list(dims.values())
    return math.prod(values[:-1]), values[-1]


def row_dims(x: torch.Tensor, last: str = "N") -> dict[str, int]:
    """Named dims of a row-wise op's input: all leading dims as M, the reduced dim last."""
    return {"M": math.prod(x.shape[:-1]), last: x.shape[-1]}
