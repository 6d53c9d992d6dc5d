"""Recognising kernel types in a profile: single aten ops through the registry, and the common
hand-written forms by the ops they run (a structural signature, not a class name): RMSNorm (pow,
mean, rsqrt, mul), rotate-half rotary (neg, cat and the muls around them), a gate/up/SiLU/product/
down MLP, explicit q·kᵀ → mask → softmax → ·v attention, and log_softmax followed by nll_loss.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from harness.kernel_types import registry

# Views, casts and allocations: free on a GPU, skipped when matching a form.
GLUE = {"view", "reshape", "_reshape_alias", "_unsafe_view", "to", "_to_copy", "type_as", "contiguous",
        "unsqueeze", "squeeze", "transpose", "t", "permute", "expand", "expand_as", "as_strided", "slice",
        "select", "narrow", "chunk", "split", "split_with_sizes", "unbind", "detach", "alias", "clone",
        "empty", "empty_like", "empty_strided", "copy_", "size", "dropout", "lift_fresh", "resolve_conj"}
MASKING = {"mul", "div", "masked_fill", "masked_fill_", "add", "add_", "where", "eq", "ne", "lt", "gt",
           "logical_not", "sub", "rsub", "tril", "triu", "ones", "full", "scalar_tensor", "arange"}
DTYPE_OF = {"float": "float32", "c10::Half": "float16", "c10::BFloat16": "bfloat16", "double": "float64"}
# Ops the registry lists under cross_entropy that mean something else when they stand alone.
PAIRED_ONLY = {"aten::log_softmax", "aten::_log_softmax", "aten::nll_loss", "aten::nll_loss_nd",
               "aten::nll_loss_forward"}


@dataclass
class Node:
    """One op or one module call, with its children in call order."""

    name: str
    self_us: float
    shapes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    concrete: list = field(default_factory=list)
    children: list["Node"] = field(default_factory=list)
    module: Optional[tuple[str, str]] = None  # (qualified name, class name) for a module call
    # autograd's (forward thread, sequence number): a forward op's names the backward node it
    # recorded; a backward node's (autograd::engine::evaluate_function: ...) names that forward op
    seq: Optional[tuple[int, int]] = None

    @property
    def kind(self) -> str:
        return "module" if self.module else self.name.split("::")[-1]

    @property
    def total_us(self) -> float:
        return self.self_us + sum(c.total_us for c in self.children)

    def face(self) -> "Node":
        """What a one-op module (nn.Linear, nn.SiLU) looks like from outside: that op."""
        if not self.module:
            return self
        real = [c for c in self.children if c.kind not in GLUE]
        return real[0].face() if len(real) == 1 else self

    def op_names(self) -> set[str]:
        """The aten ops this call covers, views and casts left out."""
        names = set() if self.module or self.kind in GLUE else {self.name}
        for c in self.children:
            names |= c.op_names()
        return names


@dataclass
class Call:
    """One recognised call of a kernel type: what it covers and its kernel_fn-style shapes."""

    kernel_type: str
    op: str
    args: list[list[int]]  # the kernel_fn arguments' shapes, in the type's signature order
    dtype: str
    nodes: list[Node]
    route: str = "op"
    causal: Optional[bool] = None
    shapes: Optional[list] = None  # as recorded; default: args


# ---------------------------------------------------------------- one op -> a kernel type
@functools.lru_cache(maxsize=1)
def op_types() -> dict[str, str]:
    return {op: t for t in registry.names() for op in registry.get(t).aten_ops if op not in PAIRED_ONLY}


def map_op(node: Node) -> Optional[Call]:
    kernel_type = op_types().get(node.name)
    s = node.shapes
    if kernel_type is None or len(s) < 2 or not s[0]:  # every mapped op has a tensor and one more argument
        return None
    dtype = node_dtype(node)
    recorded = [x for x in s if x]
    if kernel_type == "matmul":
        a, b = (s[1], s[2]) if node.kind == "addmm" else (s[0], s[1])
        if node.kind == "linear":
            b = b[::-1]
        if len(a) < 2 or len(b) != 2:
            return None  # batched products are not the registry's 2-D matmul
        args = [a, b]
    elif kernel_type in ("softmax", "reduce"):
        dim = node.concrete[1] if len(node.concrete) > 1 else None
        dim = dim[0] if isinstance(dim, list) and len(dim) == 1 else dim
        if dim not in (-1, len(s[0]) - 1):
            return None
        args = [s[0]]
    elif kernel_type in ("layernorm", "rmsnorm"):
        normalized = node.concrete[1] if len(node.concrete) > 1 else None
        if isinstance(normalized, list) and len(normalized) != 1:
            return None
        args = [s[0]] + [x for x in s[2:] if x][:2 if kernel_type == "layernorm" else 1]
    elif kernel_type == "flash_attention":
        if any(len(x) != 4 for x in s[:3]):
            return None
        causal = node.concrete[5] if node.kind == "scaled_dot_product_attention" and len(node.concrete) > 5 else None
        return Call(kernel_type, node.name, s[:3], dtype, [node], causal=causal, shapes=recorded)
    else:  # cross_entropy
        if len(s[0]) != 2:
            return None
        args = [s[0], s[1]]
    return Call(kernel_type, node.name, args, dtype, [node], shapes=recorded)


def node_dtype(node: Node) -> str:
    first = node.dtypes[0] if node.dtypes else ""
    return DTYPE_OF.get(first, first)


# ---------------------------------------------------------------- hand-written forms
class Cursor:
    """Walks a scope's children, skipping views and casts between the ops a form is made of."""

    def __init__(self, nodes: list[Node], i: int):
        self.nodes, self.i = nodes, i

    def take(self, *kinds: str, cond: Callable[[Node], bool] = lambda n: True) -> Optional[Node]:
        j = self.i
        while j < len(self.nodes) and self.nodes[j].face().kind in GLUE and self.nodes[j].face().kind not in kinds:
            j += 1
        if j < len(self.nodes) and self.nodes[j].face().kind in kinds and cond(self.nodes[j].face()):
            self.i = j + 1
            return self.nodes[j].face()
        return None


def find_forms(nodes: list[Node], module: Optional[torch.nn.Module]) -> list[Call]:
    found, i = [], 0
    while i < len(nodes):
        for form in FORMS:
            cursor = Cursor(nodes, i)
            call = form(cursor, module)
            if call is not None:
                call.nodes = nodes[i:cursor.i]
                call.route = "pattern"
                found.append(call)
                i = cursor.i
                break
        else:
            i += 1
    return found


def _rmsnorm(c: Cursor, module: Any) -> Optional[Call]:
    sq = c.take("pow") or c.take("mul", cond=lambda n: len(n.shapes) > 1 and n.shapes[0] == n.shapes[1])
    if not sq or not c.take("mean"):
        return None
    c.take("add")  # + eps
    if c.take("rsqrt"):
        if not c.take("mul"):
            return None
    elif not (c.take("sqrt") and c.take("div")):
        return None
    x = sq.shapes[0]
    weight = c.take("mul", cond=lambda n: [x[-1]] in n.shapes)
    args = [x, [x[-1]]] if weight else [x]
    # the statistics may run in fp32 on an fp16 model: the weight product has the model's dtype
    return Call("rmsnorm", "RMSNorm (pow, mean, rsqrt, mul)", args, node_dtype(weight or sq), [])


def _rotary(c: Cursor, module: Any) -> Optional[Call]:
    first = c.take("mul", cond=lambda n: len(n.shapes[0]) >= 3)
    neg = c.take("neg")
    if not neg or not c.take("cat"):
        return None
    rot = c.take("mul", cond=lambda n: n.shapes[0][-1] == 2 * neg.shapes[0][-1])
    if not rot or (first and first.shapes[0] != rot.shapes[0]):
        return None
    first = first or c.take("mul", cond=lambda n: n.shapes[0] == rot.shapes[0])
    c.take("add")
    x = rot.shapes[0]
    x4 = [1] * (4 - len(x)) + x if len(x) <= 4 else [math.prod(x[:-3])] + x[-3:]
    cos = first.shapes[1] if first else rot.shapes[1]
    return Call("rotary_embedding", "rotate-half rotary (mul, neg, cat, mul, add)", [x4, cos, rot.shapes[1]],
                node_dtype(rot), [], shapes=[x, cos, rot.shapes[1]])


def _mlp(c: Cursor, module: Any) -> Optional[Call]:
    gate = c.take("linear")
    act = gate and c.take("silu")
    up = gate and c.take("linear")
    act = act or (up and c.take("silu"))
    if not (act and up and c.take("mul")):
        return None
    down = c.take("linear")
    x, wg, wu = gate.shapes[0], gate.shapes[1], up.shapes[1]
    if not down or wg != wu or down.shapes[1] != wg[::-1] or up.shapes[0] != x:
        return None
    return Call("fused_mlp", "SwiGLU MLP (gate, up, silu, mul, down)", [x, wg, wu, down.shapes[1]],
                node_dtype(gate), [])


def _batched(n: Node) -> bool:
    return len(n.shapes) >= 2 and len(n.shapes[0]) >= 3 and len(n.shapes[1]) >= 3


def _attention(c: Cursor, module: Any) -> Optional[Call]:
    qk = c.take("matmul", "bmm", cond=_batched)
    if not qk:
        return None
    masks = []
    while not c.take("softmax", "_softmax"):
        step = c.take(*MASKING)
        if not step or len(masks) > 8:
            return None
        masks.append(step.kind)
    pv = c.take("matmul", "bmm", cond=lambda n: _batched(n) and n.shapes[0][-1] == qk.shapes[1][-1])
    if not pv or qk.shapes[0][-1] != qk.shapes[1][-2]:
        return None
    q, v = qk.shapes[0], pv.shapes[1]
    q4 = [1] * (4 - len(q)) + q
    causal = _causal(masks, module) if {"masked_fill", "masked_fill_", "where", "add"} & set(masks) else False
    return Call("flash_attention", "explicit attention (matmul, mask, softmax, matmul)",
                [q4, q4[:2] + qk.shapes[1][-1:] + q4[-1:], q4[:2] + v[-2:]], node_dtype(qk), [], causal=causal,
                shapes=[q, qk.shapes[1], v])


def _causal(masks: list[str], module: Any) -> Optional[bool]:
    """A mask is causal when the code builds it with tril/triu or the module holds a square
    lower-triangular buffer (GPT-2's `bias`); otherwise it may be padding: unknown."""
    if {"tril", "triu"} & set(masks):
        return True
    for buf in (module.buffers(recurse=False) if module is not None else []):
        m = buf.detach().reshape(-1, *buf.shape[-2:])[0] if buf.dim() >= 2 else None
        if m is not None and m.shape[0] == m.shape[1] and m.shape[0] > 1:
            if torch.equal(m.bool().cpu(), torch.tril(torch.ones_like(m, dtype=torch.bool, device="cpu"))):
                return True
    return None


def _cross_entropy(c: Cursor, module: Any) -> Optional[Call]:
    ls = c.take("log_softmax", "_log_softmax")
    if not ls or len(ls.shapes[0]) != 2 or not c.take("nll_loss", "nll_loss_nd", "nll_loss2d"):
        return None
    return Call("cross_entropy", "log_softmax + nll_loss", [ls.shapes[0], [ls.shapes[0][0]]], node_dtype(ls), [])


FORMS = (_rmsnorm, _rotary, _mlp, _attention, _cross_entropy)
