"""Each winner as a torch custom op, so `torch.compile` keeps the kernel instead of tracing into it.

A kernel_fn launches Triton kernels from Python; Dynamo cannot trace that. Registered with
`torch.library.custom_op` and a fake (its output's shape and dtype from its inputs'), the kernel is
one opaque node of the compiled graph and runs as itself. Eager calls go to kernel_fn directly
(the dispatcher's round trip would only add overhead); the op is used while Dynamo traces.

Op names are `<package>::<target>_<n>`: two winners at one target (a test, a re-import) are two
different ops, and autokernel's routing and an exported package's copy never share a name.
"""
from __future__ import annotations

import itertools
import re
from typing import Callable

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
}
_count = itertools.count()
# autokernel's own routing and an exported package's copy of it register apart, in one process too
NAMESPACE = __name__.split(".")[0]


def custom_op(target: str, kernel_type: str, kernel_fn: Callable) -> Callable:
    """kernel_fn registered as a custom op; call it with kernel_fn's arguments."""
    schema, fake = SCHEMAS[kernel_type]
    slug = re.sub(r"\W+", "_", target).strip("_")
    name = f"{NAMESPACE}::{slug}_{next(_count)}"

    def run(*args, **kwargs):
        out = kernel_fn(*args, **kwargs)
        # a custom op's output may not alias its inputs, and the fake promises a dense tensor
        if any(isinstance(a, torch.Tensor) and out.data_ptr() == a.data_ptr() and a.numel() for a in args):
            out = out.clone()
        return out.contiguous()
    op = torch.library.custom_op(name, run, mutates_args=(), schema=schema)
    op.register_fake(fake)
    return op
