"""KernelBench format: nn.LayerNorm over the last dim of a [batch, seq, dim] activation."""
import torch
import torch.nn as nn

BATCH_SIZE, SEQ_LEN, DIM = 8, 128, 1024


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.ln = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.randn(BATCH_SIZE, SEQ_LEN, DIM)]


def get_init_inputs():
    return [DIM]
