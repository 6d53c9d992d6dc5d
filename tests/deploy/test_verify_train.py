"""`autokernel verify --train`: a tiny model fine-tuned 20 AdamW steps with and without a Triton
rmsnorm winner that has a backward, on the CPU (Triton interpreter), matching eager's losses, first
gradients and parameters, then one step of the second workload (a ragged batch, padded labels,
zeroed norm weights); a winner whose backward is wrong fails it, named, in whichever workload shows
it; a bf16 model trains in bf16 with bf16's tolerances; bad training input gets a clear error; the
report shows it."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from autokernel.cli import app
from autokernel.deploy import verify as verifier
from autokernel.deploy.verify_train import TOLERANCES
from autokernel.errors import UserError
from autokernel.profile.modelfile import ModelSpec
from sealed_runs import write_run
from paths import DATA

KERNEL = DATA / "kernels" / "train" / "rmsnorm_grad.py"
MODEL = DATA / "train_tiny.py"
TARGET = ("rmsnorm[16x32:float32]", "rmsnorm", {"M": 16, "N": 32}, {}, "module",
          [{"name": "norm", "class": "RMSNorm"}, {"name": "final_norm", "class": "RMSNorm"}])
# a kept kernel's verdict: its target and the shapes around it checked, forward and backward (1 to
# 32 rows serve, inference and training)
AROUND = {"shapes": [{"dims": {"M": m, "N": 32}, "ok": True} for m in (9, 32, 1)]}
PASSED = {"verdict": "PASS", "failed_stage": None, "timing": {"median_us": 100.0}, "device": {"type": "cpu"},
          "backward": {"verdict": "PASS", "failed_stage": None, "stages": [], "around": AROUND},
          "timing_around": AROUND}


def make_run(root, source: str, model=MODEL, name: str = "run", backward: dict = PASSED, dtype: str = "float32"):
    target = (TARGET[0].replace("float32", dtype), *TARGET[1:])
    return write_run(root, ModelSpec(path=str(model), device="cpu", dtype=dtype), [(*target, source)], name=name,
                     dtype=dtype, verdict=lambda t: backward)


PARAMETERS = {"embed.weight", "norm.weight", "mix.weight", "mix.bias", "final_norm.weight", "head.weight"}


def wrong_backward(source: str) -> str:
    """The test kernel with its weight gradient doubled in its own reduction kernel: right shape,
    wrong value (doubled with PyTorch instead, the served call would be refused as PyTorch compute)."""
    wrong = source.replace("tl.store(dw_ptr + cols, acc.to(", "tl.store(dw_ptr + cols, (acc * 2.0).to(")
    assert wrong != source
    return wrong


def test_twenty_steps_with_the_winner_match_eager_and_report_throughput(tmp_path):
    run = make_run(tmp_path, KERNEL.read_text())
    result = verifier.verify(run.path, device="cpu")
    train = result["train"]
    assert result["status"] == "ok", result["failures"]
    assert train["steps"] == 20 and len(train["losses"]["eager"]) == 20 and train["match"]
    assert train["served_under_autograd"] == [TARGET[0]]
    assert train["per_kernel"][TARGET[0]]["calls_served"] == 40  # two norms per step, each step
    assert train["worst_loss_rel_err"] <= TOLERANCES["float32"]["loss"]
    assert train["losses"]["eager"][-1] < train["losses"]["eager"][0]  # it did train
    # every parameter's gradient against its own dtype's tolerance
    assert {n: (r["dtype"], r["grad_tolerance"]) for n, r in train["per_parameter"].items()} == {
        n: ("float32", TOLERANCES["float32"]["grad"]) for n in PARAMETERS}
    assert all(r["grad_rel_err"] <= r["grad_tolerance"] for r in train["per_parameter"].values())
    second = train["second_workload"]  # one sequence more, each one shorter: 21 rows, served
    assert second["match"] and second["name"] == "3x7 ragged" and second["lengths"] == [7, 5, 3]
    assert second["padded_labels"] == 6 and "-100" in second["step"]
    assert second["zeroed_norm_weights"] == ["norm.weight (all)", "final_norm.weight (even channels)"]
    assert second["per_kernel"][TARGET[0]]["calls_served"] == 2 and set(second["per_parameter"]) == PARAMETERS
    figures = train["throughput"]
    assert figures["unit"] == "tokens/s" and figures["per_step"] == 16 and not figures["representative_of_gpu"]
    assert figures["runs"]["patched"]["per_s"] > 0 and figures["runs"]["eager"]["per_s"] > 0
    assert "Triton interpreter" in figures["note"]
    assert figures["runs"]["liger"] == {"skipped": "Liger Kernel is not installed (pip install liger-kernel)"}
    assert "GPU" in figures["runs"]["compile"]["skipped"]
    assert json.loads((run.path / "verify.json").read_text())["train"]["match"]
    report = _report(run)
    assert "## Training" in report and "training with the winners matches eager" in report
    assert "Second workload, one step at 3x7 ragged (6 padded labels, zeroed: norm.weight (all)" in report
    assert report.count("\n| 20 | ") == 1  # the loss at every step, the last one too
    assert "| eager | " in report and "| with the winners | " in report and "Liger Kernel is not installed" in report
    assert "| fwd ms | bwd ms | ms |" in report and "the optimizer step (AdamW) 0.300 ms more" in report


def _report(run) -> str:
    """report.md of the run, with a training plan (fwd/bwd ms per target, the optimizer apart)."""
    from autokernel.deploy.report import write_report
    entry = {"rank": 1, "kernel_type": "rmsnorm", "target": TARGET[0], "route": "module", "modules": TARGET[5],
             "calls": 4, "time_ms": 0.5, "fwd_ms": 0.2, "bwd_ms": 0.3, "share": 0.25, "bound": "memory"}
    train = {"step": "loss_fn(output, inputs) from the model file", "optimizer": "AdamW", "forward_ms": 0.8,
             "backward_ms": 1.2, "optimizer_ms": 0.3, "step_ms": 2.3}
    run.write_json(run.plan_path, {"device": "cpu", "device_name": "cpu", "total_ms": 2.0, "coverage": 0.25,
                                   "entries": [entry], "train": train})
    write_report(run.path)
    return (run.path / "report.md").read_text()


def test_the_command_runs_the_comparison_in_the_sandboxed_child(tmp_path):
    run = make_run(tmp_path, KERNEL.read_text())
    result = CliRunner().invoke(app, ["verify", str(run.path), "--train", "--steps", "2"])
    assert result.exit_code == 0, result.output
    assert "verify --train (CPU figures: Triton interpreter)" in result.output
    train = json.loads((run.path / "verify.json").read_text())["train"]
    assert train["steps"] == 2 and train["match"] and train["served_under_autograd"] == [TARGET[0]]


def test_a_wrong_backward_fails_verify_train_naming_the_winner(tmp_path):
    run = make_run(tmp_path, wrong_backward(KERNEL.read_text()))
    result = verifier.verify(run.path, device="cpu", steps=3)
    assert result["status"] == "failed"
    assert list(result["train"]["guilty"]) == [TARGET[0]]
    assert any(f.startswith(f"training: {TARGET[0]}: its backward") and "gradient of" in f for f in result["failures"])
    assert not result["guilty"]  # its forward is right: it still serves inference


def divides_by_the_weight(source: str) -> str:
    """The test kernel with the normalised input rebuilt as out / weight in its weight gradient: the
    same value wherever the weight is not zero, NaN where it is (the judge's weights never are)."""
    wrong = source.replace("dw += g * x * rstd", "dw += g * ((x * rstd * w) / w)")
    assert wrong != source
    return wrong


def test_a_backward_wrong_only_at_zero_norm_weights_fails_the_second_workload(tmp_path):
    run = make_run(tmp_path, divides_by_the_weight(KERNEL.read_text()))
    result = verifier.verify(run.path, device="cpu", steps=2)
    train = result["train"]
    assert train["match"]  # the weights as found have no zero: the fine-tuning run cannot tell
    assert not train["second_workload"]["match"]
    assert "norm.weight" in " ".join(train["second_workload"]["problems"])
    assert result["status"] == "failed" and list(train["guilty"]) == [TARGET[0]]
    assert "(3x7 ragged): alone, the gradient of" in train["guilty"][TARGET[0]]
    assert "NaN or infinite" in train["guilty"][TARGET[0]]


def test_a_bf16_model_trains_in_bf16_with_bf16_tolerances(tmp_path):
    run = make_run(tmp_path, KERNEL.read_text(), dtype="bfloat16")
    result = verifier.verify(run.path, device="cpu", steps=2)
    train, target = result["train"], TARGET[0].replace("float32", "bfloat16")
    assert result["status"] == "ok", result["failures"]
    assert train["dtype"] == "bfloat16" and train["tolerances"] == TOLERANCES["bfloat16"]
    assert {r["dtype"] for r in train["per_parameter"].values()} == {"bfloat16"}  # the model's own dtype
    assert train["served_under_autograd"] == [target]  # a bf16 winner serves only bf16 calls
    assert train["per_kernel"][target]["calls_served"] == 4
    assert train["second_workload"]["per_kernel"][target]["calls_served"] == 2
    # bf16 rounds where fp32 would not: larger than fp32's errors, inside bf16's tolerances
    worst = train["worst_grad_rel_err"]
    assert TOLERANCES["float32"]["grad"] < worst["rel_err"] <= worst["tolerance"] == TOLERANCES["bfloat16"]["grad"]


def test_each_parameter_is_held_to_its_own_dtype_or_the_model_s_where_that_is_wider():
    """An fp32 norm weight in a bf16 model gets its gradient from bf16 activations: bf16's tolerance;
    a bf16 parameter in an fp32 model, bf16's too; and what eager itself made NaN is not compared."""
    import torch
    from autokernel.deploy.fine_tune import Trajectory
    from autokernel.deploy.verify_train import compare
    ones = torch.ones(8, dtype=torch.float64)
    eager = Trajectory(losses=[1.0, float("nan")], grads={"w": ones, "norm": ones, "lost": ones * float("nan")},
                       dtypes={"w": "bfloat16", "norm": "float32", "lost": "float32"})
    off = 1 + 5e-3  # beyond fp32's 1e-4, inside bf16's 1e-1
    patched = Trajectory(losses=[1.0, 1.0], grads={"w": ones * off, "norm": ones * off, "lost": ones},
                         dtypes=eager.dtypes)
    mixed = compare(eager, patched, "bfloat16", ("loss", "grad"))
    assert mixed["match"], mixed["problems"]
    assert {n: r["grad_tolerance"] for n, r in mixed["per_parameter"].items() if "grad_tolerance" in r} == {
        "w": TOLERANCES["bfloat16"]["grad"], "norm": TOLERANCES["bfloat16"]["grad"]}
    assert mixed["not_compared"] == ["the loss from step 2 (eager's own is not finite)",
                                     "the gradient of lost after the first backward (eager's own is not finite)"]
    plain = compare(eager, patched, "float32", ("loss", "grad"))
    assert plain["per_parameter"]["w"]["grad_tolerance"] == TOLERANCES["bfloat16"]["grad"]  # its own dtype's
    assert not plain["match"] and "the gradient of norm" in plain["problems"][0] and "float32" in plain["problems"][0]


def test_the_guilty_search_runs_each_winner_alone_on_the_workload_that_differed(monkeypatch):
    """Two winners served under autograd, one wrong: each is run alone, so only the wrong one is
    named (run together, both would differ); a winner that served nothing is not run."""
    import torch
    from types import SimpleNamespace
    from autokernel.deploy import verify_train
    from autokernel.deploy.fine_tune import Trajectory
    eager = Trajectory(losses=[1.0], grads={"w": torch.ones(4, dtype=torch.float64)}, dtypes={"w": "float32"})
    runs = []

    def fine_tune(loaded, winners, steps, compiled=False, catch=False, workload=None):
        runs.append(([w.target for w in winners], steps, workload))
        wrong = any(w.target == "wrong" for w in winners)
        return Trajectory(losses=[1.0], grads={"w": torch.full((4,), 2.0 if wrong else 1.0, dtype=torch.float64)},
                          dtypes={"w": "float32"})
    monkeypatch.setattr(verify_train, "fine_tune", fine_tune)
    winners = [SimpleNamespace(target=t, backward_fn=print) for t in ("right", "wrong", "unused")]
    second = object()
    checks = [verify_train.Check("3x7 ragged", 1, eager, second, ("loss", "grad"))]
    guilty = verify_train.find_guilty(None, winners, ["right", "wrong"], checks, "float32", lambda m: None)
    assert list(guilty) == ["wrong"] and "(3x7 ragged)" in guilty["wrong"]
    assert runs == [(["right"], 1, second), (["wrong"], 1, second)]


@pytest.mark.parametrize("backward, why", [
    ({"verdict": "FAIL", "failed_stage": "gradients"}, "inference only: the backward failed gradients"),
    # a verdict of the forward alone (an inference target's, or from before backward gating): the
    # file's backward_fn was never judged, so it serves no call that needs gradients
    (None, "inference only: the backward was not judged"),
])
def test_a_forward_only_winner_falls_back_in_training_with_its_reason(tmp_path, backward, why):
    verdict = {**PASSED, "backward": backward} if backward else {k: v for k, v in PASSED.items() if k != "backward"}
    run = make_run(tmp_path, KERNEL.read_text(), backward=verdict)
    result = verifier.verify(run.path, device="cpu", steps=2)
    kernel = result["train"]["per_kernel"][TARGET[0]]
    assert kernel["calls_served"] == 0 and kernel["fallback_reasons"] == {
        f"autograd: {why} (run under torch.no_grad)": 4}
    assert result["train"]["match"] and result["train"]["served_under_autograd"] == []
    assert result["per_kernel"][TARGET[0]]["inference_only"] == why
    assert result["per_kernel"][TARGET[0]]["backward"] is False


@pytest.mark.parametrize("body, words", [
    ("def loss_fn(output, inputs):\n    return output.pow(2)\n", "not a scalar loss"),
    ("def loss_fn(output, inputs):\n    return output.pow(2).mean()\n\n\n"
     "_init = Model.__init__\n\n\ndef _frozen(self):\n    _init(self)\n    self.requires_grad_(False)\n\n\n"
     "Model.__init__ = _frozen\n", "nothing to train"),
])
def test_bad_training_input_gets_a_clear_error(tmp_path, body, words):
    model = tmp_path / "model.py"
    model.write_text(MODEL.read_text().split("def loss_fn")[0] + body)
    run = make_run(tmp_path, KERNEL.read_text(), model=model)
    with pytest.raises(UserError, match=words):
        verifier.verify(run.path, device="cpu", train=True, steps=2)


def test_exports_declare_the_backward_truthfully(tmp_path):
    """The manifest says which kernels' backward serves; the Hugging Face layers' has_backward is
    True only for a layer that carries one; a backward verify --train found wrong ships as not served."""
    import sys
    from autokernel.deploy.export import export
    from autokernel.deploy.hf_kernels import export_repository, local_variant
    run = make_run(tmp_path, KERNEL.read_text())
    (entry,) = export(run.path, tmp_path / "pkg")["kernels"]
    assert entry["backward"] is True and entry["inference_only"] == ""
    manifest = export_repository(run.path, tmp_path / "hf")
    folder = tmp_path / "hf" / manifest["name"] / "build" / local_variant()
    sys.path.insert(0, str(folder))
    try:
        layers = __import__(f"{manifest['name'].replace('-', '_')}.layers", fromlist=["RMSNorm"])
        assert layers.RMSNorm.has_backward is True and layers.SwiGLUMLP.has_backward is False
    finally:
        sys.path.remove(str(folder))
        for name in [m for m in sys.modules if m.startswith(manifest["name"].replace("-", "_"))]:
            del sys.modules[name]
    assert "Layers with a judged backward" in (tmp_path / "hf" / manifest["name"] / "README.md").read_text()
    run.write_json(run.path / "verify.json", {"train": {"guilty": {TARGET[0]: "its backward trains ..."}}})
    (entry,) = export(run.path, tmp_path / "pkg")["kernels"]
    assert entry["backward"] is False and entry["inference_only"].startswith("inference only: verify --train")
