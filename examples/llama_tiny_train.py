"""The LLaMA-style decoder of llama_tiny.py, declared for training.

`loss_fn(output, inputs)` makes this file a training step: the next-token cross-entropy of the
logits, and `get_optimizer(model)` its optimizer. So `profile` and `optimize` measure forward,
backward and the optimizer step with no option (`--no-train` profiles inference):

    autokernel profile examples/llama_tiny_train.py
    autokernel optimize examples/llama_tiny_train.py --budget 5m

Each target's time is its forward's plus its backward's; the AdamW step is timed apart.

Smaller than llama_tiny.py (2 layers of width 128, 2x64 tokens): without a GPU every candidate's
forward and backward run in Triton's interpreter, where a backward costs several forwards, so this
size lets a five-minute run on a CPU judge more than its starters. On a GPU, widen it freely.
"""
import torch
import torch.nn.functional as F

# the same model class; Model is this file's too (a name autokernel looks up)
from llama_tiny import Model  # noqa: F401

VOCAB_SIZE, DIM, N_LAYERS, N_HEADS, FFN_DIM = 512, 128, 2, 4, 256
BATCH, SEQ_LEN = 2, 64


def get_inputs():
    return [torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN))]


def get_init_inputs():
    return [VOCAB_SIZE, DIM, N_LAYERS, N_HEADS, FFN_DIM]


def loss_fn(logits, inputs):
    """Predict each next token: position t's logits against token t + 1."""
    (ids,) = inputs
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB_SIZE), ids[:, 1:].reshape(-1))


def get_workload():
    """What `verify` runs the model on besides get_inputs(): a shorter prompt, a bigger batch, a decode step."""
    prompt = SEQ_LEN // 2 + 3
    return [{"name": f"prompt {BATCH}x{prompt}", "inputs": [torch.randint(0, VOCAB_SIZE, (BATCH, prompt))]},
            {"name": f"batch {2 * BATCH}x{SEQ_LEN}", "inputs": [torch.randint(0, VOCAB_SIZE, (2 * BATCH, SEQ_LEN))]},
            {"name": f"decode {BATCH}x1", "inputs": [torch.randint(0, VOCAB_SIZE, (BATCH, 1))]}]


def get_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

