"""Attention-family kernel types: flash_attention and rotary_embedding, on [B, H, S, D] tensors."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness.kernel_types import model_views, structured
from harness.kernel_types.kernel_type import Case, KernelType
from harness.kernel_types.types.common import activation, cast, randn

TYPES: list[KernelType] = []  # registered by harness.kernel_types.registry on first use


# ---------------------------------------------------------------- flash_attention
def _attn_inputs(case: Case, gen: torch.Generator):
    b, h, s, d = (case.dims[k] for k in "BHSD")
    q = activation(case, gen, (b, h, s, d))
    k = activation(case, gen, (b, h, s, d))
    v = randn(gen, (b, h, s, d))
    return [cast(q, case), cast(k, case), cast(v, case)], dict(case.options)


def _attn_ref(q, k, v, causal=False, sm_scale=None):
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal,
                                          scale=sm_scale)


def _attn_eager(q, k, v, causal=False, sm_scale=None):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)


TYPES.append(KernelType(
    name="flash_attention",
    dot_products=True,
    grad_params=("q", "k", "v"),
    params=("q", "k", "v", "causal", "sm_scale"),
    defaults={"causal": False, "sm_scale": None},
    make_inputs=_attn_inputs,
    reference=_attn_ref,
    eager=_attn_eager,
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"B": 1, "H": 2, "S": 64, "D": 32},
    sweep=[({"B": 1, "H": 2, "S": 128, "D": 64}, {}), ({"B": 2, "H": 3, "S": 77, "D": 64}, {"causal": True}),
           ({"B": 1, "H": 2, "S": 200, "D": 128}, {}), ({"B": 1, "H": 1, "S": 33, "D": 16}, {"causal": True})],
    # first, chosen queries against repeated keys (harness/kernel_types/structured.py)
    stability=[(structured.VARIANT, {"B": 1, "H": 1, "S": 2 * structured.rows("flash_attention"), "D": 32},
                ("float32", "float16")),
               ("scale:8", {"B": 1, "H": 2, "S": 96, "D": 64}, ("float32", "float16")),
               ("mixed_rows", {"B": 1, "H": 2, "S": 70, "D": 32}, ("float32", "float16"))],
    edge_cases=[("plain", {"B": 1, "H": 1, "S": 1, "D": 32}, {}),
                # q a slice of a fused qkv projection, k and v the first positions of a KV cache
                (model_views.VARIANT, {"B": 1, "H": 2, "S": 16, "D": 32}, {}),
                ("plain", {"B": 1, "H": 2, "S": 65, "D": 64}, {"causal": True}),
                ("plain", {"B": 2, "H": 2, "S": 48, "D": 32}, {"sm_scale": 0.3}),
                ("plain", {"B": 1, "H": 2, "S": 50, "D": 64}, {"causal": True, "sm_scale": 0.05}),
                ("offset", {"B": 1, "H": 2, "S": 40, "D": 32}, {}),
                ("noncontig", {"B": 1, "H": 2, "S": 40, "D": 32}, {"causal": True})],
    bench_shape={"B": 4, "H": 32, "S": 2048, "D": 128},
    cpu_bench_shape={"B": 1, "H": 2, "S": 256, "D": 64},
    flops=lambda d: 4.0 * d["B"] * d["H"] * d["S"] * d["S"] * d["D"],
    bytes=lambda d, es: 4.0 * d["B"] * d["H"] * d["S"] * d["D"] * es,
    aten_ops=("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
              "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention",
              "aten::_scaled_dot_product_flash_attention_for_cpu"),
    shape_of=lambda q, k, v, *a, **kw: {"B": q.shape[0], "H": q.shape[1], "S": q.shape[2], "D": q.shape[3]},
    reference_source=("F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)\n"
                      "# q, k, v [B, H, S, D]; sm_scale None means 1/sqrt(D)"),
))


# ---------------------------------------------------------------- rotary_embedding
def _rope_tables(s: int, d: int, base: float = 10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(s, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().float(), emb.sin().float()


def _rope_inputs(case: Case, gen: torch.Generator):
    b, h, s, d = (case.dims[k] for k in "BHSD")
    x = activation(case, gen, (b, h, s, d))
    cos, sin = _rope_tables(s, d)
    return [cast(x, case), cast(cos, case), cast(sin, case)], {}


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


TYPES.append(KernelType(
    name="rotary_embedding",
    grad_params=("x",),  # cos and sin are the model's constants
    params=("x", "cos", "sin"),
    defaults={},
    make_inputs=_rope_inputs,
    reference=lambda x, cos, sin: x.double() * cos.double() + _rotate_half(x.double()) * sin.double(),
    eager=lambda x, cos, sin: x * cos + _rotate_half(x) * sin,
    out_dtype=lambda c: c.torch_dtype,
    smoke_shape={"B": 1, "H": 2, "S": 16, "D": 64},
    sweep=[({"B": 2, "H": 3, "S": 77, "D": 128}, {}), ({"B": 1, "H": 4, "S": 129, "D": 64}, {}),
           ({"B": 1, "H": 2, "S": 300, "D": 96}, {}), ({"B": 3, "H": 1, "S": 5, "D": 32}, {})],
    # first, chosen positions of x (harness/kernel_types/structured.py)
    stability=[(structured.VARIANT, {"B": 1, "H": 1, "S": structured.rows("rotary_embedding"), "D": 32},
                ("float32", "float16")),
               ("scale:1e3", {"B": 1, "H": 2, "S": 64, "D": 64}, ("float32", "float16")),
               ("mixed_rows", {"B": 1, "H": 2, "S": 35, "D": 64}, ("float32", "float16"))],
    edge_cases=[("plain", {"B": 1, "H": 1, "S": 1, "D": 32}, {}), ("noncontig", {"B": 1, "H": 2, "S": 20, "D": 64}, {}),
                # x a slice of a fused projection, cos and sin the first rows of longer tables
                (model_views.VARIANT, {"B": 1, "H": 2, "S": 8, "D": 32}, {}),
                ("offset", {"B": 2, "H": 2, "S": 9, "D": 32}, {}), ("plain", {"B": 1, "H": 1, "S": 7, "D": 2}, {})],
    bench_shape={"B": 4, "H": 32, "S": 2048, "D": 128},
    cpu_bench_shape={"B": 1, "H": 1, "S": 256, "D": 128},
    flops=lambda d: 3.0 * d["B"] * d["H"] * d["S"] * d["D"],
    bytes=lambda d, es: (2.0 * d["B"] * d["H"] * d["S"] * d["D"] + 2.0 * d["S"] * d["D"]) * es,
    aten_ops=(),  # recognised by module pattern (rotate-half code), not by one aten op
    shape_of=lambda x, cos, sin: {"B": x.shape[0], "H": x.shape[1], "S": x.shape[2], "D": x.shape[3]},
    reference_source=("x * cos + rotate_half(x) * sin\n"
                      "# rotate_half(x) = cat(-x[..., D/2:], x[..., :D/2]); x [B, H, S, D]; cos, sin [S, D]"),
))
