"""Row-wise kernel types: softmax, layernorm, rmsnorm, reduce, cross_entropy.

Each works on the last dim of its input. Sweeps include non-powers of two, rows longer than 1024 and
than 4096, a single column and a GPT-2 vocabulary (50257).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.kernel_types import model_views, structured
from harness.kernel_types.kernel_type import Case, KernelType
from harness.kernel_types.types.common import activation, cast, randn, row_dims, rows_cols

TYPES: list[KernelType] = []  # registered by harness.kernel_types.registry on first use

# Row counts stay small: the Triton interpreter pays per program (row), and more rows of the same
# width test nothing new. Widths carry the coverage.
ROW_SWEEP = [({"M": 11, "N": 1000}, {}), ({"M": 5, "N": 1025}, {}), ({"M": 3, "N": 4097}, {}),
             ({"M": 2, "N": 50257}, {}), ({"M": 6, "N": 777}, {}), ({"M": 24, "N": 256}, {}),
             # more rows than any other case (the CPU timing shape has 16): a kernel that leaves the
             # rows past some count alone fails here; narrow, so cheap on the interpreter
             ({"M": 130, "N": 33}, {})]
ROW_LAYOUTS = [("noncontig", {"M": 9, "N": 300}, {}), ("offset", {"M": 5, "N": 129}, {}),
               # x the q slice of a fused qkv projection (harness/kernel_types/model_views.py)
               (model_views.VARIANT, {"M": 6, "N": 100}, {}),
               # per head: rows of one position N apart, positions 3 * H * N apart (no one row stride)
               (model_views.VARIANT, {"B": 2, "S": 3, "H": 4, "N": 40}, {}),
               ("plain", {"M": 1, "N": 2048}, {}), ("plain", {"B": 2, "S": 3, "N": 96}, {})]
CPU_BENCH = {"M": 16, "N": 4096}

# bf16 has fp32's range, fp16 stops at 65504: a bf16 case at magnitudes only bf16 holds fails a kernel
# that stages bf16 values through fp16 (a scratch buffer, a cast "to save registers"), which every
# other case, near 1, passes. 1e20 for the types whose arithmetic subtracts the row maximum; 1e15 for
# the norms, whose fp32 statistics square it (1e30, well inside fp32).
BF16_RANGE = "scale:1e20"
BF16_RANGE_NORMS = "scale:1e15"


def structured_case(kernel_type: str, rows_dim: str, cols_dim: str) -> tuple:
    """The type's structured case (harness/kernel_types/structured.py), first in its stability
    stage: one row per kind of row, 100 columns (narrow: the interpreter pays per element; not a
    power of two: masks are exercised)."""
    return (structured.VARIANT, {rows_dim: structured.rows(kernel_type), cols_dim: 100}, ("float32", "float16"))


def _row_bytes(extra_vectors: int):
    def count(d: dict[str, int], es: int) -> float:
        m, n = rows_cols(d)
        return (2 * m * n + extra_vectors * n) * es
    return count


# ---------------------------------------------------------------- softmax
def _softmax_inputs(case: Case, gen: torch.Generator):
    return [cast(activation(case, gen), case)], {}


TYPES.append(KernelType(
    name="softmax",
    grad_params=("x",),
    params=("x",),
    defaults={},
    make_inputs=_softmax_inputs,
    reference=lambda x: torch.softmax(x.double(), dim=-1),
    eager=lambda x: torch.softmax(x, dim=-1),
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"M": 8, "N": 128},
    sweep=ROW_SWEEP + [({"M": 4, "N": 1}, {})],
    stability=[structured_case("softmax", "M", "N"),
               ("scale:100", {"M": 6, "N": 1000}, ("float32", "float16")),
               ("fp16max", {"M": 8, "N": 2000}, ("float32", "float16")),
               ("masked", {"M": 6, "N": 300}, ("float32", "float16")),
               ("mixed_rows", {"M": 7, "N": 513}, ("float32", "float16")),
               (BF16_RANGE, {"M": 6, "N": 300}, ("bfloat16",))],
    edge_cases=ROW_LAYOUTS + [("plain", {"M": 1, "N": 1}, {})],
    bench_shape={"M": 4096, "N": 32000},
    cpu_bench_shape=CPU_BENCH,
    flops=lambda d: 5.0 * rows_cols(d)[0] * rows_cols(d)[1],
    bytes=_row_bytes(0),
    aten_ops=("aten::softmax", "aten::_softmax", "aten::special_softmax"),
    shape_of=lambda x: row_dims(x),
    reference_source="torch.softmax(x, dim=-1)  # over the last dim, any number of leading dims",
))


# ---------------------------------------------------------------- layernorm
def _layernorm_inputs(case: Case, gen: torch.Generator):
    n = list(case.dims.values())[-1]
    x = activation(case, gen)
    weight = randn(gen, (n,), std=0.1, mean=1.0)
    bias = randn(gen, (n,), std=0.1)
    kwargs = {"eps": case.options["eps"]} if "eps" in case.options else {}
    return [cast(x, case), cast(weight, case), cast(bias, case)], kwargs


TYPES.append(KernelType(
    name="layernorm",
    grad_params=("x", "weight", "bias"),
    summed_grads=("weight", "bias"),
    params=("x", "weight", "bias", "eps"),
    defaults={"eps": 1e-5},
    make_inputs=_layernorm_inputs,
    reference=lambda x, w, b, eps=1e-5: F.layer_norm(x.double(), (x.shape[-1],), w.double(), b.double(), eps),
    eager=lambda x, w, b, eps=1e-5: F.layer_norm(x, (x.shape[-1],), w, b, eps),
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"M": 8, "N": 256},
    sweep=ROW_SWEEP,
    stability=[structured_case("layernorm", "M", "N"),
               ("scale:1e-4", {"M": 8, "N": 1000}, ("float32", "float16")),
               ("scale:1e-6", {"M": 8, "N": 1000}, ("float32",)),
               (BF16_RANGE_NORMS, {"M": 6, "N": 300}, ("bfloat16",)),
               ("offset_mean:1e3", {"M": 8, "N": 4097}, ("float32",)),
               ("scale:300", {"M": 8, "N": 2048}, ("float16",)),
               ("mixed_rows", {"M": 7, "N": 513}, ("float32", "float16"))],
    edge_cases=ROW_LAYOUTS + [("plain", {"M": 4, "N": 1}, {}), ("plain", {"M": 6, "N": 200}, {"eps": 1e-2})],
    bench_shape={"M": 16384, "N": 4096},
    cpu_bench_shape=CPU_BENCH,
    flops=lambda d: 8.0 * rows_cols(d)[0] * rows_cols(d)[1],
    bytes=_row_bytes(2),
    aten_ops=("aten::layer_norm", "aten::native_layer_norm"),
    shape_of=lambda x, *rest, **kw: row_dims(x),
    reference_source="F.layer_norm(x, (x.shape[-1],), weight, bias, eps)",
))


# ---------------------------------------------------------------- rmsnorm
def _rmsnorm_inputs(case: Case, gen: torch.Generator):
    n = list(case.dims.values())[-1]
    x = activation(case, gen)
    weight = randn(gen, (n,), std=0.1, mean=1.0)
    kwargs = {"eps": case.options["eps"]} if "eps" in case.options else {}
    return [cast(x, case), cast(weight, case)], kwargs


def _rmsnorm_ref(x, weight, eps=1e-6):
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()


def _rmsnorm_eager(x, weight, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight


TYPES.append(KernelType(
    name="rmsnorm",
    grad_params=("x", "weight"),
    summed_grads=("weight",),
    params=("x", "weight", "eps"),
    defaults={"eps": 1e-6},
    make_inputs=_rmsnorm_inputs,
    reference=_rmsnorm_ref,
    eager=_rmsnorm_eager,
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"M": 8, "N": 256},
    sweep=ROW_SWEEP,
    stability=[structured_case("rmsnorm", "M", "N"),
               ("scale:1e-4", {"M": 8, "N": 1000}, ("float32", "float16")),
               ("scale:1e-6", {"M": 8, "N": 1000}, ("float32",)),
               (BF16_RANGE_NORMS, {"M": 6, "N": 300}, ("bfloat16",)),
               ("scale:300", {"M": 8, "N": 2048}, ("float16",)),
               ("mixed_rows", {"M": 7, "N": 513}, ("float32", "float16"))],
    edge_cases=ROW_LAYOUTS + [("plain", {"M": 4, "N": 1}, {}), ("plain", {"M": 6, "N": 200}, {"eps": 1e-2})],
    bench_shape={"M": 16384, "N": 4096},
    cpu_bench_shape=CPU_BENCH,
    flops=lambda d: 5.0 * rows_cols(d)[0] * rows_cols(d)[1],
    bytes=_row_bytes(1),
    aten_ops=("aten::rms_norm", "aten::_fused_rms_norm"),
    shape_of=lambda x, *rest, **kw: row_dims(x),
    reference_source=("x32 = x.float()\n"
                      "y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * weight.float()\n"
                      "return y.to(x.dtype)  # statistics in fp32"),
))


# ---------------------------------------------------------------- reduce
def _reduce_inputs(case: Case, gen: torch.Generator):
    return [cast(activation(case, gen), case)], {}


def _row_norm_scale(args, ref: torch.Tensor) -> torch.Tensor:
    # the summation error of a row grows with the row's norm, not with its (possibly ~0) sum
    x = args[0].double()
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))
    return x.pow(2).sum(-1).sqrt().expand_as(ref)


TYPES.append(KernelType(
    name="reduce",
    grad_params=("x",),
    params=("x",),
    defaults={},
    make_inputs=_reduce_inputs,
    reference=lambda x: x.double().sum(-1),
    eager=lambda x: x.sum(-1, dtype=torch.float32).to(x.dtype),
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"M": 8, "N": 128},
    sweep=ROW_SWEEP + [({"M": 5, "N": 1}, {})],
    stability=[structured_case("reduce", "M", "N"),
               ("mixed_rows", {"M": 7, "N": 513}, ("float32", "float16")),
               ("overflow_rows", {"M": 6, "N": 64}, ("float16",)),
               ("cancel", {"M": 8, "N": 4000}, ("float32",)),
               (BF16_RANGE, {"M": 6, "N": 300}, ("bfloat16",))],
    edge_cases=ROW_LAYOUTS + [("plain", {"M": 1, "N": 1}, {})],
    bench_shape={"M": 16384, "N": 4096},
    cpu_bench_shape=CPU_BENCH,
    flops=lambda d: 1.0 * rows_cols(d)[0] * rows_cols(d)[1],
    bytes=lambda d, es: (rows_cols(d)[0] * rows_cols(d)[1] + rows_cols(d)[0]) * es,
    aten_ops=("aten::sum",),
    shape_of=lambda x: row_dims(x),
    reference_source="x.sum(-1, dtype=torch.float32).to(x.dtype)  # fp32 accumulation",
    error_scale=_row_norm_scale,
))


# ---------------------------------------------------------------- cross_entropy
def _ce_inputs(case: Case, gen: torch.Generator):
    n, v = case.dims["N"], case.dims["V"]
    logits = activation(case, gen)
    targets = torch.randint(0, v, (n,), generator=gen, dtype=torch.int64)
    return [cast(logits, case), targets], {}


TYPES.append(KernelType(
    name="cross_entropy",
    grad_params=("logits",),  # targets are integers
    params=("logits", "targets"),
    defaults={},
    make_inputs=_ce_inputs,
    reference=lambda logits, targets: F.cross_entropy(logits.double(), targets),
    eager=lambda logits, targets: F.cross_entropy(logits.float(), targets),
    out_dtype=lambda c: torch.float32,
    smoke_shape={"N": 8, "V": 128},
    sweep=[({"N": 4, "V": 10}, {}), ({"N": 11, "V": 1000}, {}), ({"N": 8, "V": 4097}, {}),
           ({"N": 3, "V": 50257}, {}), ({"N": 16, "V": 2}, {}), ({"N": 130, "V": 33}, {})],
    stability=[structured_case("cross_entropy", "N", "V"),
               ("scale:100", {"N": 6, "V": 1000}, ("float32", "float16")),
               ("fp16max", {"N": 8, "V": 2000}, ("float32", "float16")),
               ("mixed_rows", {"N": 7, "V": 513}, ("float32", "float16")),
               (BF16_RANGE, {"N": 6, "V": 300}, ("bfloat16",))],
    edge_cases=[("noncontig", {"N": 9, "V": 300}, {}), ("offset", {"N": 5, "V": 129}, {}),
                (model_views.VARIANT, {"N": 6, "V": 100}, {}),  # the first V columns of a padded vocabulary
                ("plain", {"N": 1, "V": 4096}, {})],
    bench_shape={"N": 4096, "V": 32000},
    cpu_bench_shape={"N": 8, "V": 32000},
    flops=lambda d: 4.0 * d["N"] * d["V"],
    bytes=lambda d, es: d["N"] * d["V"] * es + 8 * d["N"] + 4,
    aten_ops=("aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax",
              "aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss_forward"),
    shape_of=lambda logits, targets: {"N": logits.shape[0], "V": logits.shape[-1]},
    reference_source="F.cross_entropy(logits.float(), targets)  # mean over rows; float32 scalar",
))
