"""verify and its router: every route a winner can take inside an unmodified model, what falls back
and why, restoring the model afterwards, and a wrong kernel named guilty.

The routing tests use kernels written in PyTorch (the router does not care what a kernel_fn runs);
the run tests use the real Triton starters in the Triton interpreter."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from autokernel.deploy import routing
from autokernel.deploy import verify as verifier
from autokernel.search.run import RunDir
from harness.kernel_types import registry
from harness.kernel_types.registry import Case
from paths import ROOT
from processes import user_env
from tiny_llama import TARGETS, WRONG_RMSNORM, example, llama, make_run, rewrite_winner, winners


# ---------------------------------------------------------------- the router
def test_every_route_serves_its_calls_and_the_outputs_stay_the_same():
    module, model, tokens = llama()
    calls = []
    with torch.no_grad():
        expected = model(tokens)
        router = routing.Router(winners(calls))
        with router.patched(model):
            outs = [model(tokens) for _ in range(2)]
    for out in outs:
        assert (out - expected).abs().max().item() < 1e-5
    tally = router.tally.to_json()
    for target, kernel_type, *_, per_forward in TARGETS:
        assert tally["per_kernel"][target]["calls_served"] == 2 * per_forward, target
        assert tally["per_kernel"][target]["fallbacks"] == 0
        assert calls.count(kernel_type) == 2 * per_forward
    assert tally["per_kernel"]["rotary_embedding[1x2x8x16:float32]"]["served_by_op"] == {"apply_rotary_pos_emb": 4}
    # the lm head (8 tokens x 32 -> 64) is a product no winner was judged at
    assert tally["per_op"]["F.linear"] == {"routed": 8, "fell_back": 2,
                                           "reasons": {"no winner at matmul[8x32x64:float32]": 2}}


def test_leaving_the_context_restores_the_model():
    module, model, tokens = llama()
    original_rotary = module.apply_rotary_pos_emb
    calls = []
    router = routing.Router(winners(calls))
    with torch.no_grad(), router.patched(model):
        assert "forward" in vars(model.layers[0].mlp)
        assert module.apply_rotary_pos_emb is not original_rotary
    assert "forward" not in vars(model.layers[0].mlp) and "forward" not in vars(model.norm)
    assert module.apply_rotary_pos_emb is original_rotary
    calls.clear()
    with torch.no_grad():
        model(tokens)
    assert calls == []


class ShiftedNorm(nn.Module):
    """Looks like an RMSNorm (one weight, an eps) but subtracts the mean: a layer norm without bias."""

    def __init__(self, dim):
        super().__init__()
        self.eps, self.weight = 1e-6, nn.Parameter(torch.ones(dim) * 1.5)

    def forward(self, x):
        x = x - x.mean(-1, keepdim=True)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def test_a_form_that_computes_something_else_is_never_served():
    model = nn.Sequential(nn.Linear(16, 16, bias=False), ShiftedNorm(16)).eval()
    x = torch.randn(4, 16) + 3.0
    calls = []
    norm = [("rmsnorm[4x16:float32]", "rmsnorm", {"M": 4, "N": 16}, {}, "module", [{"name": "1", "class": "ShiftedNorm"}], 1)]
    router = routing.Router(winners(calls, norm))
    with torch.no_grad():
        expected = model(x)
        with router.patched(model):
            outs = [model(x) for _ in range(3)]
    assert all(torch.equal(o, expected) for o in outs)
    assert calls == []
    kernel = router.tally.to_json()["per_kernel"]["rmsnorm[4x16:float32]"]
    assert kernel["calls_served"] == 0 and kernel["fallbacks"] == 3
    assert "did not match the rmsnorm reference" in next(iter(kernel["fallback_reasons"]))


class Blocked(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16, bias=True)
        self.w = nn.Parameter(torch.randn(16, 16) / 4)

    def forward(self, x, mask):
        q = (self.proj(x) + x @ self.w).view(1, 2, 4, 8)
        attn = F.scaled_dot_product_attention(q, q, q, attn_mask=mask)
        return torch.softmax(attn, dim=0)  # over dim 0: not the softmax type, never counted


def test_calls_a_winner_matches_but_cannot_serve_fall_back_with_their_reason(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # nn.Linear's bias is added by a small Triton kernel
    model, x, mask = Blocked().eval(), torch.randn(4, 16), torch.ones(4, 4, dtype=torch.bool)
    calls = []
    targets = [("matmul[4x16x16:float32]", "matmul", {"M": 4, "K": 16, "N": 16}, {}, "op", [], 0),
               ("flash_attention[1x2x4x8:float32]", "flash_attention", {"B": 1, "H": 2, "S": 4, "D": 8}, {}, "op", [], 0),
               ("softmax[8x8:float32]", "softmax", {"M": 8, "N": 8}, {}, "op", [], 0)]
    router = routing.Router(winners(calls, targets))
    expected = model(x, mask)
    with router.patched(model):
        with torch.no_grad():
            assert (model(x, mask) - expected).abs().max().item() < 1e-5
        model(x, mask)  # with autograd on: no kernel has a backward
    assert calls == ["matmul", "matmul"]  # the biased projection and x @ w, without autograd
    kernels = router.tally.to_json()["per_kernel"]
    assert kernels["matmul[4x16x16:float32]"]["served_by_op"] == {"F.linear+bias": 1, "torch.matmul": 1}
    assert kernels["matmul[4x16x16:float32]"]["fallback_reasons"] == {
        "autograd: the kernel has no backward (run under torch.no_grad or inference_mode)": 2}
    reasons = kernels["flash_attention[1x2x4x8:float32]"]["fallback_reasons"]
    assert reasons == {"an attn_mask": 2}
    assert kernels["softmax[8x8:float32]"]["fallbacks"] == 0 and "softmax" not in router.tally.to_json()["per_op"]


def test_attention_written_inline_is_counted_as_a_fallback_and_its_softmax_still_routes():
    gpt2 = example(ROOT / "examples" / "gpt2_tiny.py")
    torch.manual_seed(0)
    model, tokens = gpt2.GPT2Tiny(64, 32, 1, 2, 16).eval(), torch.randint(0, 64, (1, 8))
    calls = []
    attention = [{"name": "h.0.attn", "class": "CausalSelfAttention"}]
    targets = [("flash_attention[1x2x8x16:float32,causal]", "flash_attention", {"B": 1, "H": 2, "S": 8, "D": 16},
                {"causal": True}, "pattern", attention, 0),
               ("softmax[16x8:float32]", "softmax", {"M": 16, "N": 8}, {}, "op", attention, 1)]
    router = routing.Router(winners(calls, targets))
    with torch.no_grad():
        expected = model(tokens)
        with router.patched(model):
            assert (model(tokens) - expected).abs().max().item() < 1e-5
    kernels = router.tally.to_json()["per_kernel"]
    assert kernels["softmax[16x8:float32]"]["calls_served"] == 1 and calls == ["softmax"]
    flash = kernels["flash_attention[1x2x8x16:float32,causal]"]
    assert flash["calls_served"] == 0 and flash["fallbacks"] == 1
    assert "written inline in CausalSelfAttention.forward" in next(iter(flash["fallback_reasons"]))


@pytest.mark.parametrize("kernel_type", registry.names())
def test_dims_and_references_agree_with_the_registry(kernel_type):
    # the router carries its own copies (the exported package has no harness): they must not drift
    kt = registry.get(kernel_type)
    args, kwargs = registry.build_inputs(Case.make(kernel_type, kt.smoke_shape, "float32", seed=3))
    assert routing.DIMS[kernel_type](*args) == kt.shape_of(*args)
    ours = routing.REFERENCES[kernel_type](*[a.double() if a.is_floating_point() else a for a in args], **kwargs)
    assert routing.error_vs(ours, kt.reference(*args, **kwargs))[1] < 1e-10


# ---------------------------------------------------------------- verify on a run, real Triton kernels


OLD_NORM = "rmsnorm[8x32:float32]"  # a record from before serving ranges: its target's shape alone


@pytest.fixture(scope="module")
def starter_run(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("verify"), exact=(OLD_NORM,))


def test_verify_routes_every_form_to_real_kernels_and_writes_verify_json(starter_run, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # verify sets it too; this puts it back afterwards
    result = verifier.verify(starter_run, seeds=(0, 1))
    written = json.loads((starter_run / "verify.json").read_text())
    assert written["outputs_match"] is True and written["ok"] is True and written["guilty"] == []
    assert written["max_rel_err"] < 1e-4 and written["cpu_figures"] is True and written["device"] == "cpu"
    assert written["e2e_speedup"] > 0 and written["projected_e2e_speedup"] == pytest.approx(1 / (1 - 5 * 0.1 * (1 - 2)))
    sets = written["workload"]["sets"]
    assert [(s["name"], s["seeds"]) for s in sets] == [("1x8 (profiled)", [0, 1]), ("1x7", [0]), ("2x8", [0]),
                                                       ("1x1", [0])]
    assert all(s["outputs_match"] and s["patched_median_us"] > 0 and s["eager_median_us"] > 0 for s in sets)
    for target, *_, per_forward in TARGETS:  # the profiled inputs twice, then 1x7, 2x8 and 1x1 once each
        served = 2 * per_forward if target == OLD_NORM else 5 * per_forward
        assert written["per_kernel"][target]["calls_served"] == served, target
        assert written["per_kernel"][target]["fallbacks"] == (3 * per_forward if target == OLD_NORM else 0), target
    assert written["per_kernel"][OLD_NORM]["fallback_reasons"] == {
        "rows 7: not proven (judged at rows 8)": 3, "rows 16: not proven (judged at rows 8)": 3,
        "1 row: not proven (judged at rows 8)": 3}
    assert written["per_kernel"]["fused_mlp[8x32x64:float32]"]["serving_range"] == "rows 1 to 16 (D=32, F=64, float32)"
    assert sets[1]["per_kernel"][OLD_NORM] == {"calls_served": 0, "fallbacks": 3, "fallback_reasons": {
        "rows 7: not proven (judged at rows 8)": 3}}
    assert written["workload"]["calls_served"] == sum(written["per_kernel"][t]["calls_served"] for t, *_ in TARGETS)
    assert written["workload"]["summary"].startswith(
        f"the winners served {written['workload']['calls_served']} of the {written['workload']['calls_served'] + 9} ")
    assert written["per_op"]["F.linear"]["reasons"] == {f"no winner at matmul[{m}x32x64:float32]": n
                                                        for m, n in ((8, 2), (7, 1), (16, 1), (1, 1))}
    assert result["per_kernel"] == written["per_kernel"]


def test_a_wrong_winner_fails_verify_is_named_and_left_out_of_the_export(starter_run, tmp_path):
    from autokernel.deploy import export as exporter
    run = tmp_path / "run-wrong"
    shutil.copytree(starter_run, run)
    (run / "verify.json").unlink(missing_ok=True)
    rewrite_winner(RunDir(run), "rmsnorm[8x32:float32]", WRONG_RMSNORM)
    # from a user's shell: the other starters must still run in the interpreter and pass (fused_mlp
    # and attention call Triton's own @triton.jit functions, which raise if made before it was chosen)
    proc = subprocess.run([sys.executable, "-m", "autokernel", "verify", str(run)], cwd=ROOT, env=user_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "rmsnorm[8x32:float32]" in proc.stderr and "verify failed" in proc.stderr
    result = json.loads((run / "verify.json").read_text())
    assert result["outputs_match"] is False and result["ok"] is False
    assert result["guilty"] == ["rmsnorm[8x32:float32]"]
    assert result["outputs_match_without_guilty"] is True
    assert "rmsnorm[8x32:float32]" not in result["patched_targets"] and len(result["patched_targets"]) == 4
    manifest = exporter.export(run, tmp_path / "out")
    assert [k["reason"].split(":")[0] for k in manifest["left_out"]] == ["guilty in verify.json"]
    assert "rmsnorm[8x32:float32]" not in {k["target"] for k in manifest["kernels"]}
    assert len(manifest["kernels"]) == 4


def test_a_chain_whose_form_fits_no_call_of_the_model_gives_its_calls_back_to_its_members(tmp_path):
    """The tiny LLaMA's decoder layer is called (x, cos, sin), not as the pre-norm form reads it: on
    CPU figures the add_rmsnorm chain is bound over the rmsnorm winner, serves nothing, and verify
    binds the member in its place (verify passes, the chain not served, saying why); export follows."""
    from autokernel.deploy import export as exporter
    chain = ("add_rmsnorm[8x32:float32]", "add_rmsnorm", {"M": 8, "N": 32}, {"eps": 1e-6}, "module",
             [{"name": "layers.0", "class": "DecoderLayer"}], 0)
    run = make_run(tmp_path, targets=[TARGETS[0], chain], plan_extra={"cpu_figures": True})
    result = verifier.verify(run, seeds=(0,))
    assert result["ok"], result["failures"]
    (decision,) = result["chains"]
    assert decision["served"] == "members" and "its form fits no call of this model" in decision["why"]
    assert "DecoderLayer.forward did not match the add_rmsnorm reference" in decision["why"]
    assert result["per_kernel"][TARGETS[0][0]]["calls_served"] == 3 * 4  # three norms, four input sets
    assert result["per_kernel"][chain[0]]["calls_served"] == 0
    manifest = exporter.collect(run).manifest
    assert [k["target"] for k in manifest["kernels"]] == [TARGETS[0][0]]
    assert manifest["left_out"][0]["target"] == chain[0]
