"""A Hugging Face transformers GPT-2, built from a small config (no download), KernelBench format."""
import torch
import torch.nn as nn
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB, N_EMBD, N_LAYER, N_HEAD, SEQ = 2048, 256, 2, 4, 64


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=N_EMBD, n_layer=N_LAYER, n_head=N_HEAD,
                                               n_positions=SEQ)).eval()

    def forward(self, idx):
        return self.gpt2(idx).logits


def get_inputs():
    return [torch.randint(0, VOCAB, (1, SEQ))]


def get_init_inputs():
    return []
