"""A Hugging Face transformers Mixtral, built from a small config (no download), KernelBench format:
2 layers, 4 experts, top-2 routing, 128 tokens, hidden 256, intermediate 512."""
import torch
import torch.nn as nn
from transformers import MixtralConfig, MixtralForCausalLM

VOCAB, HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, EXPERTS, TOP_K, SEQ = 1024, 256, 512, 2, 4, 2, 4, 2, 128


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the routing, and so each expert's share of the tokens, follows the weights
        config = MixtralConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                               num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                               num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, max_position_embeddings=SEQ)
        self.mixtral = MixtralForCausalLM(config).eval()

    def forward(self, idx):
        return self.mixtral(idx).logits


def get_inputs():
    return [torch.randint(0, VOCAB, (1, SEQ))]


def get_init_inputs():
    return []
