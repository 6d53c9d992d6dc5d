"""A winner serves calls that need gradients only where its backward was judged right (its training
serving range), never hands a backward the gradient another use of the same output still needs,
and passes grad_out uncopied only in a layout the judge judged."""
from __future__ import annotations

import pytest
import torch

from autokernel.deploy import routing
from autokernel.deploy.routing import ops
from autokernel.deploy.routing.ops import judged_layout
from autokernel.deploy.routing.serving import ServingRange, Shape
from autokernel.deploy.winners import training_serving_range
from paths import DATA

KERNEL = DATA / "kernels" / "backward" / "rmsnorm.py"  # honours every stride, forward and backward
TARGET = "rmsnorm[16x32:float32]"


class Norm(torch.nn.Module):
    """A hand-written RMSNorm the router binds (its forward is the reference's form)."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def _winner(name: str, backward=None, **fields) -> routing.Winner:
    module = routing.load_kernel(KERNEL, name)
    return routing.Winner(TARGET, "rmsnorm", {"M": 16, "N": 32}, "float32", module.kernel_fn, {}, "module",
                          [{"name": "", "class": "Norm"}], backward_fn=backward or module.backward_fn, **fields)


def _rows(rows_ok: dict) -> ServingRange:
    return ServingRange("rmsnorm", "float32", {"M": 16, "N": 32}, None,
                        [Shape({"M": m, "N": 32}, ok) for m, ok in rows_ok.items()])


def test_a_training_call_outside_the_backwards_range_falls_back_counted_where_inference_is_served():
    # the forward was right from 1 to 64 rows; the backward at 16 and 11, wrong at 64
    w = _winner("range_rmsnorm", serving=_rows({16: True, 11: True, 64: True, 1: True}),
                training_serving=_rows({16: True, 11: True, 64: False}))
    norm = Norm()
    router = routing.Router([w])
    with router.patched(norm):
        for rows in (16, 40):
            x = torch.randn(rows, 32, requires_grad=True)
            norm(x).sum().backward()
            with torch.no_grad():
                norm(x)
    kernel = router.tally.to_json()["per_kernel"][TARGET]
    assert kernel["calls_served"] == 3  # 16 rows twice, 40 rows without gradients
    assert kernel["fallback_reasons"] == {"training: rows 40: not proven (judged at rows 11 or 16) (for the backward)": 1}


def test_the_training_range_is_read_from_the_backwards_checks_around_the_target():
    class Target:
        kernel_type, dims, dtype, kwargs = "rmsnorm", {"M": 16, "N": 32}, "float32", {}
    verdict = {"backward": {"verdict": "PASS", "around": {"shapes": [
        {"dims": {"M": 11, "N": 32}, "ok": True, "failed": False},
        {"dims": {"M": 32, "N": 32}, "ok": False, "failed": True, "detail": "gradient of x"},
        {"dims": {"M": 1, "N": 32}, "ok": False, "failed": False, "detail": "not checked"}]}}}
    served = ServingRange.from_json(training_serving_range(Target, verdict))
    assert served.refusal({"M": 11, "N": 32}) is None and served.refusal({"M": 16, "N": 32}) is None
    assert served.refusal({"M": 32, "N": 32})[0] == "wrong"
    assert served.refusal({"M": 13, "N": 32})[0] == "unproven"  # wrong somewhere: only the proven points
    alone = ServingRange.from_json(training_serving_range(Target, {"backward": {"verdict": "PASS"}}))
    assert alone.refusal({"M": 11, "N": 32}) is not None and alone.refusal({"M": 16, "N": 32}) is None


def _writes_into_grad_out(backward):
    def scribbling(grad_out, out, x, weight, eps=1e-6):
        grads = backward(grad_out, out, x, weight, eps)
        grad_out.zero_()  # scratch it no longer needs: the gradient autograd hands on to h * 2
        return grads
    return scribbling


def _shared_gradient(w: routing.Winner | None) -> torch.Tensor:
    """h's gradient in h * 2 + rmsnorm(h): the norm's grad_out and the product's are one tensor
    (`w`: the winner serving the norm; None: PyTorch's)."""
    torch.manual_seed(1)
    h, norm = torch.randn(16, 32, requires_grad=True), Norm()
    if w is None:
        (h * 2 + norm(h)).backward(torch.ones(16, 32))
        return h.grad
    router = routing.Router([w])
    with router.patched(norm):
        (h * 2 + norm(h)).backward(torch.ones(16, 32))
    assert router.tally.to_json()["per_kernel"][TARGET]["calls_served"] == 1
    return h.grad


def test_a_backward_that_declares_it_writes_into_grad_out_gets_a_copy_of_its_own():
    module = routing.load_kernel(KERNEL, "eager_rmsnorm")
    expected = _shared_gradient(None)
    declared = _winner("declared_rmsnorm", _writes_into_grad_out(module.backward_fn), mutates_grad_out=True)
    torch.testing.assert_close(_shared_gradient(declared), expected)
    # the same backward without the copy: h * 2's share of the gradient is gone (so the test can fail)
    undeclared = _winner("undeclared_rmsnorm", _writes_into_grad_out(module.backward_fn))
    assert not torch.allclose(_shared_gradient(undeclared), expected, atol=1e-3)


def test_grad_out_reaches_a_backward_uncopied_only_in_a_layout_the_judge_judged():
    dense = torch.randn(6, 8)
    assert judged_layout(dense) and judged_layout(dense.t().contiguous().t())  # column-major
    assert judged_layout(torch.randn(8).expand(6, 8)) and judged_layout(torch.ones(()).expand(6))
    assert not judged_layout(torch.ones(()).expand(6, 8))  # a scalar over every element: copied
    assert not judged_layout(torch.randn(6, 16)[:, ::2])  # every other column of a wider buffer: copied
    seen = []
    module = routing.load_kernel(KERNEL, "layout_rmsnorm")

    def recording(grad_out, out, x, weight, eps=1e-6):
        seen.append(grad_out.stride())
        return module.backward_fn(grad_out, out, x, weight, eps)
    for judged in (True, False):
        op = _winner(f"layout_{judged}", recording, judged_layouts=judged).registered()
        for grad in (torch.randn(32).expand(16, 32), torch.ones(()).expand(16, 32)):
            x = torch.randn(16, 32, requires_grad=True)
            op(x, torch.ones(32), eps=1e-6).backward(grad)
    # judged: a row broadcast as autograd hands it, a scalar over every element (never judged) copied;
    # a backward judged before layouts were: dense copies
    assert seen == [(0, 1), (32, 1), (32, 1), (32, 1)]


def test_layouts_autograd_may_give_that_the_judge_never_judged_are_copied_to_a_fresh_tensors_strides():
    """A dense grad_out whose size-1 dims carry odd strides is `is_contiguous()` (and `.contiguous()`
    hands it back as it is); a column-major grad_out of a rank the judge did not judge it at (a
    transposed 3-D activation of a row type): neither reaches a backward uncopied."""
    odd = torch.randn(3, 1, 8).as_strided((3, 1, 8), (8, 5, 1))
    assert odd.is_contiguous() and not judged_layout(odd, "rmsnorm")
    assert ops.dense(odd).stride() == (8, 8, 1) and torch.equal(ops.dense(odd), odd)
    three_d = torch.randn(2, 8, 6).transpose(-1, -2)  # [2, 6, 8], column-major in its last two dims
    assert not judged_layout(three_d, "rmsnorm") and judged_layout(three_d[0], "rmsnorm")  # 2-D: judged
    assert judged_layout(torch.randn(2, 3, 8, 6).transpose(-1, -2), "flash_attention")


@pytest.mark.parametrize("kernel_type", ["softmax", "rmsnorm", "layernorm", "matmul", "flash_attention",
                                         "rotary_embedding", "fused_mlp", "reduce"])
def test_the_column_major_rank_is_the_judges_own(kernel_type):
    """The served op's table agrees with the rank of the column-major grad_out the judge builds."""
    from harness.correctness import backward_cases, backward_values
    from harness.kernel_types import registry
    case = next(c for c in backward_cases.layouts(kernel_type) if c.variant == "bwd:grad_transposed") \
        if kernel_type != "reduce" else None
    if case is None:
        assert kernel_type not in ops.COLUMN_MAJOR_RANK  # broadcast only: a row of sums
        return
    args, kwargs = registry.build_inputs(case, "cpu")
    g = backward_values.upstream(case, args, kwargs)
    assert g.dim() == ops.COLUMN_MAJOR_RANK.get(kernel_type, 2)
    assert judged_layout(g, kernel_type), g.stride()
