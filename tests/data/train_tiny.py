"""A tiny token model with two RMSNorm modules, declared for training (loss_fn, get_optimizer):
the model `verify --train` fine-tunes in the tests. 2 x 8 tokens: both norms are rmsnorm[16x32]."""
import torch
import torch.nn.functional as F

VOCAB, DIM, BATCH, TOKENS = 32, 32, 2, 8


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.norm = RMSNorm(DIM)
        self.mix = torch.nn.Linear(DIM, DIM)
        self.final_norm = RMSNorm(DIM)
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + torch.tanh(self.mix(self.norm(h)))
        return self.head(self.final_norm(h))


def get_inputs():
    return [torch.randint(0, VOCAB, (BATCH, TOKENS))]


def get_init_inputs():
    return []


def loss_fn(output, inputs):
    (ids,) = inputs
    return F.cross_entropy(output[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def get_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2)  # large enough that 20 steps move every weight
