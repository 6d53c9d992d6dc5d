"""Each winner as a torch custom op, so `torch.compile` keeps the kernel instead of tracing into it,
and a winner with a backward serves calls that need gradients.

A kernel_fn launches Triton kernels from Python; Dynamo cannot trace that. Registered with
`torch.library.custom_op` and a fake (its output's shape and dtype from its inputs'), the kernel is
one opaque node of the compiled graph and runs as itself. Eager calls that need no gradient go to
kernel_fn directly (the dispatcher's round trip would only add overhead); the op is used while
Dynamo traces and whenever autograd records the call.

A kernel file with a `backward_fn(grad_out, out, <kernel_fn's params>)` (the training contract,
docs/judge.md) gets a second op, `<name>_backward`, and `register_autograd` joins the two: the
forward saves its inputs and its output (nothing else: statistics are recomputed by the backward),
the backward op returns one gradient per differentiable parameter (GRAD_PARAMS), and every other
input gets None. Both ops have fakes from shapes alone, so torch.compile traces forward and
backward and `torch.library.opcheck` holds.

grad_out reaches the backward as autograd hands it where the judge judged that layout (dense,
column-major, one row broadcast over the rows: harness/correctness/backward_values.py; a verdict's
backward "grad_out_layouts"), and as a dense copy otherwise (and for a backward judged before
layouts were). A backward never gets the gradient autograd will hand on to the output's
other uses (h * 2 + norm(h)) to write into: the judge refuses writes into grad_out, and a file
that declares MUTATES_GRAD_OUT = True (a permission older judges granted) gets a private copy.

Op names are `<package>::<target>_<n>`: two winners at one target (a test, a re-import) are two
different ops, and autokernel's routing and an exported package's copy never share a name.
"""
from __future__ import annotations

import itertools
import re
from typing import Callable, Optional

import torch


def _rows(x, *rest):
    return x.new_empty(x.shape)


# kernel type -> (the op's schema: the kernel_fn signature, its fake: output shape and dtype)
SCHEMAS: dict[str, tuple[str, Callable]] = {
    "matmul": ("(Tensor a, Tensor b) -> Tensor", lambda a, b: a.new_empty((a.shape[0], b.shape[1]))),
    "softmax": ("(Tensor x) -> Tensor", _rows),
    "reduce": ("(Tensor x) -> Tensor", lambda x: x.new_empty(x.shape[:-1])),
    "layernorm": ("(Tensor x, Tensor weight, Tensor bias, float eps=1e-05) -> Tensor", _rows),
    "rmsnorm": ("(Tensor x, Tensor weight, float eps=1e-06) -> Tensor", _rows),
    "flash_attention": ("(Tensor q, Tensor k, Tensor v, bool causal=False, float? sm_scale=None) -> Tensor", _rows),
    "fused_mlp": ("(Tensor x, Tensor w_gate, Tensor w_up, Tensor w_down) -> Tensor",
                  lambda x, w_gate, w_up, w_down: x.new_empty((x.shape[0], w_down.shape[0]))),
    "cross_entropy": ("(Tensor logits, Tensor targets) -> Tensor",
                      lambda logits, targets: logits.new_empty((), dtype=torch.float32)),
    "rotary_embedding": ("(Tensor x, Tensor cos, Tensor sin) -> Tensor", _rows),
    # chains (harness/kernel_types/types/chains.py)
    "add_rmsnorm": ("(Tensor x, Tensor residual, Tensor weight, float eps=1e-06) -> Tensor",
                    lambda x, residual, weight, eps=1e-6: x.new_empty((2, *x.shape))),
    "silu_mul": ("(Tensor gate, Tensor up) -> Tensor", _rows),
    "rotary_qk": ("(Tensor q, Tensor k, Tensor cos, Tensor sin) -> Tensor",
                  lambda q, k, cos, sin: q.new_empty((q.shape[0], q.shape[1] + k.shape[1], *q.shape[2:]))),
    "linear_cross_entropy": ('(Tensor x, Tensor weight, Tensor targets, int ignore_index=-100, str reduction="mean")'
                             " -> Tensor", lambda x, *rest, **kw: x.new_empty((), dtype=torch.float32)),
}
# kernel type -> the parameters backward_fn returns gradients for, in this order (the training
# contract; targets are integers, rotary's cos and sin are constants of the model)
GRAD_PARAMS: dict[str, tuple[str, ...]] = {
    "matmul": ("a", "b"), "softmax": ("x",), "reduce": ("x",), "layernorm": ("x", "weight", "bias"),
    "rmsnorm": ("x", "weight"), "flash_attention": ("q", "k", "v"), "fused_mlp": ("x", "w_gate", "w_up", "w_down"),
    "cross_entropy": ("logits",), "rotary_embedding": ("x",),
    "add_rmsnorm": ("x", "residual", "weight"), "silu_mul": ("gate", "up"), "rotary_qk": ("q", "k"),
    "linear_cross_entropy": ("x", "weight"),
}
_count = itertools.count()
# autokernel's own routing and an exported package's copy of it register apart, in one process too
NAMESPACE = __name__.split(".")[0]


def _inside(kernel_type: str) -> str:
    """The schema's parameter list, without its parentheses: 'Tensor x, Tensor weight, float eps=1e-06'."""
    return SCHEMAS[kernel_type][0].split("->")[0].strip()[1:-1]


def params(kernel_type: str) -> list[str]:
    """kernel_fn's parameter names, in order, read from the op's schema."""
    return [p.split("=")[0].split()[-1] for p in _inside(kernel_type).split(",")]


def tensor_params(kernel_type: str) -> list[int]:
    """The positions of kernel_fn's tensor parameters (the rest are flags and numbers)."""
    return [i for i, p in enumerate(_inside(kernel_type).split(",")) if p.split()[0] == "Tensor"]


def grad_positions(kernel_type: str) -> tuple[int, ...]:
    """Where the differentiable parameters sit among kernel_fn's."""
    names = params(kernel_type)
    return tuple(names.index(p) for p in GRAD_PARAMS[kernel_type])


def custom_op(target: str, kernel_type: str, kernel_fn: Callable, backward_fn: Optional[Callable] = None,
              mutates_grad_out: bool = False, judged_layouts: bool = False) -> Callable:
    """kernel_fn registered as a custom op (call it with kernel_fn's arguments); with `backward_fn`,
    an op autograd differentiates through it (`mutates_grad_out`: its file declares that it writes
    into grad_out, which then gets a copy of its own; `judged_layouts`: its backward was judged under
    column-major and broadcast gradients, which it then gets as they come, else a dense copy)."""
    schema, fake = SCHEMAS[kernel_type]
    slug = re.sub(r"\W+", "_", target).strip("_")
    name = f"{NAMESPACE}::{slug}_{next(_count)}"

    def run(*args, **kwargs):
        return _own(kernel_fn(*args, **kwargs), args)
    op = torch.library.custom_op(name, run, mutates_args=(), schema=schema)
    op.register_fake(fake)
    if backward_fn is not None:
        _differentiable(op, name, kernel_type, backward_fn, mutates_grad_out, judged_layouts)
    return op


# The rank at which the judge hands a backward its column-major grad_out (the outputs of
# harness/correctness/backward_cases.layouts' cases): attention's and rotary's [B, H, S, D], every
# other type's [rows, N]. A column-major grad_out of another rank (a transposed 3-D activation of a
# row type) was never judged and is copied; tests/deploy/test_training_range.py holds this table to
# the judge's own cases.
COLUMN_MAJOR_RANK = {"flash_attention": 4, "rotary_embedding": 4}


def _dense_strides(shape) -> tuple[int, ...]:
    """The strides torch gives a fresh tensor of `shape`: a size-1 dim's stride included, which
    is_contiguous() ignores and a backward that reads strides does not."""
    strides, step = [], 1
    for n in reversed(tuple(shape)):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def judged_layout(g: torch.Tensor, kernel_type: str = "") -> bool:
    """Whether grad_out's layout is exactly one the judge hands a backward: dense with a fresh
    tensor's strides, column-major in its last two dims at the rank the judge judges it, or one row
    broadcast over the rows (stride 0; a single value over a row of sums). Strides are compared
    whole: a dense grad_out whose size-1 dims carry other strides is `is_contiguous()` and was never
    judged."""
    shape, strides = tuple(g.shape), g.stride()
    if strides == _dense_strides(shape):
        return True
    if g.dim() >= 2 and g.dim() == COLUMN_MAJOR_RANK.get(kernel_type, 2):
        column_major = list(_dense_strides(shape[:-2] + (shape[-1], shape[-2])))
        column_major[-1], column_major[-2] = column_major[-2], column_major[-1]
        if strides == tuple(column_major):
            return True
    if g.dim() == 1:
        return strides[0] == 0
    return all(s == 0 for s in strides[:-1]) and strides[-1] == 1


def dense(g: torch.Tensor) -> torch.Tensor:
    """g with a fresh tensor's strides: copied unless it has them (`.contiguous()` keeps a size-1
    dim's odd stride)."""
    return g if g.stride() == _dense_strides(g.shape) else g.clone(memory_format=torch.contiguous_format)


def _own(out: torch.Tensor, inputs: tuple) -> torch.Tensor:
    """A custom op's output may not alias its inputs, and the fake promises a dense tensor."""
    if any(isinstance(a, torch.Tensor) and a.numel() and out.data_ptr() == a.data_ptr() for a in inputs):
        out = out.clone()
    return out.contiguous()


def _differentiable(op: Callable, name: str, kernel_type: str, backward_fn: Callable,
                    mutates_grad_out: bool = False, judged_layouts: bool = False) -> None:
    """The backward op `<name>_backward(grad_out, out, <params>) -> grads`, joined to `op` by
    register_autograd: the forward saves its inputs and output, the backward op's gradients go to
    the differentiable parameters' positions, None to the rest."""
    names, positions = params(kernel_type), grad_positions(kernel_type)
    inside = _inside(kernel_type)
    returns = "Tensor" if len(positions) == 1 else "(" + ", ".join(["Tensor"] * len(positions)) + ")"
    schema = f"(Tensor grad_out, Tensor out, {inside}) -> {returns}"

    def run(grad_out, out, *args):
        if mutates_grad_out:  # a copy of its own: autograd hands grad_out on to the output's other uses
            grad_out = grad_out.clone(memory_format=torch.contiguous_format)
        grads = backward_fn(grad_out, out, *args)
        grads = tuple(grads) if isinstance(grads, (tuple, list)) else (grads,)
        _check(name, kernel_type, grads, [args[p] for p in positions])
        owned = tuple(_own(g, (grad_out, out, *args)) for g in grads)
        return owned[0] if len(owned) == 1 else owned

    def fake(grad_out, out, *args):
        grads = tuple(args[p].new_empty(args[p].shape) for p in positions)
        return grads[0] if len(grads) == 1 else grads
    backward = torch.library.custom_op(f"{name}_backward", run, mutates_args=(), schema=schema)
    backward.register_fake(fake)
    tensors = tensor_params(kernel_type)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*[inputs[i] for i in tensors], output)
        ctx.others = {i: v for i, v in enumerate(inputs) if i not in tensors}

    def grad(ctx, grad_out):
        *saved, out = ctx.saved_tensors
        args = [None] * len(names)
        for i, t in zip(tensors, saved):
            args[i] = t
        for i, v in ctx.others.items():
            args[i] = v
        as_judged = judged_layouts and judged_layout(grad_out, kernel_type)
        grads = backward(grad_out if as_judged else dense(grad_out), out, *args)
        grads = grads if isinstance(grads, tuple) else (grads,)
        result = [None] * len(names)
        for p, g in zip(positions, grads):
            result[p] = g
        return tuple(result)
    op.register_autograd(grad, setup_context=setup_context)


def _check(name: str, kernel_type: str, grads: tuple, inputs: list) -> None:
    """A backward must give one gradient per differentiable parameter, each shaped like it."""
    wanted = GRAD_PARAMS[kernel_type]
    if len(grads) != len(wanted):
        raise RuntimeError(f"{name}: backward_fn returned {len(grads)} gradient(s); a {kernel_type} backward returns "
                           f"{len(wanted)}, for {', '.join(wanted)} in that order")
    for param, g, x in zip(wanted, grads, inputs):
        if not isinstance(g, torch.Tensor) or g.shape != x.shape or g.dtype != x.dtype:
            got = f"{tuple(g.shape)} {g.dtype}" if isinstance(g, torch.Tensor) else type(g).__name__
            raise RuntimeError(f"{name}: the gradient for {param} is {got}; it must be shaped like {param}: "
                               f"{tuple(x.shape)} {x.dtype}")
