"""A LLaMA block the way Meta's reference code writes it: complex-number rotary embeddings
(view_as_complex), grouped-query attention expanded by repeat_interleave, and an explicit masked
attention (masked_fill before the softmax). KernelBench format."""
import torch
import torch.nn as nn
import torch.nn.functional as F

DIM, N_HEADS, N_KV, SEQ = 128, 4, 2, 32


def precompute_freqs_cis(head_dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2).float() / head_dim))
    return torch.polar(torch.ones(end, head_dim // 2), torch.outer(torch.arange(end).float(), freqs))


class Rotary(nn.Module):
    def forward(self, xq, xk, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        f = freqs_cis.view(1, xq.shape[1], 1, -1)
        return (torch.view_as_real(xq_ * f).flatten(3).type_as(xq),
                torch.view_as_real(xk_ * f).flatten(3).type_as(xk))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.hd = DIM // N_HEADS
        self.wq = nn.Linear(DIM, N_HEADS * self.hd, bias=False)
        self.wk = nn.Linear(DIM, N_KV * self.hd, bias=False)
        self.wv = nn.Linear(DIM, N_KV * self.hd, bias=False)
        self.wo = nn.Linear(N_HEADS * self.hd, DIM, bias=False)
        self.rotary = Rotary()
        self.register_buffer("bias", torch.tril(torch.ones(SEQ, SEQ)).view(1, 1, SEQ, SEQ), persistent=False)

    def forward(self, x, freqs_cis):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, N_HEADS, self.hd)
        k = self.wk(x).view(B, T, N_KV, self.hd)
        v = self.wv(x).view(B, T, N_KV, self.hd)
        q, k = self.rotary(q, k, freqs_cis)
        k = k.repeat_interleave(N_HEADS // N_KV, dim=2)
        v = v.repeat_interleave(N_HEADS // N_KV, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / self.hd ** 0.5
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = Attention()
        self.register_buffer("freqs_cis", precompute_freqs_cis(DIM // N_HEADS, SEQ), persistent=False)

    def forward(self, x):
        return self.attn(x, self.freqs_cis[: x.shape[1]])


def get_inputs():
    return [torch.randn(1, SEQ, DIM)]


def get_init_inputs():
    return []
