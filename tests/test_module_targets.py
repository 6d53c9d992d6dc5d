"""Module targets: time no kernel type names goes to the smallest module that encloses it, and
enters the plan beside the typed targets."""
from pathlib import Path

import pytest

from autokernel import plan, profiler
from autokernel.modelfile import load_model, spec_from_options

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
PEAKS = {"device": "cpu", "copy_gbps": 10.0, "matmul_tflops": {"float32": 0.5}}


def run_profile(path, iters=2):
    return profiler.profile_model(load_model(spec_from_options(path, device="cpu")), iters=iters, warmup=1)


def modules_of(prof):
    return {g["module"]["label"]: g for g in prof.groups if g["kernel_type"] == "module"}


def test_complex_rotary_and_repeat_interleave_become_module_targets():
    prof = run_profile(DATA / "llama_complex.py")
    found = modules_of(prof)
    rotary = found["Attention.rotary"]
    assert {"aten::view_as_complex", "aten::mul"} <= set(rotary["ops"])
    assert rotary["target"] == "module[Attention.rotary:1x32x4x32:float32]"
    assert [a["tensor"]["shape"] for a in rotary["module"]["inputs"]["args"]] == [[1, 32, 4, 32], [1, 32, 2, 32], [32, 16]]
    assert "aten::repeat_interleave" in found["Model.attn"]["ops"]
    # the explicit masked attention (masked_fill before the softmax) is a typed target
    assert any(g["kernel_type"] == "flash_attention" and "aten::masked_fill" in g["ops"] for g in prof.groups)
    assert prof.coverage >= 0.95


def test_transformers_gpt2_gelu_is_a_module_target_ranked_with_the_typed_ones():
    pytest.importorskip("transformers")
    prof = run_profile(DATA / "hf_gpt2.py")
    act = modules_of(prof)["GPT2MLP.act"]
    assert act["target"] == "module[GPT2MLP.act:1x64x1024:float32]" and act["calls"] == 2
    assert {"aten::tanh", "aten::pow"} <= set(act["ops"])
    assert prof.coverage >= 0.95 and prof.typed_coverage < prof.coverage
    result = plan.make_plan(prof, PEAKS)
    row = next(e for e in result["entries"] if e["target"] == act["target"])
    # a roofline position from its recorded inputs and output, and an Amdahl projection
    assert row["bytes"] == 2 * 64 * 1024 * 4 and row["flops"] > 0 and row["bound"] == "memory"
    assert row["projected_e2e_speedup"] == pytest.approx(plan.amdahl(row["share"], row["ceiling_speedup"]))
    assert row["rank"] < len(result["entries"]) and result["typed_coverage"] == pytest.approx(prof.typed_coverage)


def test_the_whole_model_is_never_a_module_target(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import torch, torch.nn as nn\n"
                    "class Model(nn.Module):\n"
                    "    def forward(self, x):\n"
                    "        return torch.tanh(x) * 2\n"
                    "def get_inputs():\n    return [torch.randn(64, 64)]\n")
    prof = run_profile(path, iters=1)
    assert [g["kernel_type"] for g in prof.groups] == ["other"] and prof.coverage == 0.0


def _load(path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"problem_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_module_target_is_a_problem_made_from_the_module_instance(tmp_path):
    import torch
    from autokernel import module_problem
    loaded = load_model(spec_from_options(DATA / "llama_complex.py", device="cpu"))
    prof = profiler.profile_model(loaded, iters=1, warmup=0)
    attn = modules_of(prof)["Model.attn"]
    instance = loaded.model.get_submodule(attn["module"]["qualname"])
    path = module_problem.write_problem(tmp_path / "problems", "attn", instance, attn["module"]["inputs"], attn["target"])
    problem = _load(path)
    model = problem.Model()
    # the module's own parameter and buffer names, its weights copied (the causal mask too)
    assert set(model.state_dict()) == set(instance.state_dict())
    assert torch.equal(model.bias, instance.bias) and torch.equal(model.wq.weight, instance.wq.weight)
    torch.manual_seed(3)
    inputs = problem.get_inputs()
    torch.manual_seed(3)
    again = problem.get_inputs()
    assert [x.shape for x in inputs] == [torch.Size([1, 32, 128]), torch.Size([32, 16])]
    assert inputs[1].dtype == torch.complex64 and all(torch.equal(a, b) for a, b in zip(inputs, again))
    with torch.no_grad():
        assert torch.equal(model(*inputs), instance(*inputs))
    # weights changed behind the problem's back are refused, not used
    weights = path.with_suffix(".pt")
    torch.save({k: v + 1 for k, v in torch.load(weights, weights_only=True).items()}, weights)
    with pytest.raises(RuntimeError, match="not the weights"):
        problem.Model()


def test_a_module_holding_an_object_is_refused_with_the_reason():
    import torch
    from autokernel import module_problem

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = object()

    with pytest.raises(module_problem.UnsupportedModule, match="config is a object"):
        module_problem.module_tree(Holder())


def test_module_targets_are_picked_in_plan_order_and_the_tuner_does_not_spend_places_on_them():
    from autokernel.run import pick_targets
    inputs = {"args": [{"tensor": {"shape": [4, 8], "dtype": "float32", "kind": "float", "mean": 0.0, "std": 1.0}}],
              "kwargs": {}}
    module = {"kernel_type": "module", "target": "module[MLP.act:4x8:float32]", "dtype": "float32", "dims": {},
              "rank": 1, "share": 0.4, "modules": [{"name": "mlp.act", "class": "GELU"}],
              "module": {"qualname": "mlp.act", "class": "GELU", "label": "MLP.act", "inputs": inputs}}
    softmax = {"kernel_type": "softmax", "target": "softmax[4x8:float32]", "dtype": "float32",
               "dims": {"M": 4, "N": 8}, "rank": 2, "share": 0.3}
    plan_ = {"entries": [module, softmax]}
    assert [t.kernel_type for t in pick_targets(plan_, 1)] == ["module"]
    assert [t.kernel_type for t in pick_targets(plan_, 1, count_modules=False)] == ["module", "softmax"]
    assert [t.kernel_type for t in pick_targets(plan_, 3, only=["softmax"])] == ["softmax"]
    (picked,) = pick_targets(plan_, 3, only=["module[MLP"])
    assert picked.kwargs["modules"] == ["mlp.act"] and picked.kwargs["problem"].startswith("problems/")
