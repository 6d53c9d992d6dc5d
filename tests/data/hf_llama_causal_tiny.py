"""A transformers LlamaForCausalLM built from a config (no download), trained on its own loss, small
enough for the Triton interpreter. On a CPU,

    autokernel optimize tests/data/hf_llama_causal_tiny.py --train --budget 10m

judges every target's starter forward and backward, the four chains' among them (on the CPU the
budget goes to verdicts first: docs/night.md), and verify serves them in the unmodified model: in
its forward, and in its training step, 20 AdamW steps against eager. With no loss_fn here,
autokernel's default step calls the model with labels=ids and uses the loss it returns.
tests/data/hf_llama_train.py is the same model at 2 x 256 tokens, where the fused loss's memory
saving shows."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, HIDDEN, INTERMEDIATE, LAYERS, HEADS, BATCH, SEQ = 256, 64, 128, 2, 2, 1, 16


class Model(LlamaForCausalLM):
    def __init__(self, vocab=VOCAB, layers=LAYERS, positions=64):
        torch.manual_seed(0)
        super().__init__(LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                                     num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                                     max_position_embeddings=positions))


def get_inputs():
    return [torch.randint(0, VOCAB, (BATCH, SEQ))]


def get_init_inputs():
    return []
