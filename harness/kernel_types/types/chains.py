"""Chain types: adjacent operators a model runs one after the other, whose intermediates go only to
the next, judged as one kernel. Each reference is its operators composed in float64, so forward
and backward are checked against the true answer of the chain, not against one op's rounding:

- add_rmsnorm(x, residual, weight, eps): the residual add and RMSNorm of the sum. Both the sum and
  the normalised output are used later (the next residual reads the sum), so the kernel returns
  both, stacked: out[0] = x + residual, out[1] = rmsnorm(out[0]) * weight; out [2, *x.shape].
- silu_mul(gate, up): SiLU(gate) * up, the product a gated MLP feeds its down projection.
- rotary_qk(q, k, cos, sin): rotate-half rotary on q and on k in one launch; q [B, HQ, S, D],
  k [B, HK, S, D] (grouped-query attention: HK may be fewer), returned concatenated on the head
  dim: out [B, HQ + HK, S, D], out[:, :HQ] is q's.
- linear_cross_entropy(x, weight, targets, ignore_index, reduction): cross-entropy of the logits
  x @ weight.T (x [N, D], weight [V, D], nn.Linear's layout) against targets, the rows whose
  target is ignore_index left out, "mean" over the rows kept or "sum"; a float32 scalar. Computed
  in chunks of rows, the [N, V] logits never exist whole: that is its point (the memory a training
  step's loss needs).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from harness.kernel_types import model_views, structured
from harness.kernel_types.kernel_type import Case, KernelType
from harness.kernel_types.types.common import activation, cast, randn, row_dims, rows_cols

TYPES: list[KernelType] = []  # registered by harness.kernel_types.registry on first use

ROWS_SWEEP = [({"M": 11, "N": 1000}, {}), ({"M": 5, "N": 1025}, {}), ({"M": 3, "N": 4097}, {}),
              ({"M": 6, "N": 777}, {}), ({"M": 130, "N": 33}, {})]
ROW_EDGES = [("noncontig", {"M": 9, "N": 300}, {}), ("offset", {"M": 5, "N": 129}, {}),
             (model_views.VARIANT, {"M": 6, "N": 100}, {}), ("plain", {"M": 1, "N": 2048}, {}),
             ("plain", {"B": 2, "S": 3, "N": 96}, {})]


def _rms(s, weight, eps):
    return s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * weight


# ---------------------------------------------------------------- add_rmsnorm
def _add_rmsnorm_inputs(case: Case, gen: torch.Generator):
    n = list(case.dims.values())[-1]
    x = activation(case, gen)
    residual = activation(case, gen)
    weight = randn(gen, (n,), std=0.1, mean=1.0)
    kwargs = {"eps": case.options["eps"]} if "eps" in case.options else {}
    return [cast(x, case), cast(residual, case), cast(weight, case)], kwargs


def _add_rmsnorm_ref(x, residual, weight, eps=1e-6):
    s = x.double() + residual.double()
    return torch.stack([s, _rms(s, weight.double(), eps)])


def _add_rmsnorm_eager(x, residual, weight, eps=1e-6):
    s = x + residual
    sf = s.float()
    return torch.stack([s, (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)).to(s.dtype) * weight])


TYPES.append(KernelType(
    name="add_rmsnorm",
    grad_params=("x", "residual", "weight"),
    summed_grads=("weight",),
    params=("x", "residual", "weight", "eps"),
    defaults={"eps": 1e-6},
    make_inputs=_add_rmsnorm_inputs,
    reference=_add_rmsnorm_ref,
    eager=_add_rmsnorm_eager,
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"M": 8, "N": 256},
    sweep=ROWS_SWEEP,
    stability=[(structured.VARIANT, {"M": structured.rows("add_rmsnorm"), "N": 100}, ("float32", "float16")),
               ("scale:1e-4", {"M": 8, "N": 1000}, ("float32", "float16")),
               ("scale:300", {"M": 8, "N": 2048}, ("float16",)),
               ("mixed_rows", {"M": 7, "N": 513}, ("float32", "float16"))],
    edge_cases=ROW_EDGES + [("plain", {"M": 4, "N": 1}, {}), ("plain", {"M": 6, "N": 200}, {"eps": 1e-2})],
    bench_shape={"M": 16384, "N": 4096},
    cpu_bench_shape={"M": 16, "N": 4096},
    flops=lambda d: 6.0 * rows_cols(d)[0] * rows_cols(d)[1],
    # reads x and the residual, writes the sum and the output; the weight once
    bytes=lambda d, es: (4 * rows_cols(d)[0] * rows_cols(d)[1] + rows_cols(d)[1]) * es,
    aten_ops=(),  # a chain: found in the model's data-flow graph (autokernel.profile.chains)
    shape_of=lambda x, *rest, **kw: row_dims(x),
    reference_source=("s = x + residual\n"
                      "s32 = s.float()\n"
                      "y = (s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + eps)).to(s.dtype) * weight\n"
                      "return torch.stack([s, y])  # [2, *x.shape]: the sum is used later too"),
))


# ---------------------------------------------------------------- silu_mul
def _silu_mul_inputs(case: Case, gen: torch.Generator):
    # the stability variant on the gate (SiLU's input) alone: both scaled would pass fp16's range
    up = randn(gen, tuple(case.dims.values()))
    return [cast(activation(case, gen), case), cast(up, case)], {}


TYPES.append(KernelType(
    name="silu_mul",
    grad_params=("gate", "up"),
    params=("gate", "up"),
    defaults={},
    make_inputs=_silu_mul_inputs,
    reference=lambda gate, up: F.silu(gate.double()) * up.double(),
    eager=lambda gate, up: F.silu(gate) * up,
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"M": 8, "N": 256},
    sweep=ROWS_SWEEP,
    stability=[(structured.VARIANT, {"M": structured.rows("silu_mul"), "N": 100}, ("float32", "float16")),
               ("scale:30", {"M": 8, "N": 1000}, ("float32", "float16")),
               ("mixed_rows", {"M": 7, "N": 513}, ("float32", "float16"))],
    edge_cases=ROW_EDGES + [("plain", {"M": 4, "N": 1}, {})],
    bench_shape={"M": 16384, "N": 11008},
    cpu_bench_shape={"M": 16, "N": 4096},
    flops=lambda d: 6.0 * rows_cols(d)[0] * rows_cols(d)[1],
    bytes=lambda d, es: 3.0 * rows_cols(d)[0] * rows_cols(d)[1] * es,
    aten_ops=(),
    shape_of=lambda gate, up: row_dims(gate),
    reference_source="F.silu(gate) * up  # elementwise; gate and up [..., N]",
))


# ---------------------------------------------------------------- rotary_qk
def _tables(s: int, d: int, base: float = 10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    emb = torch.outer(torch.arange(s, dtype=torch.float64), inv_freq).repeat(1, 2)
    return emb.cos().float(), emb.sin().float()


def _rotary_qk_inputs(case: Case, gen: torch.Generator):
    b, hq, hk, s, d = (case.dims[k] for k in ("B", "HQ", "HK", "S", "D"))
    q = activation(case, gen, (b, hq, s, d))
    k = activation(case, gen, (b, hk, s, d))
    cos, sin = _tables(s, d)
    return [cast(q, case), cast(k, case), cast(cos, case), cast(sin, case)], {}


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _rotary_qk_ref(q, k, cos, sin):
    cos, sin = cos.double(), sin.double()
    return torch.cat([t.double() * cos + _rotate_half(t.double()) * sin for t in (q, k)], dim=1)


def _rotary_qk_eager(q, k, cos, sin):
    return torch.cat([t * cos + _rotate_half(t) * sin for t in (q, k)], dim=1)


TYPES.append(KernelType(
    name="rotary_qk",
    grad_params=("q", "k"),  # cos and sin are the model's constants
    params=("q", "k", "cos", "sin"),
    defaults={},
    make_inputs=_rotary_qk_inputs,
    reference=_rotary_qk_ref,
    eager=_rotary_qk_eager,
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"B": 1, "HQ": 4, "HK": 2, "S": 16, "D": 64},
    sweep=[({"B": 2, "HQ": 3, "HK": 3, "S": 77, "D": 128}, {}), ({"B": 1, "HQ": 8, "HK": 2, "S": 129, "D": 64}, {}),
           ({"B": 1, "HQ": 2, "HK": 1, "S": 300, "D": 96}, {}), ({"B": 3, "HQ": 1, "HK": 1, "S": 5, "D": 32}, {})],
    stability=[(structured.VARIANT, {"B": 1, "HQ": 1, "HK": 1, "S": structured.rows("rotary_qk"), "D": 32},
                ("float32", "float16")),
               ("scale:1e3", {"B": 1, "HQ": 2, "HK": 1, "S": 64, "D": 64}, ("float32", "float16")),
               ("mixed_rows", {"B": 1, "HQ": 2, "HK": 2, "S": 35, "D": 64}, ("float32", "float16"))],
    edge_cases=[("plain", {"B": 1, "HQ": 1, "HK": 1, "S": 1, "D": 32}, {}),
                ("noncontig", {"B": 1, "HQ": 2, "HK": 1, "S": 20, "D": 64}, {}),
                # q and k slices of fused projections, cos and sin the first rows of longer tables
                (model_views.VARIANT, {"B": 1, "HQ": 4, "HK": 2, "S": 8, "D": 32}, {}),
                ("offset", {"B": 2, "HQ": 2, "HK": 2, "S": 9, "D": 32}, {}),
                ("plain", {"B": 1, "HQ": 1, "HK": 1, "S": 7, "D": 2}, {})],
    bench_shape={"B": 4, "HQ": 32, "HK": 8, "S": 2048, "D": 128},
    cpu_bench_shape={"B": 1, "HQ": 2, "HK": 1, "S": 128, "D": 128},
    flops=lambda d: 3.0 * d["B"] * (d["HQ"] + d["HK"]) * d["S"] * d["D"],
    bytes=lambda d, es: (2.0 * d["B"] * (d["HQ"] + d["HK"]) * d["S"] * d["D"] + 2.0 * d["S"] * d["D"]) * es,
    aten_ops=(),
    shape_of=lambda q, k, cos, sin: {"B": q.shape[0], "HQ": q.shape[1], "HK": k.shape[1], "S": q.shape[2],
                                     "D": q.shape[3]},
    reference_source=("torch.cat([q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin], dim=1)\n"
                      "# rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]); q [B, HQ, S, D], k [B, HK, S, D];"
                      " cos, sin [S, D]"),
))


# ---------------------------------------------------------------- linear_cross_entropy
def _lce_inputs(case: Case, gen: torch.Generator):
    n, d, v = case.dims["N"], case.dims["D"], case.dims["V"]
    x = activation(case, gen, (n, d))
    weight = randn(gen, (v, d), std=1.0 / math.sqrt(d))
    targets = torch.randint(0, v, (n,), generator=gen, dtype=torch.int64)
    ignore = case.options.get("ignore_index", -100)
    if n > 1:  # about one row in four ignored (padding), never all of them: a mean of none is NaN
        drop = torch.rand(n, generator=gen) < 0.25
        drop[torch.randint(0, n, (1,), generator=gen)] = False
        targets = targets.masked_fill(drop, ignore)
    return [cast(x, case), cast(weight, case), targets], dict(case.options)


def _lce_ref(x, weight, targets, ignore_index=-100, reduction="mean"):
    return F.cross_entropy(x.double() @ weight.double().T, targets, ignore_index=ignore_index, reduction=reduction)


def _lce_eager(x, weight, targets, ignore_index=-100, reduction="mean"):
    return F.cross_entropy(F.linear(x, weight).float(), targets, ignore_index=ignore_index, reduction=reduction)


TYPES.append(KernelType(
    name="linear_cross_entropy",
    dot_products=True,
    grad_params=("x", "weight"),  # targets are integers
    summed_grads=("weight",),
    params=("x", "weight", "targets", "ignore_index", "reduction"),
    defaults={"ignore_index": -100, "reduction": "mean"},
    make_inputs=_lce_inputs,
    reference=_lce_ref,
    eager=_lce_eager,
    out_dtype=lambda c: torch.float32,
    smoke_shape={"N": 8, "D": 32, "V": 128},
    sweep=[({"N": 7, "D": 32, "V": 1000}, {}), ({"N": 16, "D": 64, "V": 4097}, {}),
           ({"N": 33, "D": 48, "V": 300}, {"reduction": "sum"}), ({"N": 4, "D": 16, "V": 32000}, {}),
           ({"N": 130, "D": 16, "V": 33}, {})],
    stability=[(structured.VARIANT, {"N": structured.rows("linear_cross_entropy"), "D": 32, "V": 100},
                ("float32", "float16")),
               ("scale:10", {"N": 6, "D": 64, "V": 1000}, ("float32", "float16")),
               ("mixed_rows", {"N": 7, "D": 32, "V": 513}, ("float32", "float16"))],
    edge_cases=[("noncontig", {"N": 9, "D": 32, "V": 300}, {}), ("offset", {"N": 5, "D": 16, "V": 129}, {}),
                # x a slice of a wider activation, weight the first V rows of a padded vocabulary
                (model_views.VARIANT, {"N": 6, "D": 32, "V": 100}, {}),
                ("plain", {"N": 1, "D": 64, "V": 4096}, {}),
                ("plain", {"N": 12, "D": 32, "V": 200}, {"ignore_index": 0, "reduction": "sum"})],
    bench_shape={"N": 8192, "D": 4096, "V": 32000},
    cpu_bench_shape={"N": 16, "D": 64, "V": 2048},
    flops=lambda d: 2.0 * d["N"] * d["D"] * d["V"] + 4.0 * d["N"] * d["V"],
    # the point of the chain: x, the weight and the targets in, a scalar out; never the logits
    bytes=lambda d, es: (d["N"] * d["D"] + d["V"] * d["D"]) * es + 8 * d["N"] + 4,
    aten_ops=(),
    shape_of=lambda x, weight, targets, *a, **kw: {"N": x.shape[0], "D": x.shape[-1], "V": weight.shape[0]},
    reference_source=("F.cross_entropy((x @ weight.T).float(), targets, ignore_index=ignore_index,"
                      " reduction=reduction)\n"
                      "# x [N, D]; weight [V, D]; targets int64 [N]; a float32 scalar; never materialise [N, V]"),
))
