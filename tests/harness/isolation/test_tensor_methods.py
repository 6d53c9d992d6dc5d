"""torch.Tensor's methods are part of what the worker's identity check holds: a candidate that
replaces one (reached through an alias the static check does not follow, with the check switched
off) runs its code inside the judge's own calls, such as the save of an output after the timed
region. The worker saves outputs with methods bound before the candidate's import."""
from __future__ import annotations

import io

import torch

from harness.isolation.tamper import IdentityGuard
from harness.workers.worker import Log


def test_a_replaced_tensor_method_is_named_by_the_identity_check():
    guard = IdentityGuard()
    original = torch.Tensor.detach
    alias = torch.Tensor
    try:
        alias.detach = lambda self, *a, **k: original(self, *a, **k)
        assert "torch.Tensor.detach" in guard.replaced()
    finally:
        alias.detach = original
    assert guard.replaced() == []


def test_the_worker_saves_an_output_without_the_tensor_methods_of_the_moment(tmp_path):
    called = []
    original = torch.Tensor.detach
    try:
        torch.Tensor.detach = lambda self, *a, **k: called.append(1) or original(self, *a, **k)
        name = Log(tmp_path).save(torch.arange(4.0))
    finally:
        torch.Tensor.detach = original
    assert called == []
    saved = torch.load(io.BytesIO((tmp_path / "tensors" / name).read_bytes()), weights_only=True)
    assert torch.equal(saved, torch.arange(4.0))
