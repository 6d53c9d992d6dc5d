"""What a kernel type's call looks like inside a model, in plain PyTorch.

- `DIMS`: the registry's named dims of a kernel_fn call (tests hold them equal to harness/kernel_types/registry.py).
- `REFERENCES`: each type's meaning in PyTorch, in fp32 or better, for binding checks and selftests.
- `OPS`: the torch callables a winner's type may stand in for (F.linear, torch.matmul and @, softmax,
  sum, layer_norm, rms_norm, scaled_dot_product_attention, cross_entropy), each with a parser that
  turns one call into a `Request` (or None: not this type's call, e.g. a softmax over dim 0).
  F.linear's bias, when it has one, is added to the matmul kernel's output by bias.py (Triton).
- `FORMS`: rules that read a hand-written form's call (an RMSNorm module's forward(x), a SwiGLU
  module, rotary (x, cos, sin) or (q, k, cos, sin), attention (q, k, v); a decoder layer and a
  causal LM's loss for the chains they hold: chain_forms.py) as Requests. A rule is a guess; the
  router keeps it only if `reference(...)` reproduces the original's output.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from .chain_calls import DIMS as CHAIN_DIMS, REFERENCES as CHAIN_REFERENCES
from .chain_forms import causal_lm_loss, decoder_layer
from .requests import EPS_NAMES, Request, first as _first, is_float as _is_float, plain as _plain

def _rows(x: torch.Tensor, last: str = "N") -> dict:
    return {"M": math.prod(x.shape[:-1]), last: x.shape[-1]}


# The registry's named dims of a kernel_fn call (tests check these against harness/kernel_types/registry.py).
DIMS: dict[str, Callable[..., dict]] = {
    "matmul": lambda a, b: {"M": math.prod(a.shape[:-1]), "K": a.shape[-1], "N": b.shape[-1]},
    "softmax": lambda x: _rows(x),
    "reduce": lambda x: _rows(x),
    "layernorm": lambda x, *rest: _rows(x),
    "rmsnorm": lambda x, *rest: _rows(x),
    "cross_entropy": lambda logits, targets: {"N": logits.shape[0], "V": logits.shape[-1]},
    "flash_attention": lambda q, *rest: dict(zip("BHSD", q.shape)),
    "rotary_embedding": lambda x, *rest: dict(zip("BHSD", x.shape)),
    "fused_mlp": lambda x, w_gate, w_up, w_down: {"M": math.prod(x.shape[:-1]), "D": x.shape[-1],
                                                  "F": w_gate.shape[0]},
    **CHAIN_DIMS,
}


def _up(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rmsnorm_ref(x, weight, eps=1e-6):
    x = _up(x)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * _up(weight)


def _mlp_ref(x, w_gate, w_up, w_down):
    x = _up(x)
    return (F.silu(x @ _up(w_gate).T) * (x @ _up(w_up).T)) @ _up(w_down).T


# Each kernel type's meaning in plain PyTorch, in fp32 or better (float64 inputs stay float64).
REFERENCES: dict[str, Callable[..., torch.Tensor]] = {
    "matmul": lambda a, b: _up(a) @ _up(b),
    "softmax": lambda x: torch.softmax(_up(x), dim=-1),
    "reduce": lambda x: _up(x).sum(-1),
    "layernorm": lambda x, w, b, eps=1e-5: F.layer_norm(_up(x), x.shape[-1:], _up(w), _up(b), eps),
    "rmsnorm": _rmsnorm_ref,
    "cross_entropy": lambda logits, targets: F.cross_entropy(_up(logits), targets),
    "flash_attention": lambda q, k, v, causal=False, sm_scale=None: F.scaled_dot_product_attention(
        _up(q), _up(k), _up(v), is_causal=causal, scale=sm_scale),
    "rotary_embedding": lambda x, cos, sin: _up(x) * _up(cos) + _rotate_half(_up(x)) * _up(sin),
    "fused_mlp": _mlp_ref,
    **CHAIN_REFERENCES,
}


def label(kernel_type: str, dims: dict, dtype: str, causal: Optional[bool] = None) -> str:
    extra = ",causal" if causal else ""
    return f"{kernel_type}[{'x'.join(str(v) for v in dims.values())}:{dtype}{extra}]"


# ---------------------------------------------------------------- ops: a torch call -> a Request
def _params(args: tuple, kwargs: dict, names: tuple, defaults: dict) -> dict:
    values = dict(defaults)
    values.update(zip(names, args))
    values.update(kwargs)
    return values


def _last_dim(dim: Any, ndim: int) -> bool:
    if isinstance(dim, (list, tuple)):
        dim = dim[0] if len(dim) == 1 else None
    return isinstance(dim, int) and dim in (-1, ndim - 1)


def _as_rows(args: tuple) -> tuple:
    """A product's left operand as the 2-D matrix the kernel takes (a view when the layout allows)."""
    a, *rest = args
    return (a.reshape(-1, a.shape[-1]), *rest)


def _product(a: Any, b: Any, bias: Optional[torch.Tensor] = None) -> Optional[Request]:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.dim() < 2 or b.dim() != 2:
        return None  # a batched or vector product is not the 2-D matmul type
    lead, n = a.shape[:-1], b.shape[-1]
    if bias is None:
        return Request("matmul", (a, b), prepare=_as_rows, finish=lambda out: out.view(*lead, n))

    def finish(out: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # Inductor fuses the add into the graph around the kernel
            return (out + bias).view(*lead, n)
        from .bias import add_bias  # Triton, imported when first needed
        return add_bias(out, bias).view(*lead, n)
    odd = not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,) or bias.dtype != a.dtype \
        or bias.device != a.device
    return Request("matmul", (a, b), prepare=_as_rows, finish=finish, op="F.linear+bias",
                   blocker="a bias of another shape, dtype or device" if odd else "")


def _linear(args, kwargs):
    if len(args) == 3 and not kwargs:  # an nn.Linear's own call: the common case, without the dict
        p = {"input": args[0], "weight": args[1], "bias": args[2]}
    else:
        p = _params(args, kwargs, ("input", "weight", "bias"), {"bias": None})
    weight = p["weight"]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return None
    # nn.Linear computes x @ W.T (+ bias): the kernel's b is the transposed view of the weight
    return _product(p["input"], weight.t(), p["bias"])


def _matmul(args, kwargs):
    p = _params(args, kwargs, ("input", "other"), {})
    return _product(p["input"], p.get("other", p.get("mat2")))


def _rowwise(kernel_type: str, names: tuple, defaults: dict):
    def parse(args, kwargs):
        p = _params(args, kwargs, names, defaults)
        x = p["input"]
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not _last_dim(p.get("dim"), x.dim()):
            return None  # over another dim, or over everything: not this type
        blocker = "a dtype= cast" if p.get("dtype") not in (None, x.dtype) else ""
        keep = p.get("keepdim", False)
        return Request(kernel_type, (x,), blocker=blocker, finish=(lambda out: out.unsqueeze(-1)) if keep else (lambda out: out))
    return parse


def _norm(kernel_type: str):
    names = ("input", "normalized_shape", "weight", "bias", "eps") if kernel_type == "layernorm" else \
        ("input", "normalized_shape", "weight", "eps")

    def parse(args, kwargs):
        p = _params(args, kwargs, names, {"weight": None, "bias": None, "eps": None})
        x = p["input"]
        if not isinstance(x, torch.Tensor) or tuple(p["normalized_shape"]) != (x.shape[-1],):
            return None
        params = (p["weight"], p["bias"]) if kernel_type == "layernorm" else (p["weight"],)
        eps = p["eps"] if p["eps"] is not None else (1e-5 if kernel_type == "layernorm" else torch.finfo(x.dtype).eps)
        missing = any(t is None for t in params)
        return Request(kernel_type, (x, *params), {"eps": float(eps)},
                       blocker="no affine weight (or bias): the kernel takes them" if missing else "")
    return parse


def _attention(args, kwargs):
    p = _params(args, kwargs, ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
                {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "scale": None, "enable_gqa": False})
    q, k, v = p["query"], p["key"], p["value"]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        return None
    blocker = ("an attn_mask" if p["attn_mask"] is not None else "dropout" if p["dropout_p"] else
               "grouped-query heads" if p["enable_gqa"] else
               "k/v shapes differ from q's" if not (k.shape == q.shape == v.shape) else "")
    kw = {"causal": bool(p["is_causal"])}
    if p["scale"] is not None:
        kw["sm_scale"] = float(p["scale"])
    return Request("flash_attention", (q, k, v), kw, blocker=blocker, causal=bool(p["is_causal"]))


def _cross_entropy(args, kwargs):
    p = _params(args, kwargs, ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
                               "label_smoothing"),
                {"weight": None, "size_average": None, "ignore_index": -100, "reduce": None, "reduction": "mean",
                 "label_smoothing": 0.0})
    logits, targets = p["input"], p["target"]
    if not (isinstance(logits, torch.Tensor) and isinstance(targets, torch.Tensor)) or logits.dim() != 2 \
            or targets.dim() != 1 or targets.dtype != torch.int64:
        return None
    blocker = ("class weights" if p["weight"] is not None else "reduction other than mean"
               if p["reduction"] != "mean" or p["size_average"] is not None or p["reduce"] is not None
               else "label smoothing" if p["label_smoothing"] else "")
    ignore, dtype = p["ignore_index"], logits.dtype
    finish = lambda out: out.to(dtype)  # noqa: E731
    if blocker or torch.compiler.is_compiling():  # no data-dependent rows in a traced graph
        return Request("cross_entropy", (logits, targets), blocker=blocker, finish=finish,
                       late_check=lambda: "ignored targets (ignore_index)" if bool((targets == ignore).any()) else "")
    keep = targets != ignore
    if not bool(keep.all()):  # a host sync, once a loss: a causal LM's shifted labels always end ignored
        if not bool(keep.any()):
            blocker = "every target ignored (ignore_index)"  # PyTorch's mean is 0/0 there
        else:  # the mean over the targets kept is the mean over their rows alone; autograd scatters
            # their gradients back, zero at the ignored rows, as PyTorch's are
            logits, targets = logits[keep], targets[keep]
    return Request("cross_entropy", (logits, targets), blocker=blocker, finish=finish)


_SOFTMAX = _rowwise("softmax", ("input", "dim", "dtype"), {"dim": None, "dtype": None})
_SUM = _rowwise("reduce", ("input", "dim", "keepdim"), {"dim": None, "keepdim": False, "dtype": None})
# torch callables -> (op name in the tally, parser); binding.py says where each one lives
OPS: dict[Any, tuple[str, Callable]] = {
    F.linear: ("F.linear", _linear),
    torch.matmul: ("torch.matmul", _matmul), torch.Tensor.matmul: ("torch.matmul", _matmul),
    torch.Tensor.__matmul__: ("torch.matmul", _matmul), torch.mm: ("torch.mm", _matmul),
    torch.Tensor.mm: ("torch.mm", _matmul),
    F.softmax: ("softmax", _rowwise("softmax", ("input", "dim", "_stacklevel", "dtype"), {"dim": None, "dtype": None})),
    torch.softmax: ("softmax", _SOFTMAX), torch.Tensor.softmax: ("softmax", _SOFTMAX),
    torch.sum: ("torch.sum", _SUM), torch.Tensor.sum: ("torch.sum", _SUM),
    F.layer_norm: ("F.layer_norm", _norm("layernorm")),
    F.scaled_dot_product_attention: ("F.scaled_dot_product_attention", _attention),
    F.cross_entropy: ("F.cross_entropy", _cross_entropy),
}
if hasattr(F, "rms_norm"):  # torch >= 2.4
    OPS[F.rms_norm] = ("F.rms_norm", _norm("rmsnorm"))


# ---------------------------------------------------------------- forms: a callable's call -> Requests
def _rmsnorm_module(owner, args, kwargs):
    if owner is None or kwargs or len(args) != 1 or not _is_float(args[0]):
        return None
    x = args[0]
    weights = [p for p in owner._parameters.values() if p is not None and p.dim() == 1 and p.shape[0] == x.shape[-1]]
    if len(weights) != 1:
        return None
    eps = next((float(v) for v in (getattr(owner, n, None) for n in EPS_NAMES)
                if isinstance(v, (int, float)) and not isinstance(v, bool)), 1e-6)
    return [Request("rmsnorm", (x, weights[0]), {"eps": eps})], _first


def _rmsnorm_function(owner, args, kwargs):
    if kwargs or len(args) not in (2, 3) or not (_is_float(args[0]) and _is_float(args[1])) \
            or tuple(args[1].shape) != tuple(args[0].shape[-1:]):
        return None
    eps = args[2] if len(args) == 3 else 1e-6
    if not isinstance(eps, (int, float)):
        return None
    return [Request("rmsnorm", (args[0], args[1]), {"eps": float(eps)})], _first


PERMUTATIONS = ((0, 1, 2), (1, 0, 2), (0, 2, 1), (2, 0, 1), (1, 2, 0), (2, 1, 0))


def _mlp_module(order: int):
    """A SwiGLU module's three bias-free nn.Linear children taken as (gate, up, down) in one of the
    six orders; the binding check keeps the order that reproduces the module."""
    def rule(owner, args, kwargs):
        if owner is None or kwargs or len(args) != 1 or not _is_float(args[0]):
            return None
        x = args[0]
        linears = [m.weight for m in owner.children() if isinstance(m, torch.nn.Linear) and m.bias is None]
        if len(linears) != 3:
            return None
        gate, up, down = [linears[i] for i in PERMUTATIONS[order]]
        if gate.shape != up.shape or gate.shape[1] != x.shape[-1] or tuple(down.shape) != tuple(gate.shape)[::-1]:
            return None
        lead, d = x.shape[:-1], x.shape[-1]
        return [Request("fused_mlp", (x, gate, up, down), prepare=_as_rows,
                        finish=lambda out: out.view(*lead, d))], _first
    return rule


def _table(t: Any, s: int, d: int) -> Optional[torch.Tensor]:
    """A cos/sin table as the [S, D] the kernel takes: [S, D], [1, S, D] and [1, 1, S, D] views."""
    if not _is_float(t) or t.dim() < 2 or t.numel() != s * d or tuple(t.shape[-2:]) != (s, d):
        return None
    return t.reshape(s, d)


def _rotary_one(x: Any, cos: Any, sin: Any) -> Optional[Request]:
    if not _is_float(x) or not 2 <= x.dim() <= 4:
        return None
    s, d = x.shape[-2:]
    c, n = _table(cos, s, d), _table(sin, s, d)
    if c is None or n is None:
        return None
    x4 = x.reshape(*([1] * (4 - x.dim())), *x.shape)  # [S, D] and [H, S, D] as [B, H, S, D] views
    shape = x.shape
    return Request("rotary_embedding", (x4, c, n), finish=lambda out: out.view(shape))


def _rotary_x(owner, args, kwargs):
    if len(args) < 3 or not _plain(list(args[3:]) + list(kwargs.values())):
        return None
    r = _rotary_one(*args[:3])
    return ([r], _first) if r else None


def _rotary_qk(owner, args, kwargs):
    if len(args) < 4 or not _plain(list(args[4:]) + list(kwargs.values())):
        return None
    rq, rk = _rotary_one(args[0], args[2], args[3]), _rotary_one(args[1], args[2], args[3])
    return ([rq, rk], tuple) if rq and rk else None


def _rotary_pair(owner, args, kwargs):
    """apply_rotary_pos_emb(q, k, cos, sin): the rotary_qk chain, q and k in one launch."""
    if len(args) < 4 or not _plain(list(args[4:]) + list(kwargs.values())):
        return None
    q, k, cos, sin = args[:4]
    if not (_is_float(q) and _is_float(k) and q.dim() == k.dim() == 4 and q.dtype == k.dtype
            and q.shape[0] == k.shape[0] and q.shape[2:] == k.shape[2:]):
        return None
    s, d = q.shape[-2:]
    c, n = _table(cos, s, d), _table(sin, s, d)
    if c is None or n is None:
        return None
    heads = q.shape[1]
    return [Request("rotary_qk", (q, k, c, n), finish=lambda out: (out[:, :heads], out[:, heads:]))], _first


def _silu_mul_module(owner, args, kwargs):
    """A gated MLP's forward(x) = down(act(gate(x)) * up(x)) with transformers' layer names and a
    SiLU act: the silu_mul chain between its projections, which stay the module's own."""
    if owner is None or kwargs or len(args) != 1 or not _is_float(args[0]):
        return None
    parts = [getattr(owner, n, None) for n in ("gate_proj", "up_proj", "down_proj", "act_fn")]
    if any(p is None for p in parts) or not isinstance(parts[3], (torch.nn.SiLU,)) \
            and type(parts[3]).__name__ != "SiLUActivation":
        return None
    gate, up, down, _ = parts
    x = args[0]
    return [Request("silu_mul", (gate(x), up(x)))], lambda outs: down(outs[0])


def _attention_form(causal: bool):
    def rule(owner, args, kwargs):
        if kwargs or len(args) != 3 or not all(_is_float(t) and t.dim() == 4 for t in args) \
                or not args[0].shape == args[1].shape == args[2].shape:
            return None
        return [Request("flash_attention", tuple(args), {"causal": causal}, causal=causal)], _first
    return rule


def _cross_entropy_form(owner, args, kwargs):
    r = _cross_entropy(args, {}) if len(args) == 2 and not kwargs else None
    return ([r], _first) if r else None


FORMS: dict[str, tuple] = {
    "rmsnorm": (_rmsnorm_module, _rmsnorm_function),
    "fused_mlp": tuple(_mlp_module(i) for i in range(len(PERMUTATIONS))),
    "rotary_embedding": (_rotary_x, _rotary_qk),
    "flash_attention": (_attention_form(False), _attention_form(True)),
    "cross_entropy": (_cross_entropy_form,),
    "rotary_qk": (_rotary_pair,),
    "silu_mul": (_silu_mul_module,),
    "add_rmsnorm": (decoder_layer,),
    "linear_cross_entropy": (causal_lm_loss,),
}


def reference(requests: list[Request], assemble: Callable) -> Any:
    return assemble([r.finish(REFERENCES[r.kernel_type](*r.kernel_args(), **r.kwargs)) for r in requests])


AUTOGRAD = "autograd: the kernel has no backward (run under torch.no_grad or inference_mode)"
CONSTANT = "autograd: a gradient for an input the kernel's backward treats as a constant"


def needs_grad(args: tuple) -> bool:
    """Whether autograd records a call with these arguments."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in args)


def unsafe(args: tuple, kernel_type: str = "") -> str:
    """Why a call a winner matches must still run in PyTorch (a loop, not sets: it runs per call).
    Under autograd: AUTOGRAD, unless a gradient is asked only of the parameters a backward gives
    (ops.GRAD_PARAMS; then CONSTANT names the rest); the router then asks whether the winner has one."""
    grad, device, dtype, recorded = torch.is_grad_enabled(), None, None, ""
    differentiable = GRAD_POSITIONS.get(kernel_type)  # None: no backward contract (a module's ModelNew)
    for i, t in enumerate(args):
        if not isinstance(t, torch.Tensor):
            continue
        if grad and t.requires_grad and recorded != CONSTANT:
            recorded = AUTOGRAD if differentiable is None or i in differentiable else CONSTANT
        if device is None:
            device = t.device
        elif t.device != device:
            return "tensors on different devices"
        if t.is_floating_point():
            if dtype is None:
                dtype = t.dtype
            elif t.dtype != dtype:
                return "mixed dtypes"
    return recorded


def _grad_positions() -> dict[str, tuple[int, ...]]:
    from .ops import SCHEMAS, grad_positions
    return {kernel_type: grad_positions(kernel_type) for kernel_type in SCHEMAS}


GRAD_POSITIONS = _grad_positions()
