"""Chains of no registry type: runs of memory-bound ops whose intermediates stay inside the run,
found by a rule, replayed exactly by a module-style reference, and searched as module targets."""
import importlib.util

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel.profile import chain_graph, chain_plan, chain_replay, chains, generic_chains
from paths import DATA


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _found(model, run, every_run: bool = False):
    """(graph, chains, rejected); `every_run`: the generic rule's runs before the plan leaves out
    those that are one module's own work (generic_chains.within_one_module)."""
    with torch.no_grad():
        graph = chain_graph.capture(model, run)
    if not every_run:
        return graph, *generic_chains.find_all(graph)
    typed, rejected = chains.find(graph)
    generic, missed = generic_chains.find(graph, {i for c in typed for i in c.ops})
    return graph, typed + generic, rejected + missed


class _ScaleBiasGelu(nn.Module):
    def __init__(self, leak: bool = False):
        super().__init__()
        self.leak = leak
        self.lin, self.out = nn.Linear(8, 16), nn.Linear(16, 8)
        self.scale, self.bias = nn.Parameter(torch.randn(16)), nn.Parameter(torch.randn(16))

    def forward(self, x):
        y = self.lin(x) * self.scale + self.bias
        return (self.out(F.gelu(y)), y) if self.leak else self.out(F.gelu(y))


def _problem(tmp_path, row):
    from autokernel.search import chain_problem
    path = chain_problem.write_problem(tmp_path, "p", row["replay"], row["target"])
    return _load(path)


def test_an_untyped_run_is_a_generic_chain_whose_problem_replays_it_exactly(tmp_path):
    torch.manual_seed(0)
    model, x = _ScaleBiasGelu(), torch.randn(2, 4, 8)
    graph, found, rejected = _found(model, lambda: model(x))
    assert [(c.chain_type, [graph.ops[i].name for i in c.ops]) for c in found] == [
        ("generic", ["aten::mul", "aten::add", "aten::gelu"])]
    assert not rejected
    rows = chain_plan.entries(graph, found, rejected, None, 1.0)["entries"]
    assert [(r["target"], r["kernel_type"], r["members"] if "members" in r else []) for r in rows] == [
        ("chain[mul-add-gelu:2x4x16:float32]", "module", [])]
    row = rows[0]
    assert 0 < row["fused_bytes"] < row["unfused_bytes"]
    assert row["serving"].startswith("not served: a generic chain's winner replaces a run of operators")
    # the reference: the chain's own ops on what the model fed them (the parameters among its
    # inputs) give the GELU output the model's next layer read, bit for bit
    seen = {}
    model.out.register_forward_pre_hook(lambda m, a: seen.setdefault("gelu", a[0]))
    with torch.no_grad():
        model(x)
        inputs, _ = chain_replay.recorded(graph, found[0])
        problem = _problem(tmp_path, row)
        assert torch.equal(problem.Model()(*inputs), seen["gelu"])
        assert any(t is model.scale for t in inputs) and any(t is model.bias for t in inputs)
        # get_inputs() draws each input at its recorded shape and dtype
        drawn = problem.get_inputs()
        assert [(tuple(t.shape), t.dtype) for t in drawn] == [(tuple(t.shape), t.dtype) for t in inputs]
        assert problem.Model()(*drawn).shape == (2, 4, 16)
    assert "torch.ops.aten.gelu.default(" in (tmp_path / "p.source.py").read_text()


class _ViewBetween(nn.Module):
    def forward(self, x):
        return torch.mm(torch.tanh((x * 2.0).reshape(4, 8)) + 1.0, torch.ones(8, 2))


def test_a_view_between_two_ops_of_a_chain_is_replayed_with_them():
    x = torch.randn(2, 16)
    graph, found, _ = _found(_ViewBetween(), lambda: _ViewBetween()(x))
    (chain,) = found
    assert [graph.ops[i].name for i in chain.ops] == ["aten::mul", "aten::tanh", "aten::add"]
    spec = chain_replay.replay(graph, chain)
    assert [s["op"] for s in spec["steps"]] == ["aten.mul.Tensor", "aten.view.default", "aten.tanh.default",
                                                "aten.add.Tensor"]
    inputs, outputs = chain_replay.recorded(graph, chain)
    assert [tuple(t.shape) for t in inputs] == [(2, 16)]
    assert torch.equal(chain_replay.run_replay(spec, inputs), torch.tanh((x * 2.0).reshape(4, 8)) + 1.0)
    assert torch.equal(chain_replay.run_replay(spec, inputs), outputs[0])


def test_a_run_whose_intermediate_has_another_reader_is_never_proposed():
    model, x = _ScaleBiasGelu(leak=True), torch.randn(2, 4, 8)
    graph, found, rejected = _found(model, lambda: model(x))
    # y goes to GELU and to the caller: GELU runs alone, only x * scale + bias is a chain
    assert [[graph.ops[i].name for i in c.ops] for c in found] == [["aten::mul", "aten::add"]]
    assert len(rejected) == 1 and rejected[0].chain_type == "generic"
    assert [graph.ops[i].name for i in rejected[0].ops] == ["aten::add", "aten::gelu"]
    assert "the caller" in rejected[0].reason and "left unfused" in rejected[0].reason


@pytest.fixture(scope="module")
def gpt2():
    pytest.importorskip("transformers")
    hf = _load(DATA / "hf_gpt2.py")
    torch.manual_seed(0)
    model, (ids,) = hf.Model(), hf.get_inputs()
    acts = []
    for layer in model.gpt2.transformer.h:
        layer.mlp.act.register_forward_hook(lambda m, a, out: acts.append(out))
    return model, acts, _found(model, lambda: model(ids), every_run=True)


def test_gpt2_tanh_gelu_is_a_generic_run_replayed_exactly_and_left_to_its_module_target(gpt2):
    """The rule finds GPT-2's tanh GELU in each layer and its replay is the module's output bit for
    bit; the plan leaves it to NewGELUActivation's own module target, which is the same work."""
    model, acts, (graph, found, rejected) = gpt2
    gelus = [c for c in found if graph.ops[c.ops[0]].module[1] == "NewGELUActivation"]
    assert len(gelus) == len(model.gpt2.transformer.h) == len(acts)
    for chain, act in zip(gelus, acts):
        assert [graph.ops[i].name.split("::")[1] for i in chain.ops] == [
            "mul", "pow", "mul", "add", "mul", "tanh", "add", "mul"]
        inputs, _ = chain_replay.recorded(graph, chain)
        assert len(inputs) == 1  # c_fc's output, read in three places inside the chain
        assert torch.equal(chain_replay.run_replay(chain_replay.replay(graph, chain), inputs), act)
    rows = {r["target"]: r for r in chain_plan.entries(graph, found, rejected, None, 1.0)["entries"]}
    # the layers' GELUs are one replay: one row, one call per layer
    assert rows["chain[mul-pow-add-tanh:1x64x1024:float32]"]["calls"] == len(acts)
    assert all(generic_chains.within_one_module(graph, c) for c in gelus)
    planned, _ = generic_chains.find_all(graph)
    assert not any(graph.ops[c.ops[0]].module[1] == "NewGELUActivation" for c in planned)


def test_gpt2_residual_add_read_by_the_next_residual_is_not_fused_with_layernorm(gpt2):
    _, _, (graph, found, rejected) = gpt2
    in_chains = {i for c in found for i in c.ops}
    residual = [r for r in rejected if [graph.ops[i].name for i in r.ops] == ["aten::add", "aten::native_layer_norm"]]
    assert residual  # each residual sum is read by the next norm and by the next residual add
    for r in residual:
        assert r.ops[0] not in in_chains
        assert "aten::add" in r.reason.split("is read by")[1] and "left unfused" in r.reason
    # the typed patterns are unaffected: GPT-2 has none of them
    assert {c.chain_type for c in found} == {"generic"}


def test_pick_targets_makes_a_module_target_of_a_generic_chain(tmp_path):
    from autokernel.search.module_search import KERNEL_TYPE, prepare
    from autokernel.search.run import RunDir
    from autokernel.search.start import pick_targets
    model, x = _ScaleBiasGelu(), torch.randn(2, 4, 8)
    graph, found, rejected = _found(model, lambda: model(x))
    plan = {"entries": [], "chains": chain_plan.entries(graph, found, rejected, None, 1.0)}
    for count_modules in (True, False):  # listed for the tuner too, which skips module targets
        (t,) = pick_targets(plan, None, count_modules=count_modules)
        assert (t.name, t.kernel_type, t.kwargs["chain"]) == ("chain[mul-add-gelu:2x4x16:float32]", KERNEL_TYPE, True)
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    prepare(run, [t], None, plan)
    problem = _load(run.path / t.kwargs["problem"])
    inputs, outputs = chain_replay.recorded(graph, found[0])
    with torch.no_grad():
        assert torch.equal(problem.Model()(*inputs), outputs[0])
    # the LLM is shown the chain's ops as the model ran them, and its inputs
    from autokernel.search.module_search import _chain_brief
    path = run.path / t.kwargs["problem"]
    brief = _chain_brief(path, t, path.with_suffix(".source.py").read_text())
    assert "aten::mul > aten::add > aten::gelu" in brief and "torch.ops.aten.gelu.default(" in brief
    assert "0: [8, 16] float32" in brief  # the product's output, viewed to [2, 4, 16] inside the replay
    # a row whose replay could not be written down is not searched
    plan["chains"]["entries"][0]["replay"] = None
    assert pick_targets(plan, None) == []


def test_a_generic_chain_winner_is_judged_but_not_bound_and_says_so(tmp_path):
    from autokernel.deploy import export
    from autokernel.deploy.winners import GENERIC_NOT_SERVED, winner_files
    from autokernel.profile.modelfile import ModelSpec
    from sealed_runs import write_run
    name = "chain[mul-add-gelu:2x4x16:float32]"
    source = "import torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x, s, b):\n        return x\n"
    run = write_run(tmp_path, ModelSpec(path=str(DATA / "hf_gpt2.py"), device="cpu"),
                    [(name, "module", {}, {"chain": True, "ops": ["aten::mul"]}, "op", [], source)])
    (winner,) = winner_files(run)
    assert winner.not_served == GENERIC_NOT_SERVED and "not a module's forward" in winner.not_served
    manifest = export.collect(run.path).manifest
    assert manifest["kernels"] == [] and manifest["left_out"] == [{"target": name, "reason": GENERIC_NOT_SERVED}]
