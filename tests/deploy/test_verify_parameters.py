"""A served winner leaves every parameter of the model bit-identical, and verify fails, naming the
parameter, when one does not (autokernel/deploy/verify_parameters.py). The winners here are real
Triton kernels in the interpreter, served in this plain process through the routing a user's
process gets."""
from __future__ import annotations

import sys

import pytest
import torch

from autokernel.deploy import routing, verify_parameters
from autokernel.deploy import verify as verifier
from autokernel.search.run import RunDir
from paths import ROOT
from tiny_llama import NORMS, TARGETS, llama, make_run, rewrite_winner

sys.path.insert(0, str(ROOT / "tests" / "attacks"))
import input_kernels  # noqa: E402  (the attack suite's kernels: one writes into its weight)

NORM_TARGET = TARGETS[0]  # rmsnorm[8x32:float32], served for the model's three RMSNorm modules


# the attack's writer reads weight.requires_grad, which the static check now refuses before import;
# verify's check of served parameters is shown here with a writer that writes on every call
WRITES_WEIGHT_BACK = input_kernels.WRITES_WEIGHT_BACK.replace("if weight.requires_grad:", "if True:", 1)
assert WRITES_WEIGHT_BACK != input_kernels.WRITES_WEIGHT_BACK

def _norm_winner(path) -> routing.Winner:
    module = routing.load_kernel(path, f"winner_{path.stem}")
    target, kernel_type, dims, kwargs, route, modules, _ = NORM_TARGET
    return routing.Winner(target, kernel_type, dims, "float32", module.kernel_fn, kwargs, route, modules)


@pytest.mark.slow
def test_an_honest_winner_served_1000_times_leaves_every_parameter_bit_identical():
    _, model, tokens = llama()
    before = {name: t.detach().clone() for name, t in model.state_dict().items()}
    fingerprint = verify_parameters.fingerprint(model)
    router = routing.Router([_norm_winner(ROOT / "starter_kernels/triton/rmsnorm.py")])
    with router.patched(model):
        with torch.no_grad():
            for _ in range(167):  # three norm calls a forward
                model(tokens)
        with torch.inference_mode():
            for _ in range(167):
                model(tokens)
    assert router.tally.to_json()["per_kernel"][NORM_TARGET[0]]["calls_served"] == 1002
    assert verify_parameters.changed(fingerprint) == []
    assert all(torch.equal(model.state_dict()[name], t) for name, t in before.items())


def test_a_winner_that_writes_into_its_weight_is_named_by_the_parameter_it_changed(tmp_path):
    path = tmp_path / "writes_weight_back.py"
    path.write_text(WRITES_WEIGHT_BACK)
    _, model, tokens = llama()
    fingerprint = verify_parameters.fingerprint(model)
    with routing.Router([_norm_winner(path)]).patched(model), torch.no_grad():
        model(tokens)  # a served model's weight is an nn.Parameter: requires_grad, under no_grad too
    changed = verify_parameters.changed(fingerprint)
    assert changed == sorted(f"{m['name']}.weight" for m in NORMS)
    assert "layers.0.input_layernorm.weight" in verify_parameters.failure(changed)


def test_verify_fails_naming_the_parameter_a_winner_wrote_into(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # verify sets it too; this puts it back afterwards
    run = make_run(tmp_path, targets=[NORM_TARGET], name="run-writes-weight")
    rewrite_winner(RunDir(run), NORM_TARGET[0], WRITES_WEIGHT_BACK)
    result = verifier.verify(run, seeds=(0,))
    assert result["status"] == "failed" and result["ok"] is False
    assert result["parameters_changed"] == sorted(f"{m['name']}.weight" for m in NORMS)
    assert any(f.startswith("the model's parameters changed while the winners served it: "
                            "layers.0.input_layernorm.weight") for f in result["failures"]), result["failures"]
