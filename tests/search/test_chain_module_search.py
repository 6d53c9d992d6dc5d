"""A generic chain searched as a module-style target end to end on the CPU, with the scripted
OpenAI-compatible server: the example model's tanh GELU, written inline in its MLP, is a run of ops no typed chain covers;
its problem replays those ops, a Triton ModelNew for it passes the KernelBench eval, the tuner
skips it, and verify judges nothing it cannot bind: the winner is listed as not served, saying why."""
import json

from fake_openai import API_KEY, MODEL, fake_openai, reply  # noqa: F401  (fixture)
from module_kernels import TRITON_GELU
from module_kernels import reply as kernel_reply
from paths import ROOT

EXAMPLES = ROOT / "examples"
CHAIN = "chain[mul-pow-add-tanh:1x16x256:float32]"
# the chain reads the product's output as the product wrote it, [16, 256], and views it itself
TRITON_CHAIN_GELU = TRITON_GELU.replace("        return y\n", "        return y.view(1, 16, 256)\n")


def start_run(tmp_path, agent, **options):
    from autokernel.profile.modelfile import spec_from_options
    from autokernel.search import start as run_start
    opts = run_start.OptimizeOptions(agent=agent, llm=MODEL, only=["chain["], **options)
    # the GELU written inline in the MLP's forward: a run inside a larger forward (the example's
    # TanhGELU module is the run's whole module, which its own module target stands for)
    model = tmp_path / "gelu_inline.py"
    model.write_text((EXAMPLES / "gelu_mlp.py").read_text().replace(
        "return self.c_proj(self.act(self.c_fc(x)))", "return self.c_proj(TanhGELU.forward(None, self.c_fc(x)))"))
    return run_start.start(spec_from_options(model, device="cpu"), opts, tmp_path / "runs")


def test_a_generic_chain_is_searched_by_the_llm_agent_and_judged(tmp_path, fake_openai, monkeypatch):  # noqa: F811
    from autokernel.deploy.winners import GENERIC_NOT_SERVED, winner_files
    from autokernel.search import run_search
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    fake_openai.script(reply(kernel_reply(TRITON_CHAIN_GELU, "the GELU chain as one Triton pass.")))
    run, state, config = start_run(tmp_path, "llm", base_url=fake_openai.base_url, max_experiments=1)
    plan = json.loads(run.plan_path.read_text())
    row = next(r for r in plan["chains"]["entries"] if r["target"] == CHAIN)
    assert (row["chain_type"], row["kernel_type"], row["calls"]) == ("generic", "module", 2)  # two MLPs
    (target,) = state.targets
    assert (target.name, target.kernel_type) == (CHAIN, "module")
    state = run_search.execute(run, state, config)
    (first,) = target.history
    assert (first["verdict"], first["decision"]) == ("PASS", "KEEP") and target.best_experiment == 0
    prompt = fake_openai.prompts()[0]
    assert "torch.ops.aten.tanh.default(" in prompt and "[16, 256] float32" in prompt
    (winner,) = winner_files(run)
    assert winner.not_served == GENERIC_NOT_SERVED


def test_the_tuner_skips_a_generic_chain_as_a_module_target(tmp_path):
    from autokernel.search import run_search
    from autokernel.search.module_search import TUNER_SKIP
    run, state, config = start_run(tmp_path, "tune")
    state = run_search.execute(run, state, config)
    (target,) = state.targets
    assert (target.name, target.status, target.stop_reason) == (CHAIN, "done", TUNER_SKIP) and not target.history
