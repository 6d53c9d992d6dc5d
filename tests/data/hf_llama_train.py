"""tests/data/hf_llama_causal_tiny.py (a transformers LlamaForCausalLM built from a config, no
download) at vocabulary 1024, one layer and 2 x 256 tokens, trained on its own loss: with no loss_fn
or train_step here, autokernel's default step calls it with labels=ids and uses the loss it returns
(the call where a fused projection + cross-entropy is served), and the logits are large enough
beside the rest of the step for the fused loss's memory saving to show."""
import torch

from hf_llama_causal_tiny import Model as Tiny

VOCAB, LAYERS, BATCH, SEQ = 1024, 1, 2, 256


class Model(Tiny):
    def __init__(self):
        super().__init__(vocab=VOCAB, layers=LAYERS, positions=512)


def get_inputs():
    return [torch.randint(0, VOCAB, (BATCH, SEQ))]


def get_init_inputs():
    return []
