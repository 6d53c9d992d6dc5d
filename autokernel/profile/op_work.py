"""The work recorded ops do: FLOPs by formula for products, elements for the rest.

A module target is charged the sum of its ops' work, read from the shapes the profiler recorded:

- matmul-like ops (mm, addmm, bmm, baddbmm, linear, matmul, _grouped_mm, mv, convolutions,
  scaled_dot_product_attention) by their FLOP formulas, 2 FLOPs per multiply-add; einsum by the
  products torch dispatched it to, which is what its equation asks for;
- elementwise ops and reductions by one FLOP per element of their broadcast inputs (an estimate:
  a tanh costs more than an add, as every roofline tool counts it);
- views, casts, copies and data movement (index, gather, cat, embedding, ...) by no FLOPs: their
  cost is bytes, which the module target counts from its inputs, outputs and weights.

What cannot be counted is kept apart, never guessed: a product-like op whose shapes were not
recorded and that ran nothing recorded inside it, an op of another library (`mylib::fused_moe`)
that ran nothing recorded inside it, and on a GPU the kernels a module launched outside any op
(a Triton kernel called from Python). A target holding such work has a floor for its count, not
an estimate, and the plan claims no ceiling for it.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Optional

from autokernel.profile.forms import GLUE, Node

# Ops that move or make data and compute nothing a roofline counts: their cost is bytes.
MOVEMENT = {
    "index", "index_select", "gather", "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce",
    "scatter_reduce_", "index_add", "index_add_", "index_put", "index_put_", "_index_put_impl_", "index_copy",
    "index_copy_", "index_fill", "index_fill_", "masked_scatter", "masked_scatter_", "masked_select", "take",
    "take_along_dim", "embedding", "embedding_bag", "_embedding_bag", "cat", "stack", "hstack", "vstack",
    "concat", "concatenate", "repeat", "repeat_interleave", "tile", "pad", "constant_pad_nd", "roll", "flip",
    "one_hot", "nonzero", "nonzero_numpy", "nonzero_static", "argwhere", "zeros", "zeros_like", "ones",
    "ones_like", "full", "full_like", "fill_", "zero_", "new_zeros", "new_ones", "new_full", "new_empty",
    "empty_permuted", "arange", "linspace", "scalar_tensor", "item", "_local_scalar_dense", "is_nonzero",
    "resize_", "as_strided_", "unfold", "im2col", "col2im", "pixel_shuffle", "pixel_unshuffle", "diagonal",
    "diag_embed", "tril_indices", "triu_indices", "result_type", "lift_fresh_copy", "_assert_async",
    "detach_", "set_", "flatten", "unflatten", "movedim", "view_as_real", "view_as_complex", "_unsafe_index",
}
# Ops that touch no data (on top of forms.GLUE): what a library's op that computed in numpy records.
NO_WORK = {"resolve_neg", "lift_fresh_copy", "result_type", "detach_", "_local_scalar_dense", "item"}
# Ops whose output shape depends on the values of their input: what follows them in a module
# (an expert loop's products, each over the tokens routed to it) has shapes the data chose.
DATA_DEPENDENT = {"nonzero", "nonzero_numpy", "argwhere", "masked_select", "_unique", "_unique2", "unique_dim",
                  "unique_consecutive", "unique_dim_consecutive"}
# Names of product-like ops this module has no formula for (_weight_int4pack_mm, cdist, lstm, fft):
# when nothing recorded runs inside one, its FLOPs cannot be counted. Not cummax, upsample_bilinear2d,
# _convert_indices or linalg_vector_norm: scans, interpolation, conversions and norms are elementwise.
PRODUCT_LIKE = re.compile(r"mm(_|$)|^_?conv(\dd|_transpose|_tbc)|convolution|attention|matmul|gemm|einsum|"
                          r"^_?linear|^bilinear|dot|^linalg_(?!.*norm)|fft|cdist|lstm|gru|rnn|mv$")
OWN_KERNELS = "kernels launched by {} outside any op"  # a module range's own time on a GPU
TENSOR_DTYPES_NOT = {"", "Scalar", "ScalarList", "TensorList", "GenericList"}


@dataclass
class Work:
    """What a list of ops does, summed: counted FLOPs, what could not be counted, and the shapes of
    the tensors computing ops read (to tell which of a module's weights it reads)."""

    flops: float = 0.0
    matmul_flops: float = 0.0  # the part of `flops` counted by product formulas
    # product-like ops, by op and operand dims other than M: the M of each call (a shape distribution)
    matmuls: dict = field(default_factory=lambda: defaultdict(list))
    uncounted: dict = field(default_factory=lambda: defaultdict(float))  # op name -> us of its calls
    operands: list = field(default_factory=list)  # shapes of the tensors computing ops read

    def add(self, other: "Work") -> None:
        self.flops += other.flops
        self.matmul_flops += other.matmul_flops
        for k, ms in other.matmuls.items():
            self.matmuls[k].extend(ms)
        for k, us in other.uncounted.items():
            self.uncounted[k] += us
        self.operands.extend(other.operands)


def count(nodes: list[Node], kernels_only: bool = False) -> Work:
    """The work of `nodes` and everything they ran. `kernels_only`: the nodes' own times are device
    kernel times (a GPU profile), so a range's own time is a kernel no op launched."""
    work = Work()
    for n in nodes:
        _count(n, work, kernels_only)
    return work


def _count(node: Node, work: Work, kernels_only: bool) -> None:
    if node.module:  # a module call inside a module target's work: what it ran
        for c in node.children:
            _count(c, work, kernels_only)
        if node.self_us > 0:  # only on a GPU: kernels the module launched outside any op
            work.uncounted[OWN_KERNELS.format(node.module[1])] += node.self_us
        return
    product = formula(node)
    if product is not None:
        flops, key, m = product
        work.flops += flops
        work.matmul_flops += flops
        work.matmuls[key].append(m)
        work.operands.extend(_tensor_shapes(node))
        return
    namespace, _, kind = node.name.rpartition("::")
    if namespace not in ("aten", "prim", "prims", ""):  # another library's op (mylib::fused_moe)
        if not _does_work(node.children):  # it computed outside every recorded op: unknown work
            work.uncounted[node.name] += node.total_us
            return
        _count_inside(node, work, kernels_only)
    elif not namespace:  # a record_function range of the model's own code
        _count_inside(node, work, kernels_only)
    elif node.children and (PRODUCT_LIKE.search(kind) or _holds_product(node)):
        for c in node.children:  # a composite around a product (einsum, a linear of odd shapes)
            _count(c, work, kernels_only)
    elif PRODUCT_LIKE.search(kind):  # a product with no formula here, or its shapes not recorded
        work.uncounted[node.name] += node.total_us
    elif kind not in GLUE and kind not in MOVEMENT:
        work.flops += elements(node)
        work.operands.extend(_tensor_shapes(node))


def _count_inside(node: Node, work: Work, kernels_only: bool) -> None:
    """A range counted by the ops it ran. Its own time is Python between them on a CPU; on a GPU it
    is kernels it launched itself (a Triton kernel), whose work is unknown."""
    for c in node.children:
        _count(c, work, kernels_only)
    if kernels_only and node.self_us > 0:
        work.uncounted[node.name] += node.self_us


def _does_work(nodes: list[Node]) -> bool:
    """Whether any of `nodes` or what they ran computes or moves data (not a view, cast or alias)."""
    return any(n.module or (n.kind not in GLUE and n.kind not in NO_WORK) or _does_work(n.children) for n in nodes)


def _holds_product(node: Node) -> bool:
    return any(formula(c) is not None or _holds_product(c) for c in node.children if not c.module)


def data_dependent_tail(children: list[Node]) -> tuple[list[Node], list[Node], Optional[str]]:
    """A module's calls split at its first op with a data-dependent output shape (nonzero, a boolean
    mask's index), and that op. What follows it ran on shapes the data chose: an expert loop's
    products, each over the tokens routed to it, with a different M per expert and per batch. The
    profiler keeps those the module's own work, not typed targets named after one batch's M that no
    other batch repeats: the module target (the whole loop, all experts at once) is what a grouped
    kernel replaces."""
    for i, n in enumerate(children):
        cause = data_dependent(n)
        if cause:
            return children[:i], children[i:], cause
    return children, [], None


def data_dependent(node: Node) -> Optional[str]:
    """The op inside `node` (an op, not a module) whose output shape depends on the data, if any."""
    if node.module:
        return None
    if node.kind in DATA_DEPENDENT:
        return node.name
    for c in node.children:
        found = data_dependent(c)
        if found:
            return found
    return None


# ---------------------------------------------------------------- shapes
def _tensor_shapes(node: Node) -> list[list[int]]:
    """The recorded shapes of the node's tensor arguments (scalars and lists left out)."""
    out = []
    for i, s in enumerate(node.shapes):
        dtype = node.dtypes[i] if i < len(node.dtypes) else ""
        if isinstance(s, list) and all(isinstance(d, int) for d in s) and dtype not in TENSOR_DTYPES_NOT:
            out.append(s)
    return out


def elements(node: Node) -> int:
    """Elements an elementwise op or a reduction works on: its tensor arguments broadcast together
    (the largest one where they do not broadcast)."""
    shapes = _tensor_shapes(node)
    if not shapes:
        return 0
    try:
        return math.prod(_broadcast(shapes))
    except ValueError:
        return max(math.prod(s) for s in shapes)


def _broadcast(shapes: list[list[int]]) -> list[int]:
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(ndim):
        dims = {s[len(s) - ndim + i] for s in shapes if len(s) - ndim + i >= 0} - {1}
        if len(dims) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return out


# ---------------------------------------------------------------- product formulas
def formula(node: Node) -> Optional[tuple[float, str, int]]:
    """(FLOPs, the op and its dims other than M, M) of a product-like op from its recorded shapes;
    None when it is not one or its shapes do not say."""
    fn = FORMULAS.get(node.kind)
    if fn is None or node.name.rpartition("::")[0] != "aten":
        return None
    s = [x if isinstance(x, list) else [] for x in node.shapes]
    try:
        found = fn(s, node.concrete)
    except (IndexError, TypeError, ValueError):
        return None  # shapes recorded in a form the formula does not expect: not counted
    if found is None:
        return None
    flops, dims, m = found
    return float(flops), f"{node.name}[{dims}]", int(m)


def _rows(a: list[int], b: list[int]) -> tuple[int, int, int, int]:
    """(batch, M, K, N) of torch.matmul(a, b) with its broadcasting and vector rules."""
    if not a or not b:
        raise ValueError("a matmul operand without a recorded shape")
    m, k = (1, a[0]) if len(a) == 1 else (a[-2], a[-1])
    n = 1 if len(b) == 1 else b[-1]
    batch = math.prod(_broadcast([a[:-2] or [1], b[:-2] or [1]]))
    return batch, m, k, n


def _matmul(s: list, c: list) -> tuple:
    batch, m, k, n = _rows(s[0], s[1])
    return 2 * batch * m * k * n, f"K={k},N={n}" + (f",batch={batch}" if batch > 1 else ""), m


def _addmm(s: list, c: list) -> tuple:
    return _matmul(s[1:], c)


def _linear(s: list, c: list) -> tuple:
    x, w = s[0], s[1]
    if len(w) != 2 or not x or x[-1] != w[1]:
        raise ValueError("not a linear's shapes")
    m = math.prod(x[:-1])
    return 2 * m * w[1] * w[0], f"K={w[1]},N={w[0]}", m


def _grouped_mm(s: list, c: list) -> tuple:
    """torch._grouped_mm: offs split the rows of a 2-D a over the groups of a 3-D b (the MoE form),
    the columns of a 2-D b, or K (2-D x 2-D); 3-D x 3-D is a batched product."""
    a, b = s[0], s[1]
    if len(a) == 2 and len(b) == 3:  # [M_total, K] x [G, K, N]
        return 2 * a[0] * a[1] * b[2], f"K={a[1]},N={b[2]},groups={b[0]}", a[0]
    if len(a) == 3 and len(b) == 2:  # [G, M, K] x [K, N_total]
        return 2 * a[1] * a[2] * b[1], f"K={a[2]},N={b[1]},groups={a[0]}", a[1]
    if len(a) == 2 and len(b) == 2:  # [M, K_total] x [K_total, N]
        return 2 * a[0] * a[1] * b[1], f"K={a[1]},N={b[1]}", a[0]
    if len(a) == 3 and len(b) == 3:
        return 2 * a[0] * a[1] * a[2] * b[2], f"K={a[2]},N={b[2]},batch={a[0]}", a[1]
    raise ValueError("not a grouped product's shapes")


def _conv_out(size: int, k: int, stride: int, pad: int, dil: int) -> int:
    return (size + 2 * pad - dil * (k - 1) - 1) // stride + 1


def _conv(x: list, w: list, stride: list, padding: list, dilation: list, transposed: bool) -> tuple:
    """2 FLOPs per multiply-add of every filter tap: for a convolution at each output position, for a
    transposed one at each input position (the weight holds the per-group channels)."""
    spatial = x[2:]
    if len(w) != len(x) or not spatial:
        raise ValueError("not a convolution's shapes")
    nd = len(spatial)
    stride, padding, dilation = (_per_dim(v, nd) for v in (stride, padding, dilation))
    if transposed:
        positions = math.prod(spatial)
    else:
        positions = math.prod(_conv_out(spatial[i], w[2 + i], stride[i], padding[i], dilation[i]) for i in range(nd))
    return 2 * x[0] * positions * math.prod(w), f"weight={'x'.join(map(str, w))}", x[0] * positions


def _per_dim(value, nd: int) -> list[int]:
    if isinstance(value, int):
        return [value] * nd
    if isinstance(value, list) and len(value) in (1, nd) and all(isinstance(v, int) for v in value):
        return value * nd if len(value) == 1 else value
    raise ValueError(f"a convolution argument {value!r} not recorded as ints")


def _convolution(s: list, c: list) -> tuple:
    # convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    return _conv(s[0], s[1], c[3], c[4], c[5], bool(c[6]))


def _conv_nd(s: list, c: list) -> tuple:
    # conv2d(input, weight, bias, stride, padding, dilation, groups); padding may be "same": not ints
    return _conv(s[0], s[1], c[3], c[4], c[5], False)


def _conv_transpose_nd(s: list, c: list) -> tuple:
    # conv_transpose2d(input, weight, bias, stride, padding, output_padding, groups, dilation)
    return _conv(s[0], s[1], 1, 0, 1, True)


def _attention(causal_at: Optional[int]) -> Callable:
    def flops(s: list, c: list) -> tuple:
        """q @ kᵀ and scores @ v, 2 FLOPs per multiply-add; a causal mask leaves half the scores."""
        q, k, v = s[0], s[1], s[2]
        if len(q) < 3 or len(k) < 2 or len(v) < 2:
            raise ValueError("not attention's shapes")
        batch, sq, sk = math.prod(q[:-2]), q[-2], k[-2]
        total = 2 * batch * sq * sk * q[-1] + 2 * batch * sq * sk * v[-1]
        causal = causal_at is not None and len(c) > causal_at and c[causal_at] is True
        return total / 2 if causal else total, f"Sk={sk},D={q[-1]}" + (",causal" if causal else ""), batch * sq
    return flops


def _mv(s: list, c: list) -> tuple:
    a = s[0]
    return 2 * a[0] * a[1], f"K={a[1]}", a[0]


def _addmv(s: list, c: list) -> tuple:
    return _mv(s[1:], c)


def _dot(s: list, c: list) -> tuple:
    return 2 * s[0][0], f"K={s[0][0]}", 1


FORMULAS: dict[str, Callable] = {
    "mm": _matmul, "bmm": _matmul, "matmul": _matmul, "_int_mm": _matmul, "_scaled_mm": _matmul,
    "addmm": _addmm, "baddbmm": _addmm, "linear": _linear, "_grouped_mm": _grouped_mm,
    "mv": _mv, "addmv": _addmv, "dot": _dot, "vdot": _dot,
    "convolution": _convolution, "_convolution": _convolution,
    "conv1d": _conv_nd, "conv2d": _conv_nd, "conv3d": _conv_nd,
    "conv_transpose1d": _conv_transpose_nd, "conv_transpose2d": _conv_transpose_nd,
    "conv_transpose3d": _conv_transpose_nd,
    "scaled_dot_product_attention": _attention(5), "_scaled_dot_product_attention_math": _attention(5),
    "_scaled_dot_product_flash_attention": _attention(4), "_scaled_dot_product_flash_attention_for_cpu": _attention(4),
    "_scaled_dot_product_efficient_attention": _attention(6), "_scaled_dot_product_cudnn_attention": _attention(6),
}
