"""A Hugging Face transformers BERT encoder, built from a small config (no download), KernelBench format."""
import torch
import torch.nn as nn
from transformers import BertConfig, BertModel

VOCAB, HIDDEN, INTERMEDIATE, LAYERS, HEADS, SEQ = 1024, 256, 1024, 2, 4, 128


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                            num_hidden_layers=LAYERS, num_attention_heads=HEADS, max_position_embeddings=SEQ)
        self.bert = BertModel(config, add_pooling_layer=False).eval()

    def forward(self, idx):
        return self.bert(idx).last_hidden_state


def get_inputs():
    return [torch.randint(0, VOCAB, (1, SEQ))]


def get_init_inputs():
    return []
