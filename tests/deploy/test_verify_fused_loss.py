"""`autokernel verify --train` on a transformers causal LM trained on its own loss (labels=ids), with
the linear_cross_entropy chain's starter as a winner: the fused loss serves every step, the
fine-tuning run matches eager's, and the step's peak memory, measured from the CPU allocator's
events, is lower than eager's, figures in verify.json and report.md."""
from __future__ import annotations

import json
import re

import pytest

from autokernel.deploy import verify as verifier
from autokernel.profile.modelfile import ModelSpec
from paths import DATA, ROOT
from sealed_runs import write_run

pytest.importorskip("transformers")
MODEL = DATA / "hf_llama_train.py"
TOKENS, HIDDEN, VOCAB = 2 * 256, 64, 1024
TARGET = f"linear_cross_entropy[{TOKENS}x{HIDDEN}x{VOCAB}:float32]"
# the judge's shapes around the target, forward and backward: 1 to 1024 rows serve (the second
# workload's 3 x 255 among them)
AROUND = {"shapes": [{"dims": {"N": n, "D": HIDDEN, "V": VOCAB}, "ok": True} for n in (1, TOKENS, 2 * TOKENS)]}
PASSED = {"verdict": "PASS", "failed_stage": None, "timing": {"median_us": 100.0}, "device": {"type": "cpu"},
          "backward": {"verdict": "PASS", "failed_stage": None, "stages": [], "around": AROUND},
          "timing_around": AROUND}


def _source() -> str:
    """The starter, with blocks the Triton interpreter runs in fewer programs (no byte counted changes)."""
    source = (ROOT / "starter_kernels" / "triton" / "linear_cross_entropy.py").read_text()
    tuned = re.sub(r"CONFIG = \{[^}]*\}", 'CONFIG = {"BLOCK_M": 64, "BLOCK_V": 256, "BLOCK_K": 64, "num_warps": 4, '
                   '"num_stages": 2, "BWD_BLOCK_M": 64, "BWD_BLOCK_V": 128, "BWD_BLOCK_D": 64, "BWD_num_warps": 4}',
                   source, count=1)
    assert tuned != source
    return tuned


def test_verify_train_serves_the_fused_loss_in_the_models_own_step_and_measures_its_memory(tmp_path):
    spec = ModelSpec(path=str(MODEL), device="cpu", dtype="float32")
    run = write_run(tmp_path, spec, [(TARGET, "linear_cross_entropy", {"N": TOKENS, "D": HIDDEN, "V": VOCAB}, {},
                                      "module", [{"name": "", "class": "Model"}], _source())],
                    verdict=lambda t: PASSED)
    result = verifier.verify(run.path, device="cpu", steps=3, train=True)
    train = result["train"]
    assert "labels=ids" in train["step"]
    assert train["match"], train["problems"]
    assert train["served_under_autograd"] == [TARGET]
    assert train["per_kernel"][TARGET]["calls_served"] == 3 and train["per_kernel"][TARGET]["fallbacks"] == 0
    second = train["second_workload"]  # 3 x 255 with padded labels: the ignored targets, served fused
    assert second["match"] and second["padded_labels"] > 0
    assert second["per_kernel"][TARGET]["calls_served"] == 1, second["per_kernel"]
    # forward-only comparisons: no labels, the logits returned, each call counted with the reason
    reasons = result["per_kernel"][TARGET]["fallback_reasons"]
    assert reasons and all(r.startswith("no labels") for r in reasons), reasons
    from autokernel.deploy.verify_report import _kernel_verdict  # the terminal's verdict column
    assert result["per_kernel"][TARGET]["training_loss_calls"] == 3
    assert "served in training" in _kernel_verdict(result["per_kernel"][TARGET])
    memory = train["memory"]
    eager, fused = memory["eager"], memory["patched"]
    assert eager["memory_events"] > 0 and fused["memory_events"] > 0
    assert eager["held_before_bytes"] == fused["held_before_bytes"]
    # eager holds the whole fp32 logits (2 x 256 x 1024 floats) at least once more: the fused step never does
    assert fused["allocator_peak_bytes"] + TOKENS * VOCAB * 4 <= eager["allocator_peak_bytes"], memory
    assert memory["patched_over_eager_peak"] == pytest.approx(fused["peak_bytes"] / eager["peak_bytes"])
    assert memory["patched_over_eager_peak"] < 1 and eager["cuda_max_memory_allocated"] is None
    assert json.loads((run.path / "verify.json").read_text())["train"]["memory"]["patched"] == fused
    from autokernel.deploy.report import write_report
    entry = {"rank": 1, "kernel_type": "linear_cross_entropy", "target": TARGET, "route": "module",
             "modules": [{"name": "", "class": "Model"}], "calls": 1, "time_ms": 0.5, "share": 0.25, "bound": "compute"}
    run.write_json(run.plan_path, {"device": "cpu", "device_name": "cpu", "total_ms": 2.0, "coverage": 0.25,
                                   "entries": [entry]})
    write_report(run.path)
    report = (run.path / "report.md").read_text()
    assert "Peak memory of one training step" in report
    assert f"{fused['peak_bytes'] / 2**20:.2f} MiB" in report and f"{memory['patched_over_eager_peak']:.3f}" in report
