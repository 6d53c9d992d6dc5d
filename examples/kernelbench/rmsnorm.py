"""KernelBench format: an RMSNorm module written out by hand (pow, mean, rsqrt, weight), the way
LLaMA-style model code writes it. There is no single aten op for it: the profiler recognises it
by the ops it runs."""
import torch
import torch.nn as nn

BATCH_SIZE, SEQ_LEN, DIM = 4, 128, 1024


class Model(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        x_normed = x.float() * torch.rsqrt(variance + self.eps)
        return self.weight * x_normed.to(x.dtype)


def get_inputs():
    return [torch.randn(BATCH_SIZE, SEQ_LEN, DIM)]


def get_init_inputs():
    return [DIM]
