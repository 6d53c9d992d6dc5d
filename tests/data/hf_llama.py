"""A Hugging Face transformers LLaMA, built from a small config (no download), KernelBench format."""
import torch
import torch.nn as nn
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, SEQ = 1024, 256, 512, 2, 4, 2, 128


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                             num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                             max_position_embeddings=SEQ)
        self.llama = LlamaForCausalLM(config).eval()

    def forward(self, idx):
        return self.llama(idx).logits


def get_inputs():
    return [torch.randint(0, VOCAB, (1, SEQ))]


def get_init_inputs():
    return []
