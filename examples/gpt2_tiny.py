"""A GPT-2-style decoder, small enough to profile on a CPU in a few seconds.

nn.LayerNorm, attention written out by hand (q @ k^T, a causal mask filled with -inf, softmax, @ v)
the way the original GPT-2 code does it, and a GELU MLP. KernelBench format, so it runs with no
options:

    autokernel profile examples/gpt2_tiny.py

or as a plain nn.Module file:

    autokernel profile examples/gpt2_tiny.py --class-name GPT2Tiny \
        --input-dtype tokens --vocab-size 2048 --input-shape 1,128
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB_SIZE, N_EMBD, N_LAYERS, N_HEADS, BLOCK_SIZE = 2048, 384, 4, 6, 256
BATCH, SEQ_LEN = 1, 128


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int):
        super().__init__()
        self.n_embd, self.n_head = n_embd, n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("bias", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Tiny(nn.Module):
    def __init__(self, vocab_size: int = VOCAB_SIZE, n_embd: int = N_EMBD, n_layers: int = N_LAYERS,
                 n_head: int = N_HEADS, block_size: int = BLOCK_SIZE):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, block_size) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx):
        pos = torch.arange(0, idx.shape[1], dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        # the next-token distribution, as a sampler consumes it
        return torch.softmax(logits[:, -1, :], dim=-1)


class Model(GPT2Tiny):
    """The KernelBench entry point: the same decoder."""


def get_inputs():
    return [torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN))]


def get_init_inputs():
    return [VOCAB_SIZE, N_EMBD, N_LAYERS, N_HEADS, BLOCK_SIZE]
