"""Binding at patch time: nothing sees every op, an unmatched call goes straight to the original,
everything replaced is put back on exit, and torch.compile inside the patch keeps the kernels.

The kernels are written in PyTorch (the router does not care what a kernel_fn runs), so these
tests check the mechanism, never a time."""
import torch
import torch.nn.functional as F
import pytest

from autokernel.deploy import routing
from autokernel.deploy.routing import sites
from tiny_llama import TARGETS, llama, winners


def torch_attributes():
    return {(owner.__name__, name): vars(owner).get(name) for owner, name in
            ((F, "linear"), (F, "scaled_dot_product_attention"), (F, "softmax"), (torch, "matmul"),
             (torch.Tensor, "__matmul__"), (torch.Tensor, "softmax"), (torch.Tensor, "matmul"))}


def test_no_torch_function_mode_is_active_while_patched():
    module, model, tokens = llama()
    with torch.no_grad(), routing.Router(winners([])).patched(model):
        assert torch._C._len_torch_function_stack() == 0
        model(tokens)
        assert torch._C._len_torch_function_stack() == 0


def test_everything_replaced_is_the_original_again_after_exit():
    module, model, tokens = llama()
    before_torch = torch_attributes()
    before_globals = dict(vars(module))
    forwards = {name: vars(m).get("forward") for name, m in model.named_modules()}
    router = routing.Router(winners([]))
    with torch.no_grad(), router.patched(model):
        assert F.scaled_dot_product_attention is not before_torch[("torch.nn.functional",
                                                                   "scaled_dot_product_attention")]
        assert module.apply_rotary_pos_emb is not before_globals["apply_rotary_pos_emb"]
        assert "forward" in vars(model.layers[0].self_attn.q_proj) and "forward" in vars(model.norm)
        model(tokens)
    assert torch_attributes() == before_torch
    assert dict(vars(module)) == before_globals
    assert {name: vars(m).get("forward") for name, m in model.named_modules()} == forwards


def test_only_what_a_winner_serves_is_replaced():
    module, model, tokens = llama()
    norm_only = [t for t in TARGETS if t[1] == "rmsnorm"]
    before = torch_attributes()
    with routing.Router(winners([], norm_only)).patched(model):
        assert torch_attributes() == before  # no torch function: no winner of an op type
        replaced = {name for name, m in model.named_modules() if "forward" in vars(m)}
    assert replaced == {"layers.0.input_layernorm", "layers.0.post_attention_layernorm", "norm"}


def test_an_unmatched_call_goes_to_the_original_and_is_refused_by_shape_alone(monkeypatch):
    module, model, tokens = llama()
    calls = []
    other_tokens = [(t.replace("8x", "16x").replace("1x2x8x16", "1x2x16x16"), kt,
                     {k: (16 if v == 8 else v) for k, v in dims.items()}, kw, route, mods, n)
                    for t, kt, dims, kw, route, mods, n in TARGETS]
    router = routing.Router(winners(calls, other_tokens))
    with torch.no_grad():
        expected = model(tokens)
        with router.patched(model):
            model(tokens)
            # from now on a refused call never reaches the router's parsing or matching
            monkeypatch.setattr(router, "route", lambda *a, **k: pytest.fail("a refused call was routed again"))
            out = model(tokens)
    assert torch.equal(out, expected) and calls == []
    tally = router.tally.to_json()
    for target, *_ in other_tokens:
        assert tally["per_kernel"][target]["calls_served"] == 0
    assert tally["per_op"]["F.linear"]["fell_back"] == 2 * 5  # q, k, v, o and the lm head, twice
    # a winner judged at 16 rows only: the calls at 8 rows are its fallbacks, counted with the reason
    assert tally["per_op"]["RMSNorm.forward"]["reasons"] == {"rows 8: not proven (judged at rows 16)": 6}
    assert tally["per_kernel"]["rmsnorm[16x32:float32]"]["fallback_reasons"] == {
        "rows 8: not proven (judged at rows 16)": 6}
    assert tally["per_op"]["F.linear"]["reasons"]["no winner at matmul[8x32x64:float32]"] == 2  # the lm head


def test_a_torch_function_outside_the_recorded_modules_is_not_checked():
    module, model, tokens = llama()
    flash = [t for t in TARGETS if t[1] == "flash_attention"]
    router = routing.Router(winners([], flash))
    q = torch.randn(1, 2, 8, 16)
    with torch.no_grad(), router.patched(model):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)  # matches the winner, outside Attention
        model(tokens)
    served = router.tally.to_json()["per_kernel"][flash[0][0]]
    assert served["calls_served"] == 1 and served["fallbacks"] == 0


def test_each_winner_is_a_custom_op_with_a_fake():
    calls = []
    (w,) = winners(calls, [t for t in TARGETS if t[1] == "fused_mlp"])
    op = w.registered()
    x, wg, wu, wd = torch.randn(8, 32), torch.randn(64, 32), torch.randn(64, 32), torch.randn(32, 64)
    assert torch.allclose(op(x, wg, wu, wd), routing.REFERENCES["fused_mlp"](x, wg, wu, wd), atol=1e-5)
    assert calls == ["fused_mlp"]
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake = op(*(mode.from_tensor(t) for t in (x, wg, wu, wd)))
    assert fake.shape == (8, 32) and calls == ["fused_mlp"]  # the fake ran, not the kernel


def test_counting_is_skipped_while_dynamo_traces(monkeypatch):
    # A count is a side effect Dynamo would guard on (a recompile per call): while it traces, calls
    # are served and refused as in eager, but nothing is counted or remembered. The forward runs
    # eagerly with the flag Dynamo sets while tracing, so the stand-ins take their tracing paths.
    module, model, tokens = llama()
    longer = torch.randint(0, 64, (1, 16))  # outside every winner's range: the refusal path
    calls = []
    router = routing.Router(winners(calls))
    with torch.no_grad(), router.patched(model):
        expected = model(tokens), model(longer)  # eager: binds the forms, counts, remembers refusals
        counted = router.tally.to_json()
        assert counted["per_kernel"]["rmsnorm[8x32:float32]"]["calls_served"] == 3
        del calls[:]
        monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
        assert sites.compiling() is True
        traced = model(tokens), model(longer)
        monkeypatch.setattr(torch.compiler, "_is_compiling_flag", False)
        assert router.tally.to_json() == counted
    assert all(torch.equal(a, b) for a, b in zip(traced, expected))
    assert sorted(set(calls)) == sorted({kt for _, kt, *_ in TARGETS})  # the kernels still ran


@pytest.mark.slow
def test_torch_compile_inside_the_patch_keeps_every_kernel_and_matches_the_outputs():
    module, model, tokens = llama()
    calls = []
    router = routing.Router(winners(calls))
    with torch.no_grad():
        expected = model(tokens)
        with router.patched(model):
            model(tokens)  # the first eager forward binds the hand-written forms
            before = len(calls)
            compiled = torch.compile(model)
            outs = [compiled(tokens) for _ in range(2)]
    per_forward = {kt: n for _, kt, *_, n in TARGETS}
    assert len(calls) - before == 2 * sum(per_forward.values())
    for kernel_type, n in per_forward.items():
        assert calls[before:].count(kernel_type) == 2 * n, kernel_type
    for out in outs:
        assert (out - expected).abs().max().item() < 1e-5


def test_a_linear_shape_served_once_is_served_again_by_the_short_path_with_its_bias(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the bias is added by a small Triton kernel
    model = torch.nn.Sequential(torch.nn.Linear(16, 16, bias=True)).eval()
    calls = []
    (w,) = winners(calls, [("matmul[4x16x16:float32]", "matmul", {"M": 4, "K": 16, "N": 16}, {}, "op", [], 0)])
    router = routing.Router([w])
    x = torch.randn(4, 16)
    expected = model(x)
    with router.patched(model):
        with torch.no_grad():
            outs = [model(x) for _ in range(3)]
        model(x)  # autograd on: the short path hands it to the full one, which says why it falls back
    assert calls == ["matmul"] * 3 and all((o - expected).abs().max().item() < 1e-5 for o in outs)
    kernel = router.tally.to_json()["per_kernel"]["matmul[4x16x16:float32]"]
    assert kernel["served_by_op"] == {"F.linear+bias": 3}
    assert list(kernel["fallback_reasons"]) == [routing.calls.AUTOGRAD]
    (site,) = [s for s in router.tally.sites if isinstance(s, sites.LinearSite)]
    assert site.accepted == {torch.Size([4, 16]): w}


def _rotate(x):  # a model file's own function, called by name from a wrapped forward
    return x.flip(-1)


def _keeps_kwargs(fn):  # what transformers' deprecate_kwarg does to LlamaAttention.forward
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper


class _Wrapped(torch.nn.Module):
    @_keeps_kwargs
    def forward(self, x):
        return _rotate(x)


def test_the_functions_a_wrapped_forward_calls_are_found_through_the_wrapper():
    from autokernel.deploy.routing.binding import _callees
    assert [name for _, name in _callees(_Wrapped())] == ["_rotate"]
