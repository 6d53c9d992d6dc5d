"""KernelBench format: the mean cross-entropy of [tokens, vocab] logits against int64 targets."""
import torch
import torch.nn as nn
import torch.nn.functional as F

N_TOKENS, VOCAB_SIZE = 128, 8192


class Model(nn.Module):
    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets)


def get_inputs():
    return [torch.randn(N_TOKENS, VOCAB_SIZE), torch.randint(0, VOCAB_SIZE, (N_TOKENS,))]


def get_init_inputs():
    return []
