"""Chains and their members at serving time: a chain's winner and its members' winners run the same
ops, so the side that saves more of the end-to-end time (by measured figures) is bound and the
other is not, in verify and in the export alike; a chain winner travels in the exported package
(its patch() binds it) and in the Hugging Face kernel repository under transformers' layer names,
and the transformers LLaMA it is bound onto gives its own outputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from autokernel.cli import app
from autokernel.deploy import export
from autokernel.deploy.winners import winner_files
from autokernel.profile.modelfile import ModelSpec
from fresh_process import HF_LLAMA_REPOSITORY
from paths import DATA
from sealed_runs import write_run
from starter_kernels import starter_path

HF_LLAMA = DATA / "hf_llama.py"
LAYERS = [f"llama.model.layers.{i}" for i in (0, 1)]
ATTENTION = [{"name": f"{layer}.self_attn", "class": "LlamaAttention"} for layer in LAYERS]
MLPS = [{"name": f"{layer}.mlp", "class": "LlamaMLP"} for layer in LAYERS]
ROTARY_QK, ROTARY = "rotary_qk[1x2x2x16x32:float32]", "rotary_embedding[1x2x16x32:float32]"
SILU_MUL, MLP = "silu_mul[16x128:float32]", "fused_mlp[16x64x128:float32]"
# the HF LLaMA's chains and their members at its profiled input (1 x 16 tokens), as the plan names them
TARGETS = {
    ROTARY: ("rotary_embedding", {"B": 1, "H": 2, "S": 16, "D": 32}, {}, "pattern", ATTENTION),
    ROTARY_QK: ("rotary_qk", {"B": 1, "HQ": 2, "HK": 2, "S": 16, "D": 32}, {}, "pattern", ATTENTION),
    MLP: ("fused_mlp", {"M": 16, "D": 64, "F": 128}, {}, "module", MLPS),
    SILU_MUL: ("silu_mul", {"M": 16, "N": 128}, {}, "module", MLPS),
}


def _run(root, names, figures=None):
    targets = [(n, *TARGETS[n][:4], TARGETS[n][4], starter_path(TARGETS[n][0]).read_text()) for n in names]
    return write_run(root, ModelSpec(path=str(HF_LLAMA), device="cpu"), targets, figures=figures)


def test_the_side_that_saves_more_is_served_and_the_other_is_left_out_with_both_figures(tmp_path):
    # (share, best us, eager us): rotary_qk saves 5% x (1 - 1/2) = 2.5% against rotary_embedding's
    # 4% x (1 - 1/1.25) = 0.8%; silu_mul 2% x (1 - 1/1.5) = 0.67% against fused_mlp's 10% x
    # (1 - 1/1.2) = 1.67%
    figures = {ROTARY_QK: (0.05, 50.0, 100.0), ROTARY: (0.04, 80.0, 100.0), SILU_MUL: (0.02, 20.0, 30.0),
               MLP: (0.10, 100.0, 120.0)}
    run = _run(tmp_path, [ROTARY, MLP, ROTARY_QK, SILU_MUL], figures)
    files = {f.target: f for f in winner_files(run)}
    served = sorted(t for t, f in files.items() if not f.not_served)
    assert served == sorted([ROTARY_QK, MLP])
    rotary = files[ROTARY_QK].decision
    assert (rotary["served"], rotary["members"]) == ("chain", [ROTARY])
    assert rotary["chain_saves"] == pytest.approx(0.025) and rotary["members_save"] == pytest.approx(0.008)
    assert "+2.500%" in rotary["why"] and "+0.800%" in rotary["why"]
    assert files[ROTARY].not_served.startswith(f"not served: the {ROTARY_QK} chain and its members run the same ops")
    mlp = files[SILU_MUL].decision
    assert mlp["served"] == "members" and mlp["members_save"] == pytest.approx(0.1 * (1 - 1 / 1.2))
    assert "+1.667%" in files[SILU_MUL].not_served
    # a chain's route and modules are its plan row's: bound where the chain ran
    assert (files[ROTARY_QK].route, files[ROTARY_QK].modules) == ("pattern", ATTENTION)
    # export binds the same side: the other is left out, saying why, and the decisions travel
    manifest = export.collect(run.path).manifest
    assert sorted(k["target"] for k in manifest["kernels"]) == served
    assert {x["target"]: x["reason"] for x in manifest["left_out"]} == {
        ROTARY: files[ROTARY].not_served, SILU_MUL: files[SILU_MUL].not_served}
    assert [c["chain"] for c in manifest["chains"]] == [ROTARY_QK, SILU_MUL]


def test_a_tie_keeps_the_members_a_lone_chain_serves_and_one_no_form_binds_does_not(tmp_path, monkeypatch):
    from autokernel.deploy import winners
    # equal savings: the members (the model's own ops) are kept
    figures = {ROTARY_QK: (0.1, 50.0, 100.0), ROTARY: (0.1, 50.0, 100.0)}
    files = {f.target: f for f in winner_files(_run(tmp_path / "tie", [ROTARY, ROTARY_QK], figures))}
    assert files[ROTARY_QK].decision["served"] == "members" and not files[ROTARY].not_served
    assert files[ROTARY_QK].not_served
    # no member with a winner: the chain serves, whatever it measured
    (alone,) = winner_files(_run(tmp_path / "alone", [ROTARY_QK]))
    assert not alone.not_served and alone.decision["why"] == "no member of the chain has a winner"
    # a chain type the router has no way to bind into a model: never bound (verify would find it served nothing)
    monkeypatch.setattr(winners, "bindable", lambda kernel_type: kernel_type != "rotary_qk")
    (unbound,) = winner_files(_run(tmp_path / "unbound", [ROTARY_QK]))
    assert unbound.not_served == "not served: no form binds rotary_qk chains in a model yet"
    assert unbound.decision["served"] == "neither"


def test_on_cpu_figures_the_chain_is_served_and_no_saving_is_negative(tmp_path):
    """The interpreter runs every kernel hundreds of times slower than PyTorch's op: such times say
    nothing of which side is faster on a GPU, so correctness decides, as it does for serving on the
    CPU, and the chain serves; a winner slower than PyTorch's op saves nothing, not a negative share."""
    figures = {ROTARY_QK: (0.05, 40_000.0, 100.0), ROTARY: (0.1, 20_000.0, 100.0)}  # 0.0025x and 0.005x
    run = _run(tmp_path, [ROTARY, ROTARY_QK], figures)
    gpu = {f.target: f for f in winner_files(run)}[ROTARY_QK].decision
    assert (gpu["chain_saves"], gpu["members_save"], gpu["served"]) == (0.0, 0.0, "members")  # a tie
    plan = json.loads(run.plan_path.read_text())
    run.write_json(run.plan_path, {**plan, "cpu_figures": True})
    files = {f.target: f for f in winner_files(run)}
    assert files[ROTARY_QK].decision["served"] == "chain" and "CPU figures" in files[ROTARY_QK].decision["why"]
    assert not files[ROTARY_QK].not_served and files[ROTARY].not_served


# Run by a fresh interpreter with only site-packages: the repository must carry all it needs. The
# package's patch() binds the chains as verify does; then kernels.kernelize binds them through the
# repository's layers under transformers' layer names.
USE_CHAINS = HF_LLAMA_REPOSITORY + r'''
tokens = torch.randint(0, hf_llama.VOCAB, (1, 16), generator=torch.Generator().manual_seed(16))
with torch.inference_mode():
    expected = model(tokens)
package = get_local_kernel(repo)
result = {"selftest": sorted(package.selftest())}
with torch.inference_mode(), package.patch(model) as router:
    result["patch_error"] = (model(tokens) - expected).abs().max().item()
result["patch"] = {t: k["calls_served"] for t, k in router.tally.to_json()["per_kernel"].items()}
mark_rotary_as_transformers_would(model)
replace_kernel_forward_from_hub(modeling_llama.LlamaMLP, "SwiGLUMLP")
manifest = json.loads((repo / "manifest.json").read_text())
with use_kernel_mapping({x["layer_name"]: {"cpu": LocalLayerRepository(repo, layer_name=x["layer"])}
                         for x in manifest["layers"]}):
    model = kernelize(model, mode=Mode.INFERENCE, device="cpu")
with torch.inference_mode():
    result["layers_error"] = (model(tokens) - expected).abs().max().item()
result["layers"] = {t: k["calls_served"] for t, k in package.layers.tally()["per_kernel"].items()}
print(json.dumps(result))
'''


def test_chain_winners_travel_in_the_package_and_the_hf_repository_and_serve_a_transformers_llama(tmp_path):
    pytest.importorskip("kernels")
    pytest.importorskip("transformers")
    run = _run(tmp_path, [ROTARY_QK, SILU_MUL])
    result = CliRunner().invoke(app, ["export", str(run.path), "--out", str(tmp_path / "out"), "--format", "hf-kernels"])
    assert result.exit_code == 0, result.output
    (repo,) = (tmp_path / "out").iterdir()
    manifest = json.loads((repo / "manifest.json").read_text())
    # the chains under transformers' layer names: apply_rotary_pos_emb's, and the MLP's (registered by hand)
    assert {x["layer_name"]: (x["layer"], x["kernel_type"], x["targets"]) for x in manifest["layers"]} == {
        "rotary_pos_emb": ("RotaryPosEmb", "rotary_qk", [ROTARY_QK]), "SwiGLUMLP": ("SwiGLUMLP", "silu_mul", [SILU_MUL])}
    assert manifest["patch_only"] == []
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TRITON_INTERPRET="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", USE_CHAINS, str(repo), str(HF_LLAMA)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    used = json.loads(proc.stdout.strip().splitlines()[-1])
    assert used["selftest"] == sorted([ROTARY_QK, SILU_MUL])
    # two layers: one q/k rotary call and one MLP call each, served by the chains' kernels both ways
    assert used["patch"] == {ROTARY_QK: 2, SILU_MUL: 2} and used["layers"] == {ROTARY_QK: 2, SILU_MUL: 2}
    assert used["patch_error"] < 1e-5 and used["layers_error"] < 1e-5, used
