"""Chain types in the contract: each reference is its operators composed in float64, forward and
backward, and it tells an honest chain from one that drops or changes an operator."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from harness.correctness.compare import check_values
from harness.kernel_types import gradients, registry
from harness.kernel_types.registry import Case

CHAINS = ("add_rmsnorm", "silu_mul", "rotary_qk", "linear_cross_entropy")


def _inputs(name, dtype="float32", seed=5, variant="plain", **kw):
    kt = registry.get(name)
    case = Case.make(name, kt.smoke_shape, dtype, seed=seed, variant=variant, **kw)
    return case, *registry.build_inputs(case)


def test_chain_types_are_registered_with_no_aten_op_of_their_own():
    for name in CHAINS:
        kt = registry.get(name)
        # found as chains in the data-flow graph (autokernel.profile.chains), never by one op
        assert kt.aten_ops == () and kt.grad_params


def test_add_rmsnorm_is_the_sum_and_rmsnorm_of_the_sum():
    case, args, kwargs = _inputs("add_rmsnorm", eps=1e-5)
    x, residual, weight = args
    out = registry.get("add_rmsnorm").reference(*args, **kwargs)
    s = x.double() + residual.double()
    assert out.shape == (2, *x.shape)
    assert torch.equal(out[0], s)
    assert torch.allclose(out[1], registry.get("rmsnorm").reference(s, weight, eps=1e-5), rtol=0, atol=1e-12)


def test_rotary_qk_is_each_tensor_s_rotary_on_the_head_dim():
    case, (q, k, cos, sin), _ = _inputs("rotary_qk")
    assert q.shape[1] != k.shape[1]  # grouped-query attention: fewer k heads
    out = registry.get("rotary_qk").reference(q, k, cos, sin)
    rope = registry.get("rotary_embedding").reference
    assert torch.allclose(out, torch.cat([rope(q, cos, sin), rope(k, cos, sin)], dim=1), rtol=0, atol=1e-12)


def test_silu_mul_is_silu_of_the_gate_times_up():
    case, (gate, up), _ = _inputs("silu_mul")
    out = registry.get("silu_mul").reference(gate, up)
    assert torch.allclose(out, gate.double() / (1 + torch.exp(-gate.double())) * up.double(), rtol=1e-14, atol=0)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_cross_entropy_leaves_ignored_rows_out(reduction):
    case, (x, weight, targets), kwargs = _inputs("linear_cross_entropy", reduction=reduction, ignore_index=3)
    targets[::3] = 3  # every third row ignored
    loss = registry.get("linear_cross_entropy").reference(x, weight, targets, **kwargs)
    logits = x.double() @ weight.double().T
    kept = targets != 3
    per_row = torch.logsumexp(logits[kept], -1) - logits[kept].gather(1, targets[kept, None]).squeeze(1)
    want = per_row.mean() if reduction == "mean" else per_row.sum()
    assert loss.dtype == torch.float64 and torch.allclose(loss, want, rtol=1e-12, atol=0)
    # the cross_entropy type's reference, on the logits the chain never materialises
    if reduction == "mean":
        assert torch.allclose(loss, registry.get("cross_entropy").reference(logits[kept], targets[kept]), rtol=1e-12)


def test_the_inputs_hold_ignored_rows_and_never_only_those():
    for seed in range(20):
        case, (x, weight, targets), _ = _inputs("linear_cross_entropy", seed=seed)
        assert (targets != -100).any()
    counts = [int((_inputs("linear_cross_entropy", seed=s)[1][2] == -100).sum()) for s in range(20)]
    assert sum(counts) > 0


def test_chain_gradients_compose_their_operators_gradients():
    case, args, kwargs = _inputs("add_rmsnorm")
    g = gradients.upstream(case, args, kwargs)
    dx, dres, dw = gradients.reference_grads(case, (args, kwargs), g)
    assert torch.equal(dx, dres)  # both terms of the sum get the sum's gradient
    # the sum's own gradient (out[0]) plus RMSNorm's input gradient of out[1]'s
    s = (args[0].double() + args[1].double()).requires_grad_(True)
    w = args[2].double().requires_grad_(True)
    y = registry.get("rmsnorm").reference(s, w)
    ds, dw_norm = torch.autograd.grad(y, (s, w), g[1].double())
    assert torch.allclose(dx, g[0].double() + ds, rtol=1e-12, atol=1e-14)
    assert torch.allclose(dw, dw_norm, rtol=1e-12, atol=1e-14)

    case, args, kwargs = _inputs("linear_cross_entropy", reduction="sum")
    args[2][0] = -100
    g = gradients.upstream(case, args, kwargs)
    dx, dweight = gradients.reference_grads(case, (args, kwargs), g)
    assert torch.count_nonzero(dx[0]) == 0 and dx.shape == args[0].shape and dweight.shape == args[1].shape


@pytest.mark.parametrize("name", CHAINS)
def test_every_case_of_every_stage_builds_and_eager_agrees_with_the_reference(name):
    kt = registry.get(name)
    cases = [(v, d, {}) for v, d, _ in kt.stability] + list(kt.edge_cases) + [("plain", d, k) for d, k in kt.sweep]
    for variant, dims, kw in cases:
        case = Case.make(name, dims, "float32", seed=1, variant=variant, **kw)
        args, kwargs = registry.build_inputs(case)
        ref = kt.reference(*args, **kwargs)
        eager = kt.eager(*args, **kwargs)
        rtol, atol = kt.tolerances["float32"]
        bound = atol * registry.row_rms(ref) + rtol * ref.abs()
        assert check_values(eager.double(), ref, bound, eager.dtype).ok, case.label()


def test_a_chain_that_drops_an_operator_is_out_of_tolerance():
    # add_rmsnorm that normalises x instead of the sum; linear_cross_entropy that counts ignored rows
    case, args, kwargs = _inputs("add_rmsnorm")
    ref = registry.get("add_rmsnorm").reference(*args, **kwargs)
    x, residual, weight = (a.double() for a in args)
    wrong = torch.stack([x + residual, registry.get("rmsnorm").reference(x, weight)])
    assert not check_values(wrong, ref, 1e-4 * registry.row_rms(ref) + 1e-4 * ref.abs(), torch.float32).ok

    case, (x, weight, targets), kwargs = _inputs("linear_cross_entropy")
    targets[:2] = -100
    ref = registry.get("linear_cross_entropy").reference(x, weight, targets)
    counted = F.cross_entropy(x.double() @ weight.double().T, targets.clamp_min(0))
    assert not check_values(counted, ref, 1e-4 * ref.abs(), torch.float32).ok
