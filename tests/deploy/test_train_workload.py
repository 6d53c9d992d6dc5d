"""verify --train's second workload, without a kernel: its ragged inputs, its padded labels and the
loss that ignores them, the norm weights it zeroes, and a model it cannot run left out with why."""
from __future__ import annotations

import textwrap

import torch
import torch.nn.functional as F

from autokernel.deploy.fine_tune import fine_tune
from autokernel.deploy.train_workload import lengths, norm_weights, second_workload, zero_norm_weights
from autokernel.profile.modelfile import load_model, spec_from_options
from paths import DATA


def test_a_token_model_gets_a_ragged_padded_batch_whose_loss_ignores_the_padding():
    loaded = load_model(spec_from_options(DATA / "train_tiny.py", device="cpu"))  # 2 x 8 tokens
    workload, about = second_workload(loaded)
    assert about["shape"] == [3, 7] and about["lengths"] == [7, 5, 3] == lengths(3, 7)
    assert about["padded_labels"] == 0 + 2 + 4
    ids = workload.inputs(0)[0]
    assert ids.shape == (3, 7) and not ids[1, 5:].any() and not ids[2, 3:].any()
    torch.manual_seed(0)
    logits = loaded.model(ids)
    # the next-token cross-entropy over the real tokens alone, counted by hand
    real = [(i, t) for i, n in enumerate(about["lengths"]) for t in range(n - 1)]
    want = torch.stack([F.cross_entropy(logits[i, t], ids[i, t + 1]) for i, t in real]).mean()
    torch.testing.assert_close(workload.loss(loaded.model, [ids]), want)
    assert workload.inputs(0)[0].equal(ids) and not workload.inputs(1)[0].equal(ids)  # seeded per step


def test_every_norm_weight_gets_exact_zeros_and_the_last_keeps_its_odd_channels():
    loaded = load_model(spec_from_options(DATA / "train_tiny.py", device="cpu"))
    assert [n for n, _ in norm_weights(loaded.model)] == ["norm", "final_norm"]
    before = {n: p.detach().clone() for n, p in loaded.model.named_parameters()}
    with torch.no_grad():
        zero_norm_weights(loaded.model)
    assert not loaded.model.norm.weight.any()
    final = loaded.model.final_norm.weight
    assert not final[::2].any() and final[1::2].equal(before["final_norm.weight"][1::2])
    assert loaded.model.mix.weight.equal(before["mix.weight"])


def test_a_step_on_it_zeroes_the_weights_and_leaves_the_model_as_it_was():
    loaded = load_model(spec_from_options(DATA / "train_tiny.py", device="cpu"))
    before = {n: p.detach().clone() for n, p in loaded.model.named_parameters()}
    workload, _ = second_workload(loaded)
    run = fine_tune(loaded, None, 1, workload=workload)
    assert run.how == workload.how and run.losses[0] > 0
    # the first norm's weight is all zero: its input gets no gradient through it, its weight does
    assert run.grads["norm.weight"].abs().sum() > 0 and run.grads["mix.weight"].abs().sum() == 0
    assert all(p.equal(before[n]) for n, p in loaded.model.named_parameters())


def test_a_model_of_one_shape_has_the_workload_left_out_saying_why(tmp_path):
    path = tmp_path / "fixed.py"
    path.write_text(textwrap.dedent("""
        import torch
        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(16, 8)
            def forward(self, x):
                assert x.shape[0] == 4, "this model takes a batch of 4"
                return self.fc(x)
        def get_inputs():
            return [torch.randn(4, 16)]
        def get_init_inputs():
            return []
    """))
    workload, about = second_workload(load_model(spec_from_options(path, device="cpu", train=True)))
    assert workload is None and about["skipped"].startswith("the model does not run at 5: ")
    assert "a batch of 4" in about["skipped"]
