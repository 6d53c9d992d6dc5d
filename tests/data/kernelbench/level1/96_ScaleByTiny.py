import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Scales the input by a tiny constant. Every output is far below fp32's KernelBench tolerance
    (atol 1e-4), so an all-zero output passes allclose: no trial of this problem can show that a
    solution is correct.
    """
    def __init__(self, scale: float):
        super(Model, self).__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


batch_size = 8
dim = 128


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [1e-6]
