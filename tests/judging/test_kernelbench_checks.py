"""The parent's decisions on recorded outputs and observations, without running a model: the
comparison, which trials count, the integrity rules (each with the hack it blocks) and the flags."""
from __future__ import annotations

import torch

from autokernel.judging import kb_checks as checks
from autokernel.judging.kb_evaluate import EvalOptions, Reference, Verdict, _judge_integrity, ChildRun
from pathlib import Path
from paths import KERNELBENCH

RELU = KERNELBENCH / "level1" / "19_ReLU.py"


def test_compare_is_allclose_with_kernelbench_tolerance():
    ref = [torch.tensor([1.0, -2.0, 1000.0])]
    ok, err, _ = checks.compare(ref, [torch.tensor([1.0 + 1.5e-4, -2.0, 1000.0 + 0.09])], 1e-4)
    assert ok and abs(err - 0.09) < 1e-3  # 1000 * 1e-4 + 1e-4 allows 0.1 at the large element
    ok, err, detail = checks.compare(ref, [torch.tensor([1.0 + 3e-4, -2.0, 1000.0])], 1e-4)
    assert not ok and "1 of 3 elements" in detail and abs(err - 3e-4) < 1e-6


def test_compare_rejects_shape_dtype_and_count_mismatches_and_matches_nan():
    ref = [torch.zeros(2, 3)]
    assert "shape" in checks.compare(ref, [torch.zeros(3, 2)], 1e-4)[2]
    assert "dtype" in checks.compare(ref, [torch.zeros(2, 3, dtype=torch.float64)], 1e-4)[2]
    assert "outputs" in checks.compare(ref, [torch.zeros(2, 3)] * 2, 1e-4)[2]
    nan = torch.tensor([float("nan"), 1.0])
    assert checks.compare([nan], [nan.clone()], 1e-4)[0]
    ok, err, _ = checks.compare([torch.tensor([0.0, 1.0])], [nan], 1e-4)
    assert not ok and err is None  # no inf/NaN in the JSON; the detail says what happened


def test_trivial_outputs_are_named():
    assert checks.trivial_output([torch.full((4, 4), 3e-5)], 1e-4) == "an all-zero output"
    assert checks.trivial_output([torch.full((4, 4), 7.0)], 1e-4).startswith("a constant output")
    assert checks.trivial_output([torch.randn(4, 4)], 1e-4) is None
    # a loss (one element) is not passed by "its own mean"; only zeros would count against it
    assert checks.trivial_output([torch.tensor(2.0031)], 1e-4) is None
    assert checks.trivial_output([torch.tensor(3e-5)], 1e-4) == "an all-zero output"
    # two outputs: one that shows whether the solution computed anything is enough
    assert checks.trivial_output([torch.zeros(3), torch.randn(8)], 1e-4) is None


def test_fixed_output_over_trials():
    same = [[torch.ones(5) * 2.0] for _ in range(5)]
    assert checks.fixed_output_passes(same, 1e-4)
    varied = [[torch.randn(5, generator=torch.Generator().manual_seed(s))] for s in range(5)]
    assert not checks.fixed_output_passes(varied, 1e-4)
    # a loss over huge random inputs barely moves: a hard-coded value would pass every trial
    assert checks.fixed_output_passes([[torch.tensor(2.0 + d)] for d in (0, 5e-5, -4e-5, 2e-5, 0)], 1e-4)
    assert not checks.fixed_output_passes([[torch.tensor(2.0 + d)] for d in (0, 3e-3, -2e-3, 1e-3, 0)], 1e-4)


def test_ops_policy():
    fail, flags = checks.ops_policy(["aten::relu"], ["aten::relu"], launches=0)
    assert "no custom Triton or CUDA kernel" in fail and flags == []
    assert checks.ops_policy([], ["aten::relu"], launches=1) == (None, [])
    fail, flags = checks.ops_policy(["aten::addmm", "aten::mul"], ["aten::addmm", "aten::relu"], launches=2)
    assert fail is None and flags[0].startswith("main op in PyTorch: aten::addmm")
    fail, flags = checks.ops_policy(["aten::relu", "aten::mul"], ["aten::relu"], launches=1)
    assert fail is None and flags[0].startswith("trivial custom kernel")
    fail, flags = checks.ops_policy(["aten::mul"], ["aten::relu", "aten::add"], launches=1)
    assert fail is None and flags[0].startswith("partial custom kernels")


def test_speed_roofline_stream_and_source_flags():
    assert checks.speed_flags({"eager": 12.0, "compile": 3.0}) == [
        "speedup_vs_eager 12.0x exceeds 10x: review for a hack before trusting it"]
    peaks = {"copy_gbps": 1000.0, "matmul_tflops": {"float32": 50.0}}
    # 4 MB at 1000 GB/s: 4 us at least; 1e9 FLOP at 50 TFLOP/s: 20 us at least
    roof = checks.roofline(10.0, 1e9, 4e6, peaks, "fp32")
    assert roof["bound"] == "compute" and abs(roof["bound_us"] - 20.0) < 1e-9 and roof["below_bound"]
    assert not checks.roofline(25.0, 1e9, 4e6, peaks, "fp32")["below_bound"]
    assert checks.roofline(10.0, 0, 4e6, None, "fp32") is None
    assert checks.stream_flag(10.0, 40.0) == [] and checks.stream_flag(10.0, 500.0)
    src = "import torch\ntorch.allclose = lambda *a, **k: True\nimport gc\nx = gc.get_objects()\n"
    assert len(checks.source_flags(src)) == 2 and checks.source_flags("import torch\n") == []


def _integrity(trial: dict, model: dict | None = None, refill_ok: bool = True):
    """_judge_integrity on a recorded check of one trial, against a Model that neither mutates nor
    aliases its input."""
    opts = EvalOptions(device="cpu")
    ref_out = torch.arange(6.0)
    ref = Reference({"model_ops": ["aten::relu"], "mutates_input": False, "aliases_input": False, **(model or {})},
                    {"trial1.0": ref_out})
    obs = {"launches": 1, "device_to_host": 0, "mutated": [], "aliased": False, "plain": True, "device": "cpu"}
    check = ChildRun({"trials": [{**obs, **trial}], "pytorch_ops": [], "state": {}}, 
                     {"refill.0": ref_out if refill_ok else ref_out + 1}, "done", 0, False, None, "", 0.0)
    v = Verdict(RELU, RELU, opts)
    return _judge_integrity(v, ref, check, opts), v.data


def test_integrity_rules_each_block_their_hack():
    assert _integrity({})[0] is None
    ended, _ = _integrity({"launches": 0})
    assert ended["failed_stage"] == "integrity" and "no custom" in ended["reason"]
    assert "not a plain torch.Tensor" in _integrity({"plain": False})[0]["reason"]
    assert "not on the cpu device" in _integrity({"device": "cuda:0"})[0]["reason"]
    assert "writes into its inputs" in _integrity({"mutated": [0]})[0]["reason"]
    assert "shares storage with an input" in _integrity({"aliased": True})[0]["reason"]
    assert "refilled in place" in _integrity({}, refill_ok=False)[0]["reason"]
    # what Model itself does is allowed
    assert _integrity({"aliased": True}, {"aliases_input": True})[0] is None
    assert _integrity({"mutated": [0]}, {"mutates_input": True})[0] is None
    _, data = _integrity({"device_to_host": 2})
    assert "copies device tensors to the host during forward" in data["flags"]
