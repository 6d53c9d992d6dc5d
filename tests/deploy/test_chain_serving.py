"""Chains served in transformers models built from a config (no weights): rotary on q and k in one
launch, SiLU(gate) x up, the decoder layer's residual add + post-attention norm, and the causal LM's
projection + loss in training with labels, bound where the chain occurs, each served call and
fallback counted, the outputs those of the unpatched model, eager and under torch.compile."""
import importlib.util

import pytest
import torch

from autokernel.deploy import routing
from starter_kernels import starter_path

transformers = pytest.importorskip("transformers")

# (config class, model class) by family; one layer, small enough for the Triton interpreter
FAMILIES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
            "mistral": ("MistralConfig", "MistralForCausalLM")}
SEQ, HIDDEN, FFN, HEADS, KV_HEADS = 8, 32, 64, 4, 2


def _starter(kernel_type):
    return _starter_module(kernel_type).kernel_fn


def _starter_module(kernel_type):
    spec = importlib.util.spec_from_file_location(f"starter_{kernel_type}", starter_path(kernel_type))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _model(family):
    config_cls, model_cls = (getattr(transformers, n) for n in FAMILIES[family])
    config = config_cls(vocab_size=64, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=1,
                        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=64)
    torch.manual_seed(0)
    return model_cls(config).eval(), torch.randint(0, 64, (1, SEQ))


def _winners(model):
    attention = [{"name": n, "class": type(m).__name__} for n, m in model.named_modules() if n.endswith("self_attn")]
    mlps = [{"name": n, "class": type(m).__name__} for n, m in model.named_modules() if n.endswith(".mlp")]
    head = HIDDEN // HEADS
    return [routing.Winner(f"rotary_qk[1x{HEADS}x{KV_HEADS}x{SEQ}x{head}:float32]", "rotary_qk",
                           {"B": 1, "HQ": HEADS, "HK": KV_HEADS, "S": SEQ, "D": head}, "float32",
                           _starter("rotary_qk"), {}, "pattern", attention),
            routing.Winner(f"silu_mul[{SEQ}x{FFN}:float32]", "silu_mul", {"M": SEQ, "N": FFN}, "float32",
                           _starter("silu_mul"), {}, "module", mlps)]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_rotary_qk_and_silu_mul_serve_the_model_where_their_chains_occur(family, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model, ids = _model(family)
    router = routing.Router(_winners(model))
    with torch.no_grad():
        expected = model(ids).logits
        with router.patched(model):
            got = model(ids).logits
    assert (got - expected).abs().max().item() < 1e-4 * expected.abs().max().item()
    kernels = router.tally.to_json()["per_kernel"]
    rotary = kernels[f"rotary_qk[1x{HEADS}x{KV_HEADS}x{SEQ}x{HIDDEN // HEADS}:float32]"]
    silu = kernels[f"silu_mul[{SEQ}x{FFN}:float32]"]
    # one layer: one q/k rotary call and one MLP call, each served by the chain's Triton kernel
    assert rotary["calls_served"] == 1 and rotary["fallbacks"] == 0, rotary
    assert silu["calls_served"] == 1 and silu["fallbacks"] == 0, silu


def _chain_winners(model, *kernel_types):
    """Winners for add_rmsnorm (the decoder layers) and linear_cross_entropy (the causal LM), with
    their starters' backwards, beside rotary_qk and silu_mul."""
    layers = [{"name": n, "class": type(m).__name__} for n, m in model.named_modules() if n.endswith("layers.0")]
    lm = [{"name": "", "class": type(model).__name__}]
    winners = {w.kernel_type: w for w in _winners(model)}
    for kernel_type, dims, modules in (("add_rmsnorm", {"M": SEQ, "N": HIDDEN}, layers),
                                       ("linear_cross_entropy", {"N": SEQ, "D": HIDDEN, "V": 64}, lm)):
        starter = _starter_module(kernel_type)
        target = f"{kernel_type}[{'x'.join(map(str, dims.values()))}:float32]"
        winners[kernel_type] = routing.Winner(target, kernel_type, dims, "float32", starter.kernel_fn, {}, "module",
                                              modules, backward_fn=starter.backward_fn)
    for kernel_type in ("rotary_qk", "silu_mul"):
        winners[kernel_type].backward_fn = _starter_module(kernel_type).backward_fn
    return [winners[t] for t in kernel_types]


def _served(router):
    return {w.kernel_type: (k["calls_served"], k["fallbacks"], k["fallback_reasons"])
            for w, k in zip(router.winners, router.tally.to_json()["per_kernel"].values())}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_add_rmsnorm_serves_the_decoder_layer_with_the_forms_inside_it(family, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model, ids = _model(family)
    router = routing.Router(_chain_winners(model, "add_rmsnorm", "rotary_qk", "silu_mul"))
    longer = torch.randint(0, 64, (1, SEQ + 3))
    with torch.no_grad():
        expected, expected_longer = model(ids).logits, model(longer).logits
        with router.patched(model):
            got = model(ids).logits
            got_longer = model(longer).logits  # outside the winner's range: the layer's own ops, counted
    for want, have in ((expected, got), (expected_longer, got_longer)):
        assert (have - want).abs().max().item() < 1e-4 * want.abs().max().item()
    served = _served(router)
    # one layer: the attention's rotary and the MLP's silu_mul still serve inside the bound layer
    assert served["add_rmsnorm"][:2] == (1, 1) and served["rotary_qk"][:2] == (1, 1)
    assert served["silu_mul"][:2] == (1, 1)
    assert list(served["add_rmsnorm"][2]) == ["rows 11: not proven (judged at rows 8)"]


def test_a_decoder_layer_that_is_not_the_pre_norm_form_is_left_unbound(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model, ids = _model("llama")
    layer = model.model.layers[0]

    def post_norm(self, hidden_states, **kwargs):  # the same parts, another order: x + norm(attn(x))
        h, _ = self.self_attn(hidden_states=hidden_states, **kwargs)
        h = hidden_states + self.post_attention_layernorm(h)
        return h + self.mlp(self.input_layernorm(h))
    layer.forward = post_norm.__get__(layer)
    router = routing.Router(_chain_winners(model, "add_rmsnorm"))
    with torch.no_grad():
        expected = model(ids).logits
        with router.patched(model):
            got = model(ids).logits
    assert torch.equal(got, expected)
    calls, fallbacks, reasons = _served(router)["add_rmsnorm"]
    assert calls == 0 and fallbacks == 1 and "did not match the add_rmsnorm reference" in next(iter(reasons))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_fused_loss_serves_a_training_step_with_labels_and_never_a_call_that_reads_logits(family, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model, ids = _model(family)
    model.train()
    labels = ids.clone()
    labels[0, :2] = -100  # ignored positions, as a padded batch has

    def grads(out):
        out.loss.backward()
        found = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        return found
    eager = model(ids, labels=labels)
    eager_loss, eager_grads = eager.loss.detach(), grads(eager)
    model.eval()
    with torch.no_grad():
        eval_logits = model(ids).logits
    model.train()
    router = routing.Router(_chain_winners(model, "linear_cross_entropy"))
    with router.patched(model):
        fused = model(ids, labels=labels)
        assert fused.logits is None  # the logits never existed: the loss is what the step reads
        assert abs(fused.loss.item() - eager_loss.item()) < 1e-5 * abs(eager_loss.item())
        fused_grads = grads(fused)
        model.eval()
        with torch.no_grad():
            no_labels = model(ids)
            eval_with_labels = model(ids, labels=labels)
        model.train()
    assert fused_grads.keys() == eager_grads.keys()
    for name, g in eager_grads.items():
        assert (fused_grads[name] - g).norm() <= 1e-4 * g.norm() + 1e-12, name
    assert torch.equal(no_labels.logits, eval_logits) and eval_with_labels.logits is not None
    assert abs(eval_with_labels.loss.item() - eager_loss.item()) < 1e-5 * abs(eager_loss.item())
    calls, fallbacks, reasons = _served(router)["linear_cross_entropy"]
    assert calls == 1 and fallbacks == 2, reasons
    assert sorted(reasons) == sorted([routing.chain_forms.NO_LABELS, routing.chain_forms.EVAL])


def test_chains_stay_served_and_counted_under_torch_compile(monkeypatch):
    """aot_eager: Dynamo and AOT autograd trace forward and backward with the custom ops as graph
    nodes, as inductor would, without inductor's C++ build on a CPU test runner."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from torch._dynamo.utils import counters
    model, ids = _model("llama")
    model.train()
    eager = model(ids, labels=ids)
    eager.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    types = ("add_rmsnorm", "linear_cross_entropy", "rotary_qk", "silu_mul")
    router = routing.Router(_chain_winners(model, *types))
    torch._dynamo.reset()
    counters.clear()
    with router.patched(model):
        with torch.no_grad():
            model(ids, labels=ids)  # the first eager call binds the forms
        bound = {t: n for t, (n, _, _) in _served(router).items()}
        compiled = torch.compile(model, backend="aot_eager")
        out = compiled(ids, labels=ids)
        out.loss.backward()
    assert abs(out.loss.item() - eager.loss.item()) < 1e-5 * abs(eager.loss.item())
    for name, p in model.named_parameters():
        assert (p.grad - want[name]).norm() <= 1e-4 * want[name].norm() + 1e-12, name
    assert not counters["graph_break"]
    served = _served(router)
    for kernel_type in types:  # the compiled graph's run of each chain's op, beside the eager binding call
        assert served[kernel_type][0] == bound[kernel_type] + 1, (kernel_type, served)
        assert router.tally.to_json()["per_kernel"][router.winners[types.index(kernel_type)].target][
            "served_by_op"].get("torch.compile graph") == 1
