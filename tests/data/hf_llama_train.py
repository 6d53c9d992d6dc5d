"""A transformers LlamaForCausalLM built from a small config (no download), trained on its own loss:
with no loss_fn or train_step here, autokernel's default step calls it with labels=ids and uses the
loss it returns (the call where a fused projection + cross-entropy is served)."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, HIDDEN, INTERMEDIATE, LAYERS, HEADS, BATCH, SEQ = 1024, 64, 128, 1, 2, 2, 256


class Model(LlamaForCausalLM):
    def __init__(self):
        torch.manual_seed(0)
        super().__init__(LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                                     num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                     max_position_embeddings=512))


def get_inputs():
    return [torch.randint(0, VOCAB, (BATCH, SEQ))]


def get_init_inputs():
    return []
