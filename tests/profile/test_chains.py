"""Chains in the plan: runs of ops whose intermediates go only to the next, found in the model's own
data-flow graph, priced by the bytes fusion saves; and a chain whose intermediate has another use
is never proposed."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel.profile import chain_graph, chain_plan, chains, plan
from harness.kernel_types import registry
from paths import DATA, ROOT


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _found(model, run):
    with torch.no_grad():
        graph = chain_graph.capture(model, run)
    return graph, *chains.find(graph)


@pytest.fixture(scope="module")
def llama_chains():
    pytest.importorskip("transformers")
    hf = _load(DATA / "hf_llama.py")
    torch.manual_seed(0)
    model, (ids,) = hf.Model(), hf.get_inputs()

    def step():
        logits = model(ids)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    return _found(model, step)


def test_llama_forward_and_loss_hold_the_four_chain_types(llama_chains):
    graph, found, rejected = llama_chains
    by_type = {}
    for c in found:
        by_type.setdefault(c.chain_type, []).append(c)
    # 2 layers: a residual add before each of the 4 norms but the first (it follows the embedding),
    # one SiLU x up and one q/k rotary pair per layer, one final projection + loss
    assert {t: len(v) for t, v in by_type.items()} == {"add_rmsnorm": 4, "silu_mul": 2, "rotary_qk": 2,
                                                        "linear_cross_entropy": 1}
    assert by_type["add_rmsnorm"][0].dims == {"M": 16, "N": 64} and by_type["add_rmsnorm"][0].options == {"eps": 1e-6}
    assert by_type["silu_mul"][0].dims == {"M": 16, "N": 128}
    assert by_type["rotary_qk"][0].dims == {"B": 1, "HQ": 2, "HK": 2, "S": 16, "D": 32}
    ce = by_type["linear_cross_entropy"][0]
    # the shifted loss reads 15 of the 16 positions
    assert ce.dims == {"N": 15, "D": 64, "V": 256} and ce.options == {"reduction": "mean", "ignore_index": -100}
    assert [graph.ops[i].name for i in ce.ops] == ["aten::mm", "aten::_log_softmax", "aten::nll_loss_forward"]
    # the sum is given back (the next residual reads it) with the normalised output
    add_norm = by_type["add_rmsnorm"][0]
    assert len(add_norm.outputs) == 2 and graph.ops[add_norm.ops[0]].name == "aten::add"
    assert not rejected
    for c in found:  # each chain is a target of its registry type, named by the type's own dims
        assert list(c.dims) == list(registry.get(c.chain_type).smoke_shape)


def test_chains_are_priced_by_the_bytes_fusion_saves(llama_chains):
    graph, found, rejected = llama_chains
    listed = chain_plan.entries(graph, found, rejected, None, total_ms=1.0)
    rows = {r["chain_type"]: r for r in listed["entries"]}
    silu = rows["silu_mul"]
    # unfused: silu reads and writes M*N, the product reads 2 M*N and writes M*N; fused: 2 in, 1 out
    assert silu["unfused_bytes"] == 5 * 16 * 128 * 4 and silu["fused_bytes"] == 3 * 16 * 128 * 4
    ce = rows["linear_cross_entropy"]
    # fused: the hidden states, the weight, the 15 targets the shifted loss reads (a view of the ids:
    # its slice, not the whole), the loss; never the logits
    assert ce["fused_bytes"] == 16 * 64 * 4 + 256 * 64 * 4 + 15 * 8 + 4
    assert ce["bytes_saved"] >= 3 * 15 * 256 * 4
    # no records: no measured time, so no ceiling claimed, and the row says why
    priced = plan.chain_price(ce, {"copy_gbps": 10.0, "matmul_tflops": {"float32": 0.1}}, 2.0)
    assert priced["ceiling_speedup"] is None and "not in the profile's records" in priced["ceiling_note"]


class _Mlp(nn.Module):
    def __init__(self, leak: bool):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(8, 16), nn.Linear(8, 16), nn.Linear(16, 8)
        self.leak = leak

    def forward(self, x):
        act = F.silu(self.gate(x))
        h = act * self.up(x)
        if self.leak:  # SiLU's output read again: fusing SiLU x up would drop it
            h = h + act
        return self.down(h)


def _searched(graph, found, rejected) -> list[str]:
    """The targets the search would take from a plan holding these chains."""
    from autokernel.search.start import pick_targets
    return [t.name for t in pick_targets({"entries": [], "chains": chain_plan.entries(graph, found, rejected, None, 1.0)},
                                         None)]


def test_a_chain_whose_intermediate_is_used_elsewhere_is_never_proposed():
    x = torch.randn(4, 8)
    model = _Mlp(leak=False)
    graph, found, rejected = _found(model, lambda: model(x))
    assert [c.chain_type for c in found] == ["silu_mul"] and not rejected
    assert _searched(graph, found, rejected) == ["silu_mul[4x16:float32]"]
    model = _Mlp(leak=True)
    graph, found, rejected = _found(model, lambda: model(x))
    assert found == []
    assert len(rejected) == 1 and rejected[0].chain_type == "silu_mul"
    assert "SiLU's output" in rejected[0].reason and "aten::add" in rejected[0].reason
    assert "left unfused" in rejected[0].reason
    # nor searched: the plan lists it under `rejected`, which the search never reads
    assert _searched(graph, found, rejected) == []


class _Head(nn.Module):
    def __init__(self, also_return_logits: bool):
        super().__init__()
        self.proj = nn.Linear(8, 32, bias=False)
        self.also = also_return_logits

    def forward(self, x, targets):
        logits = self.proj(x)
        loss = F.cross_entropy(logits, targets, ignore_index=3, reduction="sum")
        return (loss, logits) if self.also else loss


def test_logits_the_caller_also_gets_are_not_fused_away():
    x, t = torch.randn(5, 8), torch.randint(0, 32, (5,))
    model = _Head(False)
    _, found, _ = _found(model, lambda: model(x, t))
    assert [(c.chain_type, c.options) for c in found] == [("linear_cross_entropy", {"reduction": "sum", "ignore_index": 3})]
    model = _Head(True)
    _, found, rejected = _found(model, lambda: model(x, t))
    assert found == [] and "the caller (it is returned)" in rejected[0].reason


class _Norm(nn.Module):
    def __init__(self, leak: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(8))
        self.leak = leak

    def forward(self, a, b):
        h = a + b
        normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        out = normed * self.weight
        return (h, out, normed.sum()) if self.leak else (h, out)


def test_add_rmsnorm_gives_back_the_sum_but_not_its_inner_values():
    a, b = torch.randn(3, 8), torch.randn(3, 8)
    model = _Norm(False)
    _, found, _ = _found(model, lambda: model(a, b))
    assert [c.chain_type for c in found] == ["add_rmsnorm"]  # the returned sum is the chain's output
    model = _Norm(True)
    _, found, rejected = _found(model, lambda: model(a, b))
    assert found == [] and "the normalised x" in rejected[0].reason


@pytest.fixture
def seeded_peaks(tmp_path):
    """A peaks cache already in place, so the command does not spend seconds probing."""
    from harness.device import peaks
    env = {**os.environ, "AUTOKERNEL_CACHE_DIR": str(tmp_path / "cache")}
    os.environ["AUTOKERNEL_CACHE_DIR"], saved = env["AUTOKERNEL_CACHE_DIR"], os.environ.get("AUTOKERNEL_CACHE_DIR")
    try:
        path = peaks.cache_path("cpu")
    finally:
        os.environ.pop("AUTOKERNEL_CACHE_DIR") if saved is None else os.environ.update(AUTOKERNEL_CACHE_DIR=saved)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"device": "test cpu", "copy_gbps": 20.0, "matmul_tflops": {"float32": 0.2},
                                "measured_at": "2026-01-01T00:00:00+00:00", "method": "seeded by a test"}))
    return env


def test_profile_command_lists_chains_in_their_own_section(seeded_peaks):
    pytest.importorskip("transformers")
    done = subprocess.run([sys.executable, "-m", "autokernel", "profile", str(DATA / "hf_llama.py"), "--train",
                           "--json", "-", "--iters", "2", "--warmup", "1", "--device", "cpu"],
                          capture_output=True, text=True, env={**seeded_peaks, "COLUMNS": "400"}, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    profiled = json.loads(done.stdout)
    rows = {r["chain_type"]: r for r in profiled["chains"]["entries"] if r["chain_type"] != "generic"}
    assert set(rows) == set(chains.CHAIN_TYPES)
    # runs no typed chain covers are listed beside them, each with a replay to be searched as a
    # module-style target, but not one module's own work: the first RMSNorm (after the embedding,
    # no residual add) is the rmsnorm row's, the rotary embedding's cos and sin its module's
    generic = [r for r in profiled["chains"]["entries"] if r["chain_type"] == "generic"]
    assert not any(r["target"].startswith("chain[pow-mean-add-rsqrt-mul") for r in generic)
    assert not any(":int" in r["target"] for r in generic)  # LlamaModel's position arithmetic
    for r in generic:
        assert r["kernel_type"] == "module" and r["replay"]["steps"] and r["bytes_saved"] > 0 and r["fwd_ms"] > 0
    for r in rows.values():
        assert r["bytes_saved"] > 0 and r["fwd_ms"] > 0 and r["bwd_ms"] > 0
        assert r["ceiling_speedup"] >= 1.0 and r["projected_e2e_speedup"] >= 1.0
    # alternatives, not additions: the shares of the plan's rows still add up to 1 without them
    assert sum(e["share"] for e in profiled["entries"]) == pytest.approx(1.0, abs=0.01)
    assert "chains:" in done.stderr and "linear_cross_entropy[15x64x256:fp32]" in done.stderr
    # each names the targets it is an alternative to; the SiLU x up's module is the MLP that holds it
    assert {t: r["members"] for t, r in rows.items()} == {
        "add_rmsnorm": ["rmsnorm[16x64:float32]"], "silu_mul": ["fused_mlp[16x64x128:float32]"],
        "rotary_qk": ["rotary_embedding[1x2x16x32:float32]"],
        "linear_cross_entropy": ["cross_entropy[15x256:float32]", "matmul[16x64x256:float32]"]}
    assert {m["class"] for m in rows["silu_mul"]["modules"]} == {"LlamaMLP"}
    _chains_are_searched(profiled)


def test_a_chain_with_no_contract_type_is_not_a_typed_target():
    from autokernel.search.start import pick_targets
    row = {"target": "gelu_mul[4x16:float32]", "kernel_type": "gelu_mul", "chain_type": "gelu_mul",
           "dims": {"M": 4, "N": 16}, "dtype": "float32", "share": 0.5, "members": []}
    assert pick_targets({"entries": [], "chains": {"entries": [row]}}, None) == []


def _chains_are_searched(plan_):
    """The search takes each chain as a target of its type, dims, dtype, share and ceiling; under
    --top a chain rides with its members and takes no place of its own."""
    from autokernel.search.start import pick_targets
    rows = {r["target"]: r for r in plan_["chains"]["entries"]}
    every = {t.name: t for t in pick_targets(plan_, None)}
    for name, r in rows.items():
        t = every[name]
        assert (t.kernel_type, t.dims, t.dtype, t.share, t.ceiling_speedup) == (
            r["kernel_type"], r["dims"], r["dtype"], r["share"], r["ceiling_speedup"])
        assert t.kernel_type == (r["chain_type"] if r["chain_type"] != "generic" else "module")
    assert every["add_rmsnorm[16x64:float32]"].kwargs == {"eps": 1e-6}
    for top in (1, 3):
        picked = [t.name for t in pick_targets(plan_, top)]
        singles = [n for n in picked if n not in rows]
        assert len(singles) == top
        riding = {n for n, r in rows.items() if {s.replace(",causal]", "]") for s in singles} & set(r["members"])}
        assert set(picked) - set(singles) == riding


class _Rotary(nn.Module):
    """q and k rotated with cos and sin cut from caches of 64 positions, as many models keep them."""

    def __init__(self):
        super().__init__()
        angles = torch.randn(64, 8).repeat(1, 2)
        self.register_buffer("cos_cached", angles.cos())
        self.register_buffer("sin_cached", angles.sin())

    def forward(self, q, k):
        cos, sin = self.cos_cached[: q.shape[2]], self.sin_cached[: q.shape[2]]

        def rotate(x):
            return torch.cat((-x[..., 8:], x[..., :8]), dim=-1)
        return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin


def test_a_slice_of_a_cache_is_priced_as_the_slice_the_chain_reads():
    model, q, k = _Rotary(), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    graph, found, rejected = _found(model, lambda: model(q, k))
    (row,) = chain_plan.entries(graph, found, rejected, None, 1.0)["entries"]
    assert row["chain_type"] == "rotary_qk"
    # q and k in, both out, and 8 of the caches' 64 rows of cos and sin: never the whole caches
    assert row["fused_bytes"] == 4 * (1 * 2 * 8 * 16) * 4 + 2 * (8 * 16) * 4
