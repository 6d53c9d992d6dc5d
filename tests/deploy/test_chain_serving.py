"""Chains served in transformers models built from a config (no weights): rotary on q and k in one
launch and SiLU(gate) x up, bound where the chain occurs, each served call counted, the outputs
those of the unpatched model."""
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
    spec = importlib.util.spec_from_file_location(f"starter_{kernel_type}", starter_path(kernel_type))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.kernel_fn


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
