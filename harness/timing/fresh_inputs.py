"""Fresh input values for every timed call: no timed rep sees values any call has seen before.

A kernel may remember what it was given: sample a few input elements, recognise a set it has seen
and copy the answer it gave then. That pays only when values repeat, so none do. Rep r of a timed
case gets the case's own inputs (harness/kernel_types/registry.py, from its seed) plus noise drawn from a
generator seeded by (the case's seed, r), on the judged device (on a GPU the values are made there,
so fresh values cost a few device kernels per rep, not a host-side generation and a copy):

    value_r = base + std(base) * N(0, 1)      (floating tensors; integer tensors are left as they are)

The worker writes value_r into the same buffers in place before rep r, outside the timed region
(warm-ups are reps -1, -2, ...), so a kernel that caches by buffer address is no better off. The
judging process rebuilds value_r from (case, r) on the same device with the same code, and so has
the true answer of every timed call without taking the worker's word for any input.

The seed of the noise holds a salt too, secret until the timing is over: a kernel that knew (case, r)
could rebuild every rep's values at import, outside every timed and recorded call, and look its
answers up. The worker draws a secret before the candidate is imported (`NoiseSecret`, held in a
closure), derives one salt per timing stage from it, and writes each stage's salt into that stage's
final record, after its last timed call; the judging process rebuilds the values with it.
"""
from __future__ import annotations

import hashlib
import os

import torch

from harness.correctness import guards
from harness.kernel_types import registry
from harness.kernel_types.registry import Case

SEED_STRIDE = 1_000_003  # keeps (case seed, rep) pairs apart: a prime larger than any rep count


def rep_seed(case: Case, rep: int, salt: int = 0) -> int:
    return ((case.seed * SEED_STRIDE + rep + 2**20) ^ salt) % 2**62


class NoiseSecret:
    """A secret drawn from the OS; `salt(stage)` a stage's salt, derived so that one stage's
    revealed salt tells nothing of another's. The secret lives only in a closure."""

    def __init__(self):
        secret = os.urandom(32)

        def salt(stage: str) -> int:
            digest = hashlib.blake2b(stage.encode(), key=secret, digest_size=8).digest()
            return int.from_bytes(digest, "little") % 2**62
        self.salt = salt


def _fresh(t) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 0


def scales(base: list) -> list[float]:
    """The noise scale of each input: its own spread (1 for a constant or a single value)."""
    out = []
    with torch.no_grad():
        for t in base:
            scale = t.float().std().item() if _fresh(t) and t.numel() > 1 else 1.0
            out.append(scale if scale == scale and scale > 0 else 1.0)
    return out


def perturbed(base: list, scale: list[float], case: Case, rep: int, device: str | torch.device,
              salt: int = 0) -> list:
    """Rep `rep`'s values of the case's inputs `base` (already on `device`), under `salt`."""
    dev = torch.device(device)
    gen = torch.Generator(dev).manual_seed(rep_seed(case, rep, salt))
    out = []
    with torch.no_grad():
        for t, s in zip(base, scale):
            if not _fresh(t):
                out.append(t)
                continue
            noise = torch.randn(t.shape, generator=gen, device=dev, dtype=torch.float32)
            out.append((t.float() + noise * s).to(t.dtype))
    return out


def fresh_args(case: Case, rep: int, device: str | torch.device, salt: int = 0) -> tuple[list, dict]:
    """The judging process's copy of rep `rep`'s inputs (on `device`, where the worker made them)."""
    args, kwargs = registry.build_inputs(case, device)
    return perturbed(args, scales(args), case, rep, device, salt), kwargs


class FreshInputs:
    """The timed case's buffers, refilled in place with rep r's fresh values before rep r."""

    def __init__(self, case: Case, device: str, salt: int = 0):
        self.case, self.device = case, device
        args, self.kwargs = registry.build_inputs(case, device)
        # in guarded buffers, as every input the judge makes (harness/correctness/guards.py)
        self.placed = guards.place(args, case.seed, list(registry.get(case.kernel_type).params[:len(args)]))
        self.args = self.placed.args
        self._base = [a.clone() if isinstance(a, torch.Tensor) else a for a in self.args]
        self._scales = scales(self._base)

        def values(rep: int) -> list:  # the salt in a closure, not an attribute
            return perturbed(self._base, self._scales, self.case, rep, self.device, salt)
        self._values = values

    def refill(self, rep: int) -> None:
        with torch.no_grad():
            for dst, src in zip(self.args, self._values(rep)):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(src)
