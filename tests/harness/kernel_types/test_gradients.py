"""The registry's gradients: which parameters are differentiable, the seeded upstream gradient and
float64 autograd of the reference that a backward_fn is checked against."""
from __future__ import annotations

import pytest
import torch

from harness.kernel_types import gradients, registry
from harness.kernel_types.registry import Case

CONTRACT = {"matmul": ("a", "b"), "softmax": ("x",), "layernorm": ("x", "weight", "bias"),
            "rmsnorm": ("x", "weight"), "flash_attention": ("q", "k", "v"),
            "fused_mlp": ("x", "w_gate", "w_up", "w_down"), "cross_entropy": ("logits",),
            "rotary_embedding": ("x",), "reduce": ("x",),
            # chains: every differentiable input of the chain's operators, the sum's two terms included
            "add_rmsnorm": ("x", "residual", "weight"), "silu_mul": ("gate", "up"), "rotary_qk": ("q", "k"),
            "linear_cross_entropy": ("x", "weight")}


def test_every_type_names_its_differentiable_parameters_as_the_contract_does():
    assert {n: registry.get(n).grad_params for n in registry.names()} == CONTRACT
    for name in registry.names():
        kt = registry.get(name)
        assert set(kt.summed_grads) <= set(kt.grad_params)


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_reference_gradients_are_autograd_of_the_reference_under_the_seeded_upstream(name):
    kt = registry.get(name)
    dims, kw = kt.sweep[-1]
    case = Case.make(name, dims, "float32", seed=11, **kw)
    args, kwargs = registry.build_inputs(case)
    g = gradients.upstream(case, args, kwargs)
    assert torch.equal(g, gradients.upstream(case, args, kwargs))  # both processes build the same one
    assert not torch.equal(g, gradients.upstream(case.replace(seed=12), args, kwargs))
    refs = gradients.reference_grads(case, (args, kwargs), g)
    want = gradients.expected(case, args)
    assert [tuple(r.shape) for r in refs] == [shape for _, shape, _ in want]
    assert all(r.dtype == torch.float64 for r in refs)
    # PyTorch's own autograd of its eager op in fp32 agrees (so the order and mapping are right)
    leaves = [a.clone().requires_grad_(n in kt.grad_params) if isinstance(a, torch.Tensor) and a.is_floating_point()
              else a for n, a in zip(kt.params, args)]
    out = kt.eager(*leaves, **kwargs)
    eager = torch.autograd.grad(out, [a for n, a in zip(kt.params, leaves) if n in kt.grad_params], g)
    for ref, e in zip(refs, eager):
        assert torch.allclose(e.double(), ref, rtol=1e-3, atol=1e-4 * float(ref.abs().max()) + 1e-12)


def test_a_weight_gradient_is_measured_against_its_own_rms_not_an_element():
    case = Case.make("rmsnorm", {"M": 130, "N": 33}, "float32", seed=3)
    ref = torch.tensor([1.0, -1.0, 1e-6, 2.0], dtype=torch.float64)
    rms = float(ref.pow(2).mean().sqrt())
    weight = gradients.bound(case, "weight", ref, torch.float32)
    x = gradients.bound(case, "x", ref.view(1, -1), torch.float32).view(-1)
    rtol, atol = gradients.GRAD_TOLERANCES["float32"]
    assert float(weight[2]) == pytest.approx(atol * rms + rtol * 1e-6)
    assert torch.equal(weight, x)  # one row: the row's rms is the whole tensor's
    two_rows = torch.stack([ref, 1000 * ref])
    assert float(gradients.bound(case, "x", two_rows, torch.float32)[0, 0]) < \
        float(gradients.bound(case, "weight", two_rows, torch.float32)[0, 0]) / 100


def _weight_check(case: Case, dweight: torch.Tensor):
    from harness.correctness.compare import check_values
    args, kwargs = registry.build_inputs(case)
    g = gradients.upstream(case, args, kwargs)
    ref = gradients.reference_grads(case, (args, kwargs), g)[1]
    size = gradients.magnitudes(case, (args, kwargs), g)[1]
    return check_values(dweight.double(), ref, gradients.bound(case, "weight", ref, torch.float32, size), torch.float32)


def test_a_one_column_layernorm_weight_gradient_of_exactly_zero_passes_and_a_wrong_one_does_not():
    # x - mean is exactly 0: the true dweight is 0 and PyTorch's float64 answer its own rounding (1e-14)
    case = Case.make("layernorm", {"M": 4, "N": 1}, "float32", seed=5)
    assert _weight_check(case, torch.zeros(1)).ok
    assert not _weight_check(case, torch.full((1,), 1e-3)).ok
    wide = Case.make("layernorm", {"M": 6, "N": 200}, "float32", seed=5)
    args, kwargs = registry.build_inputs(wide)
    ref = gradients.reference_grads(wide, (args, kwargs))[1]
    assert not _weight_check(wide, (ref * 1.001).float()).ok  # the room is the reference's, not the kernel's
