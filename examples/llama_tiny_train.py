"""The LLaMA-style decoder of llama_tiny.py, declared for training.

`loss_fn(output, inputs)` makes this file a training step: the next-token cross-entropy of the
logits, and `get_optimizer(model)` its optimizer. So `profile` and `optimize` measure forward,
backward and the optimizer step with no option (`--no-train` profiles inference):

    autokernel profile examples/llama_tiny_train.py
    autokernel optimize examples/llama_tiny_train.py --budget 5m

Each target's time is its forward's plus its backward's; the AdamW step is timed apart.
"""
import torch
import torch.nn.functional as F

# the same model; Model and get_workload are this file's too (the names autokernel looks up)
from llama_tiny import DIM, FFN_DIM, N_HEADS, N_LAYERS, SEQ_LEN, VOCAB_SIZE, Model, get_workload  # noqa: F401

BATCH = 2


def get_inputs():
    return [torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN))]


def get_init_inputs():
    return [VOCAB_SIZE, DIM, N_LAYERS, N_HEADS, FFN_DIM]


def loss_fn(logits, inputs):
    """Predict each next token: position t's logits against token t + 1."""
    (ids,) = inputs
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB_SIZE), ids[:, 1:].reshape(-1))


def get_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

