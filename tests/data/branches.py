"""A model whose every served operator reads the model's own input: an RMSNorm, a LLaMA MLP and a
projection side by side. The rehearsal of a first launch (tests/rehearsal/test_places.py) serves it
through an exported package behind a stand-in driver that computes nothing, so no served call may
take another's (uninitialised) output as its input."""
import torch
import torch.nn as nn
import torch.nn.functional as F


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


class MLP(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Branches(nn.Module):
    def __init__(self, dim: int = 32, ffn_dim: int = 64):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.mlp = MLP(dim, ffn_dim)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        return self.norm(x) + self.mlp(x) + self.proj(x)
