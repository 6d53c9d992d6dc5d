"""A GPT-2 MLP block with a tanh-approximated GELU: the GELU is no kernel type, so its time goes
to a module target (module[MLP.act:...]) that the LLM agent searches as a KernelBench problem.
Small enough for the Triton interpreter on a CPU. KernelBench format:

    autokernel profile examples/gelu_mlp.py
"""
import math

import torch
import torch.nn as nn

BATCH, SEQ_LEN, N_EMBD, N_LAYERS = 1, 16, 64, 2


class TanhGELU(nn.Module):
    """GELU as GPT-2's code writes it: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.act = TanhGELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.act(self.c_fc(x)))


class Model(nn.Module):
    def __init__(self, n_embd: int = N_EMBD, n_layers: int = N_LAYERS):
        super().__init__()
        self.ln = nn.LayerNorm(n_embd)
        self.mlps = nn.ModuleList(MLP(n_embd) for _ in range(n_layers))

    def forward(self, x):
        for mlp in self.mlps:
            x = x + mlp(self.ln(x))
        return x


def get_inputs():
    return [torch.randn(BATCH, SEQ_LEN, N_EMBD)]


def get_init_inputs():
    return [N_EMBD, N_LAYERS]
