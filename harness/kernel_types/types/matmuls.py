"""Matrix-product kernel types: matmul and fused_mlp (the SwiGLU MLP of LLaMA-style models)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from harness.kernel_types import model_views, structured
from harness.kernel_types.kernel_type import Case, KernelType
from harness.kernel_types.types.common import activation, cast, randn

TYPES: list[KernelType] = []  # registered by harness.kernel_types.registry on first use


# ---------------------------------------------------------------- matmul
def _matmul_inputs(case: Case, gen: torch.Generator):
    m, k, n = case.dims["M"], case.dims["K"], case.dims["N"]
    a = activation(case, gen, (m, k))
    b = randn(gen, (k, n), std=1.0 / math.sqrt(k))
    return [cast(a, case), cast(b, case)], {}


TYPES.append(KernelType(
    name="matmul",
    dot_products=True,
    grad_params=("a", "b"),
    summed_grads=("b",),
    params=("a", "b"),
    defaults={},
    make_inputs=_matmul_inputs,
    reference=lambda a, b: a.double() @ b.double(),
    eager=lambda a, b: a @ b,
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"M": 32, "K": 48, "N": 40},
    sweep=[({"M": 64, "K": 64, "N": 64}, {}), ({"M": 127, "K": 65, "N": 33}, {}),
           ({"M": 1, "K": 128, "N": 256}, {}), ({"M": 200, "K": 96, "N": 129}, {}),
           ({"M": 16, "K": 1100, "N": 24}, {})],
    # first, chosen rows of a against a quantised weight (harness/kernel_types/structured.py)
    stability=[(structured.VARIANT, {"M": structured.rows("matmul"), "K": 48, "N": 40}, ("float32", "float16")),
               ("mixed_rows", {"M": 28, "K": 256, "N": 64}, ("float32", "float16")),
               ("scale:1e-3", {"M": 32, "K": 128, "N": 48}, ("float32", "float16")),
               ("scale:30", {"M": 32, "K": 512, "N": 48}, ("float32", "float16"))],
    edge_cases=[("transposed", {"M": 40, "K": 72, "N": 56}, {}), ("offset", {"M": 33, "K": 64, "N": 17}, {}),
                # a: a slice of a wider activation, b: an nn.Linear weight transposed
                (model_views.VARIANT, {"M": 8, "K": 48, "N": 40}, {}),
                ("noncontig", {"M": 20, "K": 40, "N": 24}, {}), ("plain", {"M": 1, "K": 1, "N": 1}, {}),
                ("plain", {"M": 5, "K": 1, "N": 7}, {})],
    bench_shape={"M": 4096, "K": 4096, "N": 4096},
    cpu_bench_shape={"M": 256, "K": 256, "N": 256},
    flops=lambda d: 2.0 * d["M"] * d["N"] * d["K"],
    bytes=lambda d, es: (d["M"] * d["K"] + d["K"] * d["N"] + d["M"] * d["N"]) * es,
    aten_ops=("aten::mm", "aten::matmul", "aten::linear", "aten::addmm"),
    shape_of=lambda a, b: {"M": math.prod(a.shape[:-1]), "K": a.shape[-1], "N": b.shape[-1]},
    reference_source="a @ b  # a [M, K], b [K, N]; output dtype = a.dtype",
))


# ---------------------------------------------------------------- fused_mlp
def _mlp_inputs(case: Case, gen: torch.Generator):
    m, d, f = case.dims["M"], case.dims["D"], case.dims["F"]
    x = activation(case, gen, (m, d))
    w_gate = randn(gen, (f, d), std=1.0 / math.sqrt(d))
    w_up = randn(gen, (f, d), std=1.0 / math.sqrt(d))
    w_down = randn(gen, (d, f), std=1.0 / math.sqrt(f))
    return [cast(t, case) for t in (x, w_gate, w_up, w_down)], {}


def _mlp_ref(x, w_gate, w_up, w_down):
    x, w_gate, w_up, w_down = (t.double() for t in (x, w_gate, w_up, w_down))
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def _mlp_eager(x, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


TYPES.append(KernelType(
    name="fused_mlp",
    dot_products=True,
    grad_params=("x", "w_gate", "w_up", "w_down"),
    summed_grads=("w_gate", "w_up", "w_down"),
    params=("x", "w_gate", "w_up", "w_down"),
    defaults={},
    make_inputs=_mlp_inputs,
    reference=_mlp_ref,
    eager=_mlp_eager,
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"M": 16, "D": 64, "F": 128},
    sweep=[({"M": 33, "D": 96, "F": 176}, {}), ({"M": 1, "D": 128, "F": 344}, {}),
           ({"M": 64, "D": 256, "F": 688}, {}), ({"M": 7, "D": 40, "F": 72}, {})],
    stability=[(structured.VARIANT, {"M": structured.rows("fused_mlp"), "D": 32, "F": 48}, ("float32", "float16")),
               ("scale:4", {"M": 16, "D": 64, "F": 128}, ("float32", "float16")),
               ("mixed_rows", {"M": 14, "D": 64, "F": 160}, ("float32",))],
    edge_cases=[("noncontig", {"M": 12, "D": 64, "F": 96}, {}), ("offset", {"M": 9, "D": 48, "F": 80}, {}),
                (model_views.VARIANT, {"M": 7, "D": 32, "F": 48}, {}),  # x: a slice of a wider activation
                ("plain", {"M": 1, "D": 16, "F": 16}, {})],
    bench_shape={"M": 4096, "D": 4096, "F": 11008},
    cpu_bench_shape={"M": 32, "D": 128, "F": 344},
    flops=lambda d: 6.0 * d["M"] * d["D"] * d["F"] + 4.0 * d["M"] * d["F"],
    bytes=lambda d, es: (2 * d["M"] * d["D"] + 3 * d["D"] * d["F"]) * es,
    aten_ops=(),  # recognised by module pattern (gate/up/SiLU/product/down), not by one aten op
    shape_of=lambda x, w_gate, w_up, w_down: {"M": math.prod(x.shape[:-1]), "D": x.shape[-1],
                                              "F": w_gate.shape[0]},
    reference_source=("# x [M, D]; w_gate, w_up [F, D]; w_down [D, F] (nn.Linear layout)\n"
                      "(F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T"),
))
