"""A LLaMA-style decoder, small enough to profile on a CPU in a few seconds.

Written the way real model code is written: a hand-written RMSNorm (pow, mean, rsqrt), rotate-half
rotary embeddings applied to q and k, F.scaled_dot_product_attention with is_causal=True, a SwiGLU
MLP with gate/up/down projections, and an untied lm head.

As a plain nn.Module file:

    autokernel profile examples/llama_tiny.py --class-name LlamaTiny \
        --input-dtype tokens --vocab-size 2048 --input-shape 1,128

As a KernelBench-format file (Model, get_inputs, get_init_inputs), with no options:

    autokernel profile examples/llama_tiny.py

`get_workload()` is what `autokernel verify` runs the model on besides `get_inputs()`: a shorter
prompt, two requests in a batch and one decode step (this model keeps no KV cache, so a decode
step is a one-token forward).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB_SIZE, DIM, N_LAYERS, N_HEADS, FFN_DIM = 2048, 384, 4, 6, 1024
BATCH, SEQ_LEN = 1, 128


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.eps)
        return self.weight * hidden_states.to(input_dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin):
    q_embed = (q * cos) + (rotate_half(q) * sin)
    k_embed = (k * cos) + (rotate_half(k) * sin)
    return q_embed, k_embed


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, max_positions: int = 2048, base: float = 10000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        freqs = torch.outer(torch.arange(max_positions).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x, seq_len: int):
        return self.cos_cached[:seq_len].to(x.dtype), self.sin_cached[:seq_len].to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin):
        bsz, seq_len, _ = x.shape
        q = self.q_proj(x).view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(bsz, seq_len, self.n_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).contiguous().view(bsz, seq_len, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, n_heads: int, ffn_dim: int):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = Attention(dim, n_heads)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = MLP(dim, ffn_dim)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaTiny(nn.Module):
    def __init__(self, vocab_size: int = VOCAB_SIZE, dim: int = DIM, n_layers: int = N_LAYERS,
                 n_heads: int = N_HEADS, ffn_dim: int = FFN_DIM):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab_size, dim)
        self.rotary_emb = RotaryEmbedding(dim // n_heads)
        self.layers = nn.ModuleList(DecoderLayer(dim, n_heads, ffn_dim) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab_size, bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(x, input_ids.shape[1])
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


class Model(LlamaTiny):
    """The KernelBench entry point: the same decoder."""


def get_inputs():
    return [torch.randint(0, VOCAB_SIZE, (BATCH, SEQ_LEN))]


def get_init_inputs():
    return [VOCAB_SIZE, DIM, N_LAYERS, N_HEADS, FFN_DIM]


def get_workload():
    prompt = SEQ_LEN // 2 + 3
    return [{"name": f"prompt {BATCH}x{prompt}", "inputs": [torch.randint(0, VOCAB_SIZE, (BATCH, prompt))]},
            {"name": f"batch {2 * BATCH}x{SEQ_LEN}", "inputs": [torch.randint(0, VOCAB_SIZE, (2 * BATCH, SEQ_LEN))]},
            {"name": f"decode {BATCH}x1", "inputs": [torch.randint(0, VOCAB_SIZE, (BATCH, 1))]}]
