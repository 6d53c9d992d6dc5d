"""The timing attacks only a GPU can run (tests/attacks/gpu_timing_kernels.py), beside the honest
softmax starters, at a target their tricks aim at. Each attack ends in FAIL with a named reason;
benchmarks/gpu_check.sh runs them (its step 6). The CUDA graph and the side stream
may instead be refused before import by the static check, which then names the file's line."""
from __future__ import annotations

import pytest

import gpu_timing_kernels
from harness.judge import judge
from harness.workers.judge_session import judge_session
from harness.kernel_types.registry import Case

pytestmark = pytest.mark.gpu
TARGET = Case.make("softmax", {"M": gpu_timing_kernels.TARGET_ROWS, "N": gpu_timing_kernels.TARGET_COLS},
                   "float16", seed=11)

# name -> the (stage, phrase) pairs any one of which names why it failed
EXPECTED = {
    # replay launches nothing the monitor sees; had it launched, the recorded answer is wrong for fresh values
    "graph_replay": [("integrity", "no Triton or CUDA kernel was launched"),
                     ("integrity", "a timed call gave a wrong result"), ("compile", "graph_replay.py:")],
    # the block holds the previous rep's answer: every rep's values are fresh, so it is wrong
    "allocator_block": [("integrity", "a timed call gave a wrong result")],
    # the events see none of the side stream's work; the judge's clock, stamped after the synchronize, does
    "side_stream": [("integrity", "disagrees with the judge's own clock"), ("compile", "side_stream.py:")],
    "cuda_eager_when_timed": [("integrity", "PyTorch compute inside kernel_fn: aten::_softmax")],
    "cuda_remembers_inputs": [("integrity", "a timed call gave a wrong result")],
}


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    from starter_kernels import starter_path
    folder = tmp_path_factory.mktemp("gpu_timing")
    paths = {"honest_triton": starter_path("softmax", "triton"), "honest_cuda": starter_path("softmax", "cuda")}
    for name, text in gpu_timing_kernels.sources().items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
    with judge_session(fork=True):
        return {name: judge(path, target=TARGET, device="cuda", timeout_s=300) for name, path in paths.items()}


def _reason(v: dict) -> str:
    return next((s["detail"] for s in v["stages"] if s["name"] == v["failed_stage"]), "")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_gpu_timing_attack_fails_with_its_named_reason(judged, name):
    v = judged[name]
    assert v["verdict"] == "FAIL", (v["verdict"], v["timing"])
    assert any(v["failed_stage"] == stage and phrase in _reason(v) for stage, phrase in EXPECTED[name]), \
        (v["failed_stage"], _reason(v)[:2000])


def test_the_honest_starters_pass_beside_them_with_a_trusted_spread(judged):
    for name in ("honest_triton", "honest_cuda"):
        v = judged[name]
        assert v["verdict"] == "PASS", _reason(v)[:2000]
        assert v["timing"]["spread_ok"] is True, v["timing"]["spread_note"]
