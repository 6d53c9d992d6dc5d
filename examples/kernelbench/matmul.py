"""KernelBench format: a single matrix product, C = A @ B."""
import torch
import torch.nn as nn

M, K, N = 512, 1024, 512


class Model(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
