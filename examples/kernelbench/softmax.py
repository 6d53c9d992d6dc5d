"""KernelBench format: softmax over the last dim of a [batch, dim] activation."""
import torch
import torch.nn as nn

BATCH_SIZE, DIM = 64, 4096


class Model(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(BATCH_SIZE, DIM)]


def get_init_inputs():
    return []
