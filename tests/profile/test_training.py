"""Profiling a training step: backward time joins its forward op's target, the optimizer step is
timed apart, shares still add up to 1, and a bad training step is a clear error."""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from autokernel.errors import UserError
from autokernel.profile import attribution, profiler
from autokernel.profile.modelfile import load_model, spec_from_options
from autokernel.profile.records import OpRecord, Records
from paths import DATA, ROOT

EXAMPLE = ROOT / "examples" / "llama_tiny_train.py"


def train_profile(path, iters=2, **options):
    return profiler.profile_model(load_model(spec_from_options(path, device="cpu", **options)), iters=iters, warmup=1)


def write(tmp_path, text, name="model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def targets(groups, kernel_type):
    return [g for g in groups if g["kernel_type"] == kernel_type]


@pytest.fixture(scope="module")
def example_plan(tmp_path_factory):
    """`autokernel profile examples/llama_tiny_train.py --train`, as a user runs it (its peaks
    seeded, so it does not spend seconds probing them)."""
    from harness.device import peaks
    out = tmp_path_factory.mktemp("train")
    env = {**os.environ, "AUTOKERNEL_CACHE_DIR": str(out / "cache"), "COLUMNS": "400"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOKERNEL_CACHE_DIR", env["AUTOKERNEL_CACHE_DIR"])
        path = peaks.cache_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"device": "test cpu", "copy_gbps": 20.0, "matmul_tflops": {"float32": 0.2},
                                "measured_at": "2026-01-01T00:00:00+00:00", "method": "seeded by a test"}))
    done = subprocess.run([sys.executable, "-m", "autokernel", "profile", str(EXAMPLE), "--train", "--device", "cpu",
                           "--iters", "2", "--warmup", "1", "--json", str(out / "plan.json"),
                           "--records", str(out / "records.json")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads((out / "plan.json").read_text()), done.stdout + done.stderr, out / "records.json"


def test_llama_train_example_charges_backward_to_its_forward_targets(example_plan):
    plan, _, _ = example_plan
    entries = plan["entries"]
    assert sum(e["share"] for e in entries) == pytest.approx(1.0, abs=1e-9)
    for e in entries:
        assert e["time_ms"] == pytest.approx(e["fwd_ms"] + e["bwd_ms"])
    for kernel_type in ("rmsnorm", "matmul", "fused_mlp", "flash_attention", "rotary_embedding", "cross_entropy"):
        rows = targets(entries, kernel_type)
        assert rows and all(r["fwd_ms"] > 0 and r["bwd_ms"] > 0 for r in rows), kernel_type
    (rms,) = targets(entries, "rmsnorm")
    assert rms["target"] == "rmsnorm[128x128:float32]" and rms["calls"] == 5  # 2 per layer x 2 + the final norm
    (ce,) = targets(entries, "cross_entropy")  # the file's loss_fn, outside the model: a target of its own
    assert ce["target"] == "cross_entropy[126x512:float32]" and ce["modules"] == [{"name": "", "class": "loss"}]
    # the backward the profile could not tie to a forward op is its own row, not dropped
    (unlinked,) = [e for e in entries if e["op"] == attribution.UNLINKED]
    assert unlinked["kernel_type"] == "other" and unlinked["fwd_ms"] == 0 and "AccumulateGrad" in unlinked["ops"]
    train = plan["train"]
    assert train["backward_ms"] == pytest.approx(sum(e["bwd_ms"] for e in entries))
    assert train["forward_ms"] + train["backward_ms"] == pytest.approx(plan["total_ms"])


def test_llama_train_example_shows_the_optimizer_step_apart(example_plan):
    plan, printed, _ = example_plan
    train = plan["train"]
    assert train["optimizer"] == "AdamW" and train["optimizer_ms"] > 0  # the file's get_optimizer
    assert train["step"] == "loss_fn(output, inputs) from the model file"
    assert train["step_ms"] == pytest.approx(plan["total_ms"] + train["optimizer_ms"])
    assert not any("optim" in " ".join(e["ops"]).lower() or "foreach" in " ".join(e["ops"]) for e in plan["entries"])
    text = " ".join(printed.split())
    assert "per training step (forward + backward; the optimizer step apart)" in text
    assert "optimizer step (AdamW):" in text and "outside the shares" in text
    assert "fwd ms" in text and "bwd ms" in text and "other (backward): AccumulateGrad" in text
    assert "profiled training steps" in text


def test_training_records_attribute_again_the_same(example_plan):
    plan, _, records_path = example_plan
    records = Records.load(records_path)
    groups = attribution.attribute(records, {}, None)
    assert attribution.is_training(records) and attribution.optimizer_ms(records) == pytest.approx(plan["train"]["optimizer_ms"])
    by_target = {g["target"]: g for g in groups if g["kernel_type"] not in ("other", "module")}
    (rms,) = targets(plan["entries"], "rmsnorm")
    assert rms["bwd_ms"] > 0 and by_target[rms["target"]]["bwd_ms"] == pytest.approx(rms["bwd_ms"])
    assert plan["train"]["optimizer_ms"] > 0


def test_backward_whose_forward_op_is_missing_is_shown_not_dropped(example_plan):
    """Records with the rmsnorm's forward ops' sequence numbers gone: its backward time moves to
    `other (backward)`, named for what it was, and the shares still add up to 1."""
    plan, _, records_path = example_plan
    records = Records.load(records_path)
    (rms,) = targets(plan["entries"], "rmsnorm")
    forward = [op for op in records.ops if op.seq >= 0 and op.fwd_thread == 0]
    gone = {op.seq for op in forward if op.name in ("aten::pow", "aten::rsqrt")}
    for op in forward:
        if op.seq in gone:
            op.seq = -1
    groups = attribution.attribute(records, {}, None)
    (unlinked,) = [g for g in groups if g["op"] == attribution.UNLINKED]
    assert {"PowBackward0 (its forward op was not found)", "RsqrtBackward0 (its forward op was not found)"} <= set(unlinked["ops"])
    (moved,) = targets(groups, "rmsnorm")
    assert moved["bwd_ms"] < rms["bwd_ms"]
    assert sum(g["share"] for g in groups) == pytest.approx(1.0, abs=1e-9)


def test_a_backward_on_another_thread_joins_its_forward_op():
    """On a GPU the autograd engine runs the backward on a device thread of its own, outside the
    range that called backward(): the nodes that start inside that range still count."""
    def op(name, thread, start, end, seq=-1, fwd_thread=0, shapes=(), dtypes=()):
        return OpRecord(0, name, thread, start, end, list(shapes), list(dtypes), [], seq, fwd_thread)
    ops = [op(attribution.TRAIN_ROOT, 1, 0, 100_000), op("module::<root>::Net", 1, 1_000, 99_000),
           op("aten::mm", 1, 2_000, 50_000, seq=5, shapes=[[4, 8], [8, 16]], dtypes=["float", "float"]),
           op(attribution.BACKWARD, 1, 200_000, 300_000),
           op(attribution.BACKWARD_NODE + "MmBackward0", 2, 210_000, 260_000, seq=5, fwd_thread=1),
           op("aten::mm", 2, 215_000, 255_000, shapes=[[4, 16], [16, 8]], dtypes=["float", "float"]),
           op(attribution.BACKWARD_NODE + "MmBackward0", 2, 400_000, 410_000, seq=5, fwd_thread=1)]  # after it
    (matmul,) = attribution.attribute(Records("cpu", ops), {}, None)
    assert matmul["target"] == "matmul[4x8x16:float32]"
    assert matmul["fwd_ms"] == pytest.approx(0.048) and matmul["bwd_ms"] == pytest.approx(0.050)
    assert matmul["share"] == 1.0


def test_hf_llama_from_a_config_trains_with_the_default_loss():
    prof = train_profile(DATA / "hf_llama.py", train=True)
    assert prof.train["step"].startswith("default: cross-entropy of the logits against the inputs shifted by one")
    assert prof.train["optimizer"] == "AdamW" and prof.train["optimizer_ms"] > 0
    assert sum(g["share"] for g in prof.groups) == pytest.approx(1.0, abs=1e-9)
    for kernel_type in ("rmsnorm", "matmul"):
        rows = targets(prof.groups, kernel_type)
        assert rows and all(r["bwd_ms"] > 0 for r in rows), kernel_type
    (ce,) = targets(prof.groups, "cross_entropy")
    assert ce["target"] == "cross_entropy[15x256:float32]" and ce["bwd_ms"] > 0


def test_profiling_a_step_leaves_the_model_as_it_was():
    loaded = load_model(spec_from_options(EXAMPLE, device="cpu", train=True))
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    profiler.profile_model(loaded, iters=1, warmup=1)
    after = loaded.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not loaded.model.training and all(p.grad is None for p in loaded.model.parameters())


MLP = """
    import torch
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 8)
        def forward(self, x):
            return self.fc(x)
    def get_inputs():
        return [torch.randn(4, 16)]
    def get_init_inputs():
        return []
"""


def test_a_float_model_trains_on_the_mean_square_of_its_output_and_forward_only_stays(tmp_path):
    path = write(tmp_path, MLP)
    prof = train_profile(path, train=True)
    assert prof.train["step"] == "default: the mean square of the output"
    (matmul,) = targets(prof.groups, "matmul")
    assert matmul["bwd_ms"] > 0
    plain = train_profile(path)  # no declaration, no --train: the forward alone, as before
    assert plain.train is None and all("bwd_ms" not in g for g in plain.groups)


def test_a_declared_step_trains_without_the_option_and_no_train_turns_it_off(tmp_path):
    path = write(tmp_path, MLP + """
    def train_step(model, inputs):
        return model(*inputs).abs().sum()
    """)
    loaded = load_model(spec_from_options(path, device="cpu"))
    assert loaded.training
    prof = profiler.profile_model(loaded, iters=1, warmup=0)
    assert prof.train["step"] == "train_step(model, inputs) from the model file" and prof.warmup == 1
    assert not load_model(spec_from_options(path, device="cpu", train=False)).training


@pytest.mark.parametrize("loss, words", [
    ("model(*inputs)", "returned a tensor of shape [4, 8], not a scalar loss"),
    ("3.0", "returned float, not a scalar loss tensor"),
    ("model(*inputs).sum().detach()", "does not depend on any parameter that needs a gradient"),
])
def test_a_step_without_a_scalar_loss_is_an_error_that_says_so(tmp_path, loss, words):
    path = write(tmp_path, MLP + f"""
    def train_step(model, inputs):
        return {loss}
    """)
    with pytest.raises(UserError) as e:
        train_profile(path, iters=1)
    assert words in e.value.message and "train_step(model, inputs)" in e.value.message
    assert "one element" in e.value.hint


def test_a_model_with_nothing_to_train_is_an_error(tmp_path):
    path = write(tmp_path, MLP.replace("self.fc = torch.nn.Linear(16, 8)",
                                       "self.fc = torch.nn.Linear(16, 8).requires_grad_(False)"))
    with pytest.raises(UserError) as e:
        train_profile(path, iters=1, train=True)
    assert "no parameter with requires_grad=True" in e.value.message and "without --train" in e.value.hint


def test_optimize_train_reaches_the_run_s_plan(tmp_path):
    """`optimize --train` is a model option: it rides in the run's spec to the profile, so plan.json
    holds the training step's targets and config.json can load the model the same way again."""
    from typer.testing import CliRunner

    from autokernel.cli import app
    from autokernel.profile.modelfile import ModelOptions
    from autokernel.search import start as run_start
    assert "--train" in " ".join(CliRunner().invoke(app, ["optimize", "--help"], env={"COLUMNS": "200"}).output.split())
    spec = ModelOptions(device="cpu", train=True).spec(write(tmp_path, MLP))
    run, _, _ = run_start.start(spec, run_start.OptimizeOptions(agent="tune", top=1), tmp_path / "runs")
    plan = json.loads(run.plan_path.read_text())
    assert plan["train"]["step"] == "default: the mean square of the output" and plan["model"]["train"] is True
    (matmul,) = targets(plan["entries"], "matmul")
    assert matmul["bwd_ms"] > 0 and matmul["time_ms"] == pytest.approx(matmul["fwd_ms"] + matmul["bwd_ms"])
    assert json.loads(run.config_path.read_text())["model"]["train"] is True


def test_the_default_next_token_loss_scores_each_position_against_the_token_after_it():
    """Logits that put all their mass on the token after each position cost nothing; the same
    logits scored against the token before (a shift the wrong way, the same shape) cost a lot."""
    from autokernel.profile.training import next_token_loss
    ids = torch.tensor([[3, 1, 4, 1, 5], [2, 6, 0, 6, 2]])
    following = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # the last position predicts nothing scored
    logits = torch.nn.functional.one_hot(following, 7).float() * 50.0
    assert next_token_loss(logits, ids).item() < 1e-6
    shifted_back = torch.cat([ids[:, -1:], ids[:, :-1]], dim=1)
    assert next_token_loss(torch.nn.functional.one_hot(shifted_back, 7).float() * 50.0, ids).item() > 10.0


def test_a_model_file_s_get_optimizer_is_the_one_that_steps(tmp_path):
    """The optimizer is the file's own, not a default AdamW: its class and its settings step the model."""
    from autokernel.profile.training import training
    path = write(tmp_path, MLP + """
    def loss_fn(output, inputs):
        return output.pow(2).mean()
    def get_optimizer(model):
        return torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.0)
    """)
    loaded = load_model(spec_from_options(path, device="cpu"))
    inputs = loaded.make_inputs(0)
    with training(loaded, inputs) as step:
        assert step.optimizer_name == "SGD" and step.optimizer.param_groups[0]["lr"] == 0.5
        before = loaded.model.fc.weight.detach().clone()
        loss = step.loss(inputs)
        loss.backward()
        expected = before - 0.5 * loaded.model.fc.weight.grad
        step.optimizer.step()
        assert torch.allclose(loaded.model.fc.weight.detach(), expected)  # plain SGD's update, lr 0.5
    # the same file with AdamW of its own settings: its lr, not the default's
    path = write(tmp_path, MLP + """
    def loss_fn(output, inputs):
        return output.pow(2).mean()
    def get_optimizer(model):
        return torch.optim.AdamW(model.parameters(), lr=0.0123)
    """, name="adamw.py")
    loaded = load_model(spec_from_options(path, device="cpu"))
    with training(loaded, loaded.make_inputs(0)) as step:
        assert step.optimizer_name == "AdamW" and step.optimizer.param_groups[0]["lr"] == 0.0123
