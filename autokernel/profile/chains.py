"""Chains: runs of adjacent operators whose intermediates go only to the next one, found in the
model's own data-flow graph (autokernel.profile.chain_graph), generically, by the ops they run.

Each chain type is one pattern, in the manner of a compiler's fusion pass:

- add_rmsnorm: a tensor add whose sum is RMSNorm's input (pow 2, mean, + eps, rsqrt, multiply,
  times the weight). The sum is an output of the chain (the next residual reads it), the rest of
  RMSNorm's values are not: fused, the kernel returns the sum and the normalised output.
- silu_mul: SiLU(gate) multiplied by up, SiLU's output read by that product alone.
- rotary_qk: two rotate-half rotary embeddings (x * cos + cat(-x2, x1) * sin) on the same cos and
  sin tables, q's and k's: one launch for both.
- linear_cross_entropy: a product whose output (the logits) goes only to log_softmax, whose output
  goes only to nll_loss: fused and chunked, the logits never exist whole.

A pattern that matches except that one of its intermediates has another use is not a chain: fusing
it would drop the value the other reader needs, and so change the model. It is listed under
`rejected` with the op that reads it, so the plan says why it was left alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from autokernel.profile.chain_graph import OUTPUT, GraphOp, OpGraph

CHAIN_TYPES = ("add_rmsnorm", "silu_mul", "rotary_qk", "linear_cross_entropy")
PRODUCTS = {"aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm"}
NLL = {"aten::nll_loss_forward", "aten::nll_loss", "aten::nll_loss_nd", "aten::nll_loss2d_forward"}
REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


@dataclass
class Chain:
    chain_type: str
    ops: list[int]  # graph op indices, in order
    inputs: list[int]  # value ids that enter from outside
    outputs: list[int]  # value ids the chain gives back (read outside it, or returned)
    dims: dict[str, int]
    dtype: str
    options: dict = field(default_factory=dict)  # eps, ignore_index, reduction


@dataclass
class Rejected:
    chain_type: str
    ops: list[int]
    reason: str


class _Finder:
    def __init__(self, graph: OpGraph):
        self.g = graph
        self.rejected: list[Rejected] = []

    # -------------------------------------------------------------- helpers
    def only_user(self, value: int, ops: list[int], chain_type: str, what: str) -> Optional[int]:
        """The one op reading `value`; None (and a rejection naming the other reader) when more do."""
        users = self.g.users(value)
        if len(users) == 1 and users[0] != OUTPUT:
            return users[0]
        if len(users) > 1:
            readers = " and ".join(self._where(u) for u in users)
            self.rejected.append(Rejected(chain_type, list(ops), f"{what} (op {ops[-1]}'s output) is read by {readers}: "
                                          "fusing would drop a value the model uses elsewhere, so it is left unfused"))
        return None

    def _where(self, index: int) -> str:
        if index == OUTPUT:
            return "the caller (it is returned)"
        op = self.g.ops[index]
        return f"{op.name} (op {index}{f', in {op.module[0]} ({op.module[1]})' if op.module[0] else ''})"

    def op(self, index: Optional[int], *names: str) -> Optional[GraphOp]:
        if index is None or index == OUTPUT:
            return None
        op = self.g.ops[index]
        return op if op.name in names else None

    # -------------------------------------------------------------- RMSNorm (a unit inside add_rmsnorm)
    def rmsnorm(self, pow_op: GraphOp) -> Optional[tuple[list[int], int, int, int, float]]:
        """(ops, x, weight, out, eps) of the RMSNorm starting at `pow_op`, None if it is not one."""
        if pow_op.scalars[:1] != [2] or len(pow_op.inputs) != 1:
            return None
        x = pow_op.inputs[0]
        ops = [pow_op.index]
        mean = self.op(self.only_user(pow_op.outputs[0], ops, "add_rmsnorm", "x squared"), "aten::mean")
        if mean is None or mean.scalars[:2] not in ([-1, True], [len(pow_op.shapes[0]) - 1, True]):
            return None
        ops.append(mean.index)
        add = self.op(self.only_user(mean.outputs[0], ops, "add_rmsnorm", "the mean square"), "aten::add")
        if add is None or len(add.inputs) != 1 or not add.scalars or not isinstance(add.scalars[0], float):
            return None
        ops.append(add.index)
        rsqrt = self.op(self.only_user(add.outputs[0], ops, "add_rmsnorm", "mean square + eps"), "aten::rsqrt")
        if rsqrt is None:
            return None
        ops.append(rsqrt.index)
        scaled = self.op(self.only_user(rsqrt.outputs[0], ops, "add_rmsnorm", "the rstd"), "aten::mul")
        if scaled is None or sorted(scaled.inputs) != sorted([x, rsqrt.outputs[0]]):
            return None
        ops.append(scaled.index)
        weighted = self.op(self.only_user(scaled.outputs[0], ops, "add_rmsnorm", "the normalised x"), "aten::mul")
        if weighted is None:
            return None
        weight = next((v for v in weighted.inputs if v != scaled.outputs[0]), None)
        if weight is None or len(self.g.meta[weight][0]) != 1:
            return None
        ops.append(weighted.index)
        return ops, x, weight, weighted.outputs[0], float(add.scalars[0])

    def add_rmsnorm(self, pow_op: GraphOp) -> Optional[Chain]:
        unit = self.rmsnorm(pow_op)
        if unit is None:
            return None
        ops, x, weight, out, eps = unit
        add = self.g.made_by(x)
        if add is None or add.name != "aten::add" or len(add.inputs) != 2 or add.scalars[:1] not in ([], [1]):
            return None
        if add.shapes[0] != add.shapes[1]:  # as passed: a value's own shape may be a view's source
            return None  # a broadcast add (a bias) is not a residual
        shape = pow_op.shapes[0]
        dims = {"M": math.prod(shape[:-1]), "N": shape[-1]}
        # the sum is given back (the next residual reads it); the normalised output always
        return Chain("add_rmsnorm", [add.index] + ops, [*add.inputs, weight], [x, out], dims,
                     add.dtypes[0], {"eps": eps})

    # -------------------------------------------------------------- SiLU(gate) x up
    def silu_mul(self, silu: GraphOp) -> Optional[Chain]:
        ops = [silu.index]
        mul = self.op(self.only_user(silu.outputs[0], ops, "silu_mul", "SiLU's output"), "aten::mul")
        if mul is None or len(mul.inputs) != 2 or mul.shapes[0] != mul.shapes[1]:
            return None
        gate = silu.inputs[0]
        up = next(v for v in mul.inputs if v != silu.outputs[0])
        shape = silu.shapes[0]
        return Chain("silu_mul", ops + [mul.index], [gate, up], [mul.outputs[0]],
                     {"M": math.prod(shape[:-1]), "N": shape[-1]}, silu.dtypes[0])

    # -------------------------------------------------------------- rotary (one tensor)
    def rotary(self, cat: GraphOp) -> Optional[tuple]:
        """(ops, x, cos, sin, out, x's shape, dtype) of the rotate-half rotary whose cat is `cat`."""
        if len(cat.inputs) != 2:
            return None
        neg = self.g.made_by(cat.inputs[0])
        if neg is None or neg.name != "aten::neg" or neg.inputs[0] != cat.inputs[1]:
            return None
        x = cat.inputs[1]  # both halves are slices (views) of x
        ops = [neg.index, cat.index]
        if self.only_user(neg.outputs[0], ops, "rotary_qk", "-x2") != cat.index:
            return None
        by_sin = self.op(self.only_user(cat.outputs[0], ops, "rotary_qk", "rotate_half(x)"), "aten::mul")
        if by_sin is None:
            return None
        sin = next(v for v in by_sin.inputs if v != cat.outputs[0])
        add = self.op(self.only_user(by_sin.outputs[0], ops + [by_sin.index], "rotary_qk", "rotate_half(x) * sin"),
                      "aten::add")
        if add is None:
            return None
        by_cos = self.g.made_by(next(v for v in add.inputs if v != by_sin.outputs[0]))
        if by_cos is None or by_cos.name != "aten::mul" or x not in by_cos.inputs:
            return None
        cos = next(v for v in by_cos.inputs if v != x)
        if self.only_user(by_cos.outputs[0], ops, "rotary_qk", "x * cos") != add.index:
            return None
        shape = by_cos.shapes[by_cos.inputs.index(x)]
        return sorted([by_cos.index, *ops, by_sin.index, add.index]), x, cos, sin, add.outputs[0], shape, by_cos.dtypes[0]

    def rotary_pairs(self, cats: list[GraphOp]) -> list[Chain]:
        units = [u for u in (self.rotary(c) for c in cats) if u is not None]
        chains, i = [], 0
        while i + 1 < len(units):
            (ops_q, q, cos, sin, out_q, qs, dtype), (ops_k, k, cos2, sin2, out_k, ks, _) = units[i], units[i + 1]
            if (cos, sin) == (cos2, sin2) and len(qs) == 4 and len(ks) == 4 and qs[0] == ks[0] and qs[2:] == ks[2:]:
                dims = {"B": qs[0], "HQ": qs[1], "HK": ks[1], "S": qs[2], "D": qs[3]}
                chains.append(Chain("rotary_qk", ops_q + ops_k, [q, k, cos, sin], [out_q, out_k], dims, dtype))
                i += 2
            else:
                i += 1
        return chains

    # -------------------------------------------------------------- final projection + cross-entropy
    def linear_cross_entropy(self, product: GraphOp) -> Optional[Chain]:
        if len(product.inputs) < 2:
            return None
        logits = product.outputs[0]
        ops = [product.index]
        lsm = self.op(self.g.users(logits)[0] if self.g.users(logits) else None, "aten::_log_softmax", "aten::log_softmax")
        if lsm is None:
            return None
        if self.only_user(logits, ops, "linear_cross_entropy", "the logits") is None:
            return None
        ops.append(lsm.index)
        nll = self.op(self.only_user(lsm.outputs[0], ops, "linear_cross_entropy", "the log-probabilities"), *NLL)
        if nll is None or len(nll.inputs) < 2:
            return None
        ops.append(nll.index)
        x, weight = product.inputs[-2], product.inputs[-1]
        d, v = product.shapes[-2][-1], lsm.shapes[0][-1]
        rows = math.prod(lsm.shapes[0][:-1])  # the rows the loss reads (a shifted loss drops the last)
        ints = [s for s in nll.scalars if isinstance(s, int) and not isinstance(s, bool)]  # (reduction, ignore_index)
        options = {"reduction": REDUCTIONS.get(ints[0] if ints else 1, "mean"),
                   "ignore_index": ints[1] if len(ints) > 1 else -100}
        return Chain("linear_cross_entropy", ops, [x, weight, nll.inputs[1]], [nll.outputs[0]],
                     {"N": rows, "D": d, "V": v}, product.dtypes[0], options)


def find(graph: OpGraph) -> tuple[list[Chain], list[Rejected]]:
    """Every chain of the four types in `graph`, in op order, and the near-misses left unfused."""
    f = _Finder(graph)
    chains: list[Chain] = []
    cats = []
    for op in graph.ops:
        if op.name == "aten::pow":
            chain = f.add_rmsnorm(op)
        elif op.name == "aten::silu":
            chain = f.silu_mul(op)
        elif op.name in PRODUCTS:
            chain = f.linear_cross_entropy(op)
        else:
            chain = None
            if op.name == "aten::cat":
                cats.append(op)
        if chain is not None:
            chains.append(chain)
    chains += f.rotary_pairs(cats)
    claimed = {i for c in chains for i in c.ops}
    rejected = [r for r in f.rejected if not set(r.ops) <= claimed]
    return sorted(chains, key=lambda c: c.ops[0]), _unique(rejected)


def _unique(rejected: list[Rejected]) -> list[Rejected]:
    seen, out = set(), []
    for r in rejected:
        key = (r.chain_type, tuple(r.ops))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out
