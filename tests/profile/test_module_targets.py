"""Module targets: time no kernel type names goes to the smallest module that encloses it, and
enters the plan beside the typed targets."""
from pathlib import Path

import pytest

from autokernel.profile import plan, profiler
from autokernel.profile.modelfile import load_model, spec_from_options
from paths import DATA, ROOT

DATA = DATA
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
    from autokernel.search import module_problem
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
    from autokernel.search import module_problem

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = object()

    with pytest.raises(module_problem.UnsupportedModule, match="config is a object"):
        module_problem.module_tree(Holder())


def test_module_targets_are_picked_in_plan_order_and_the_tuner_does_not_spend_places_on_them():
    from autokernel.search.start import pick_targets
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


# ---------------------------------------------------------------- what a module target is charged
# The transformers Mixtral of tests/data: each of 128 tokens goes to 2 of 4 experts, each expert a
# gate/up projection (256 -> 2 x 512) and a down projection (512 -> 256): 2 FLOPs per multiply-add.
TOKENS, TOP_K, HIDDEN, INTERMEDIATE, EXPERTS = 128, 2, 256, 512, 4
EXPERT_FLOPS = 2 * TOKENS * TOP_K * 3 * HIDDEN * INTERMEDIATE  # 201,326,592 per call
EXPERT_WEIGHT_BYTES = EXPERTS * 3 * HIDDEN * INTERMEDIATE * 4


@pytest.fixture(scope="module")
def mixtral():
    """The Mixtral profiled once with transformers' default experts (torch._grouped_mm over the
    tokens sorted by expert) and once with its eager loop (F.linear per expert hit, on the tokens
    torch.where routed to it): one row count per loop iteration, each M chosen by the data."""
    pytest.importorskip("transformers")
    loaded = load_model(spec_from_options(DATA / "hf_mixtral.py", device="cpu"))
    grouped = profiler.profile_model(loaded, iters=1, warmup=1)
    loaded.model.mixtral.config._experts_implementation = "eager"
    looped = profiler.profile_model(loaded, iters=1, warmup=1)
    return {"grouped": grouped, "looped": looped}


@pytest.fixture(scope="module")
def bert():
    pytest.importorskip("transformers")
    return run_profile(DATA / "hf_bert.py", iters=1)


def experts_row(result):
    return next(e for e in result["entries"] if e["target"].startswith("module[MixtralSparseMoeBlock.experts:"))


def assert_follows_from_its_work(row):
    """The ceiling and the projection are what the row's own counted work gives at PEAKS."""
    roof_s = max(row["bytes"] / (PEAKS["copy_gbps"] * 1e9), row["flops"] / (PEAKS["matmul_tflops"]["float32"] * 1e12))
    per_call_s = row["time_ms"] / 1e3 / row["calls"]
    assert row["work"] == "counted" and row["roofline_us"] == pytest.approx(roof_s * 1e6)
    assert row["ceiling_speedup"] == pytest.approx(max(1.0, per_call_s / roof_s))
    assert row["projected_e2e_speedup"] == pytest.approx(plan.amdahl(row["share"], row["ceiling_speedup"]))


def assert_ranked_by_honest_gains(result):
    """Rows rank by the projection their counted work gives (recomputed here), rows without a
    ceiling by their share alone; the total ceiling counts the counted rows only."""
    rows = [e for e in result["entries"] if e["kernel_type"] != "other"]
    gains = [plan.amdahl(r["share"], r["ceiling_speedup"]) if r["ceiling_speedup"] is not None else 1 / (1 - r["share"])
             for r in rows]
    assert gains == sorted(gains, reverse=True)
    counted = [(r["share"], r["ceiling_speedup"]) for r in rows if r["ceiling_speedup"] is not None]
    assert result["total_ceiling_e2e_speedup"] == pytest.approx(plan.amdahl_many(counted))


@pytest.mark.parametrize("experts", ["grouped", "looped"])
def test_mixtral_experts_are_charged_the_products_they_run(mixtral, experts):
    result = plan.make_plan(mixtral[experts], PEAKS)
    row = experts_row(result)
    # the analytic count: every routed token through both projections, and a little elementwise work
    assert EXPERT_FLOPS <= row["flops"] <= 1.01 * EXPERT_FLOPS
    # its bytes: the hidden states in and out, the routing (int64 indices, fp32 weights), every expert's weights
    assert row["bytes"] == 2 * TOKENS * HIDDEN * 4 + TOKENS * TOP_K * (8 + 4) + EXPERT_WEIGHT_BYTES
    # so its roofline is at least the time those FLOPs take at the compute peak, not a floor's
    assert row["roofline_us"] >= EXPERT_FLOPS / (PEAKS["matmul_tflops"]["float32"] * 1e12) * 1e6
    assert_follows_from_its_work(row)
    assert_ranked_by_honest_gains(result)
    assert result["uncounted_share"] == 0.0


def test_mixtral_expert_loop_stays_one_target_with_the_data_chosen_shapes_it_ran(mixtral):
    prof = mixtral["looped"]
    row = next(g for g in prof.groups if g["target"].startswith("module[MixtralSparseMoeBlock.experts:"))
    assert row["data_dependent"] in ("aten::nonzero", "aten::nonzero_numpy")
    # per layer the experts' M add up to the routed rows; each weight shape is one distribution
    assert {m["op"] for m in row["matmuls"]} == {f"aten::linear[K={HIDDEN},N={2 * INTERMEDIATE}]",
                                                 f"aten::linear[K={INTERMEDIATE},N={HIDDEN}]"}
    assert all(sum(m["M"]) == 2 * TOKENS * TOP_K for m in row["matmuls"])  # 2 layers
    # no typed target or module target is named after one batch's routing
    inside = [g for g in prof.groups if g is not row and any("experts" in m["name"] for m in g["modules"])]
    assert inside == []
    assert prof.coverage == pytest.approx(1.0)


def test_bert_module_targets_are_charged_their_elements_and_io_not_a_floor(bert):
    result = plan.make_plan(bert, PEAKS)
    rows = {e["module"]["label"]: e for e in result["entries"] if e["kernel_type"] == "module"}
    gelu = rows["BertIntermediate.intermediate_act_fn"]
    assert gelu["flops"] == 128 * 1024 and gelu["bytes"] == 2 * 128 * 1024 * 4
    # an embedding moves rows: no FLOPs, and only the rows it reads (its output), not the table
    words = rows["BertEmbeddings.word_embeddings"]
    assert words["flops"] == 0 and words["bytes"] == 128 * 8 + 128 * 256 * 4
    for row in rows.values():
        assert_follows_from_its_work(row)
    assert_ranked_by_honest_gains(result)
    assert bert.coverage >= 0.95


FLOOR_MODEL = '''
import numpy as np
import torch, torch.nn as nn

@torch.library.custom_op("ak_floor_test::numpy_tanh", mutates_args=())
def numpy_tanh(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.tanh(x.numpy()))

@numpy_tanh.register_fake
def _(x):
    return torch.empty_like(x)

class Act(nn.Module):
    def forward(self, x):
        return numpy_tanh(x) * 2  # work in numpy, where no op records it

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj, self.act = nn.Linear(64, 64), Act()
    def forward(self, x):
        return self.act(self.proj(x))

def get_inputs():
    return [torch.randn(32, 64)]
'''


def test_a_target_whose_work_could_not_be_counted_has_no_ceiling_and_says_why(tmp_path):
    from rich.console import Console

    from autokernel.deploy.report import _plan
    path = tmp_path / "floor.py"
    path.write_text(FLOOR_MODEL)
    result = plan.make_plan(run_profile(path, iters=1), PEAKS)
    act = next(e for e in result["entries"] if e["kernel_type"] == "module")
    assert act["work"] == "floor" and act["ceiling_speedup"] is None and act["projected_e2e_speedup"] is None
    assert act["bound"] is None and "ak_floor_test::numpy_tanh" in act["ceiling_note"] and "floor" in act["ceiling_note"]
    assert act["flops"] == 32 * 64  # the multiply it was seen to do: a floor
    # ranked by its share alone; left out of the total ceiling, which says so
    assert_ranked_by_honest_gains(result)
    assert result["uncounted_share"] == pytest.approx(act["share"])
    console = Console(width=200, record=True)
    console.print(plan.table(result))
    shown = console.export_text()
    assert "n/a" in shown and "could not be counted" in shown and "ak_floor_test::numpy_tanh" in shown
    report = "\n".join(_plan(result))
    assert "| n/a | n/a |" in report and "ak_floor_test::numpy_tanh" in report
