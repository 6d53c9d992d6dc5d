"""verify's verdict: a winner that serves nothing, or has another dtype than the model's, fails it;
a bf16 model is judged against the model in float64, so a kernel that rounds once is accepted and a
wrong one is still guilty; bf16 dot products run in bf16 in the interpreter, as judged; a winner
whose verdict ran another dtype in place of its own is named, not run, and not exported; optimize
exits with verify's status. Real Triton starters in the Triton interpreter, on the tiny LLaMA."""
import dataclasses
import json
import shutil

import pytest
import torch
from typer.testing import CliRunner

from autokernel.deploy import accuracy
from autokernel.deploy import verify as verifier
from autokernel.cli import app
from autokernel.search.run import RunDir
from autokernel.search.start import OptimizeOptions
from tiny_llama import TARGETS, WRONG_RMSNORM, make_run, rewrite_winner

NORMS = [t for t in TARGETS if t[1] == "rmsnorm"]


def bf16(targets):
    return [(t.replace("float32", "bfloat16"), *rest) for t, *rest in targets]


def cli_verify(run):
    return CliRunner().invoke(app, ["verify", str(run)])


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # verify sets it too; this puts it back afterwards


OTHER = [("rmsnorm[12x32:float32]", "rmsnorm", {"M": 12, "N": 32}, {}, "module", NORMS[0][5], 0)]


def test_a_winner_that_serves_no_call_fails_verify_naming_it(tmp_path):
    # a record from before serving ranges: judged at 12 rows only; the workload's calls have 8, 7, 16 or 1
    run = make_run(tmp_path, OTHER, name="run-unserved", exact=(OTHER[0][0],))
    result = verifier.verify(run, seeds=(0,))
    kernel = result["per_kernel"]["rmsnorm[12x32:float32]"]
    assert kernel["calls_served"] == 0 and not kernel["guilty"]
    assert result["status"] == "failed" and result["ok"] is False and result["outputs_match"] is True
    assert result["failures"] == ["rmsnorm[12x32:float32]: served no call of the model "
                                  "(rows 8: not proven (judged at rows 12))"]
    cli = cli_verify(run)
    assert cli.exit_code == 1 and "rmsnorm[12x32:float32]: served no call" in str(cli.exception)


def test_a_target_in_another_dtype_than_the_models_fails_verify(tmp_path):
    run = make_run(tmp_path, NORMS, dtype="float32", model_dtype="bfloat16", name="run-dtype")
    result = verifier.verify(run, seeds=(0,))
    assert result["status"] == "failed" and result["model_dtype"] == "bfloat16"
    kernel = result["per_kernel"]["rmsnorm[8x32:float32]"]
    assert kernel["dtype_matches_model"] is False
    assert "rmsnorm[8x32:float32]: the target's dtype float32 is not the model's bfloat16" in result["failures"]
    cli = cli_verify(run)
    assert cli.exit_code == 1 and "is not the model's bfloat16" in str(cli.exception)


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory):
    """A bf16 model with a bf16 rmsnorm starter (fp32 inside, one rounding: the LLaMA's RMSNorm rounds
    the normalised value, then the product with the weight) and a bf16 matmul (tl.dot)."""
    targets = bf16(NORMS + [t for t in TARGETS if t[1] == "matmul"])
    return make_run(tmp_path_factory.mktemp("bf16"), targets, dtype="bfloat16", model_dtype="bfloat16",
                    name="run-bf16")


def test_a_bf16_kernel_that_rounds_once_is_accepted_and_a_bf16_dot_runs_in_bf16(bf16_run):
    result = verifier.verify(bf16_run, seeds=(0, 1))
    norm, matmul = result["per_kernel"]["rmsnorm[8x32:bfloat16]"], result["per_kernel"]["matmul[8x32x32:bfloat16]"]
    # 3 calls per forward: the profiled inputs twice, then 1x7, 2x8 and 1x1
    assert norm["calls_served"] == 5 * 3 and not norm["guilty"] and norm["not_run"] is None
    assert result["outputs_match"] is True and result["acceptance"]["reference_dtype"] == "float64"
    # the kernel rounds to bf16 to nearest even, as a GPU's cvt.rn and eager do: within bf16's tolerance
    # of eager (the interpreter's old truncation put it more than 2% off; a kernel that differs from
    # eager by more and is closer to float64 is accepted too: test_the_acceptance_rule_...)
    assert result["max_rel_err"] < 0.02
    assert result["patched_err_vs_reference"] <= accuracy.RMS_MARGIN * result["eager_err_vs_reference"] \
        + accuracy.RMS_FLOOR["bfloat16"]
    # the bf16 matmul serves the model in bf16, its dots as the judge ran them (tensor cores' rounding)
    assert matmul["not_run"] is None and not matmul["guilty"] and matmul["calls_served"] > 0
    assert result["not_run"] == {} and "stand_ins" not in result
    assert result["status"] == "ok" and result["ok"] is True and result["failures"] == []
    assert result["patched_targets"] == ["matmul[8x32x32:bfloat16]", "rmsnorm[8x32:bfloat16]"]
    cli = cli_verify(bf16_run)
    assert cli.exit_code == 0, cli.output


def test_a_winner_whose_own_dtype_the_judge_never_ran_serves_nowhere(bf16_run, tmp_path):
    """A verdict that ran fp16 in place of bf16 (a judge that could not run bf16 dots, a GPU without
    bf16): its PASS rests on a dtype that was not run, so verify does not serve it and export leaves
    it out, both saying why."""
    from autokernel.deploy.export import collect
    run = tmp_path / "run-bf16-stood-in"
    shutil.copytree(bf16_run, run)
    rd = RunDir(run)
    target = next(t for t in rd.load_state().targets if t.name == "matmul[8x32x32:bfloat16]")
    record = rd.experiment_file(target, target.best_experiment, ".json")
    verdict = json.loads(record.read_text())
    record.write_text(json.dumps({**verdict, "judged_dtype": "float16", "stand_in_for": "bfloat16"}))
    result = verifier.verify(run, seeds=(0,))
    why = result["not_run"]["matmul[8x32x32:bfloat16]"]
    assert "ran float16 in place of bfloat16" in why and "never judged" in why
    assert result["per_kernel"]["matmul[8x32x32:bfloat16]"]["calls_served"] == 0
    assert result["status"] == "partial" and result["ok"] is False
    left_out = {e["target"]: e["reason"] for e in collect(run).manifest["left_out"]}
    assert left_out == {"matmul[8x32x32:bfloat16]": why}


def test_a_wrong_bf16_kernel_is_still_guilty(bf16_run, tmp_path):
    run = tmp_path / "run-bf16-wrong"
    shutil.copytree(bf16_run, run)
    rewrite_winner(RunDir(run), "rmsnorm[8x32:bfloat16]", WRONG_RMSNORM)
    result = verifier.verify(run, seeds=(0,))
    assert result["guilty"] == ["rmsnorm[8x32:bfloat16]"] and result["status"] == "failed"
    assert "further from the float64 reference than eager" in result["per_kernel"]["rmsnorm[8x32:bfloat16]"]["guilty_reason"]


def test_the_acceptance_rule_compares_errors_against_the_truth():
    truth = torch.randn(256, 256, dtype=torch.float64)
    twice = (truth.float().to(torch.bfloat16) * 1.003).to(torch.bfloat16)  # two roundings, a little off
    once = truth.to(torch.bfloat16)
    assert accuracy.judge(once, twice, truth)["outputs_match"] is True
    assert accuracy.judge(twice * 1.5, twice, truth)["outputs_match"] is False
    assert accuracy.judge(truth.float(), truth.float(), truth)["outputs_match"] is True
    spike = once.clone()
    spike[7, 7] += 1.0  # one wrong element: the rms error barely moves, the max error does
    judged = accuracy.judge(spike, twice, truth)
    assert judged["patched_err_vs_reference"] <= accuracy.RMS_MARGIN * judged["eager_err_vs_reference"]
    assert judged["outputs_match"] is False


def test_optimize_exits_with_verify_failing_status(tmp_path):
    run = make_run(tmp_path / "runs", OTHER, name="run-unserved", exact=(OTHER[0][0],))
    config = json.loads((run / "config.json").read_text())
    config["options"] = dataclasses.asdict(OptimizeOptions(agent="tune", max_experiments=0))
    (run / "config.json").write_text(json.dumps(config))
    state = json.loads((run / "state.json").read_text())
    state["budget_s"] = 60.0
    (run / "state.json").write_text(json.dumps(state))
    cli = CliRunner().invoke(app, ["optimize", "--resume", run.name, "--runs-dir", str(tmp_path / "runs"), "--plain"])
    assert cli.exit_code == 1, cli.output
    assert json.loads((run / "verify.json").read_text())["status"] == "failed"


def test_a_winner_only_slower_on_this_gpu_is_not_a_failure_but_one_not_proven_is():
    """On a GPU a winner slower than PyTorch wherever it was measured serves nothing, rightly:
    verify says so and does not fail; a winner whose calls are outside what was proven still fails."""
    def result(reasons):
        kernel = {"kernel_type": "rmsnorm", "dtype": "float32", "guilty": False, "calls_served": 0,
                  "fallbacks": sum(reasons.values()), "fallback_reasons": reasons}
        return {"per_kernel": {"rmsnorm[128x384:float32]": kernel}, "per_op": {}, "outputs_match": True, "guilty": []}
    slower = result({"rows 128: slower here": 9, "1 row: not measured": 9})
    verdict = verifier._verdict(slower, "float32", {}, "float64")
    assert verdict["status"] == "ok" and verdict["failures"] == []
    assert slower["per_kernel"]["rmsnorm[128x384:float32]"]["not_served"] == "no call served: rows 128: slower here"
    unproven = result({"rows 300: not proven (judged at rows 1 to 256)": 9, "rows 128: slower here": 9})
    verdict = verifier._verdict(unproven, "float32", {}, "float64")
    assert verdict["status"] == "failed" and "served no call of the model" in verdict["failures"][0]


def test_a_winner_found_in_the_loss_is_judged_by_the_training_steps_it_serves():
    """A target of a training step's loss is never called by the model's forward: not a failure of
    the inference check; it must serve verify --train's steps when they run."""
    target = "cross_entropy[126x512:float32]"

    def result(trained_calls):
        kernel = {"kernel_type": "cross_entropy", "dtype": "float32", "guilty": False, "calls_served": 0,
                  "fallbacks": 0, "fallback_reasons": {}}
        out = {"per_kernel": {target: kernel}, "per_op": {}, "outputs_match": True, "guilty": []}
        if trained_calls is not None:
            out["train"] = {"failures": [], "per_kernel": {target: {"calls_served": trained_calls}}}
        return out
    for trained, status in ((None, "ok"), (20, "ok"), (0, "failed")):
        r = result(trained)
        verdict = verifier._verdict(r, "float32", {}, "float64", loss={target})
        assert verdict["status"] == status, (trained, verdict)
        assert r["per_kernel"][target]["not_served"].startswith("in the training step's loss")
    assert verdict["failures"] == [f"{target}: served no call of the training step's loss"]
    served = result(20)
    verifier._verdict(served, "float32", {}, "float64", loss={target})
    assert served["per_kernel"][target]["not_served"].endswith("served 20 call(s) in verify --train")
    # not in the loss: the same zero calls fail the inference check, as before
    assert verifier._verdict(result(None), "float32", {}, "float64")["status"] == "failed"
