"""Attacks on the judge's runtime layers (tests/attacks/redteam_runtime_kernels.py), judged with its
static check switched off so that they reach the layers behind it, in one batch beside an honest
kernel: each attack ends in FAIL with a named reason, the honest kernel in a PASS."""
from __future__ import annotations

import sys

import pytest

import judge_kernels
from judge_batch import judge_batch
import redteam_runtime_kernels
from harness.kernel_types.registry import Case

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox and the hook are Linux's")
TARGET = Case.make("softmax", {"M": 8, "N": 256}, "float32", seed=11)
HONEST = "honest_softmax_rows"

# name -> (the stage that fails it, a phrase its reason must hold)
EXPECTED = {
    # its callback now runs before the refill: the answer it prepares is of the previous values
    "prefetch": ("integrity", "a timed call gave a wrong result"),
    # PyTorch compute, named as dispatched: aten::softmax in a call under torch.inference_mode (no
    # autograd to decompose it first), aten::_softmax in the others
    "grid_torch": ("integrity", "softmax; only allocation, views, copies and casts are allowed"),
    "forged_records": ("integrity", "registry['softmax'].reference"),
    "thread_started": ("integrity", "the worker's threads (1 started by the candidate)"),
    "rows_past_64": ("shape_sweep", "130x33"),
    # the values it rebuilt at import are not the timed calls' (their noise is salted by a secret)
    # it keys its answers by reading input values with .item(): host compute, whatever it predicts
    "predicted_inputs": ("integrity", "host compute"),
    "unlaunchable": ("shape_sweep", "launched with num_warps=64 (2048 threads per block)"),
    "nonjit_helper": ("compile", "_softmax_kernel does not compile for sm_90: Triton rejects its source: "
                                 "RuntimeError: Unsupported function referenced"),
}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    folder = tmp_path_factory.mktemp("redteam_runtime")
    paths = {HONEST: judge_kernels.GOOD / "softmax_rows.py"}
    for name, text in redteam_runtime_kernels.sources().items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    return judge_batch(paths, TARGET, static_check=False)


def _reason(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_runtime_attack_fails_with_its_named_reason(judged, name):
    v = judged[name]
    stage, phrase = EXPECTED[name]
    assert (v["verdict"], v["failed_stage"]) == ("FAIL", stage), _reason(v)[:2000]
    assert phrase in _reason(v), _reason(v)[:2000]


def test_the_honest_kernel_passes_beside_them(judged):
    assert judged[HONEST]["verdict"] == "PASS", _reason(judged[HONEST])[:2000]
