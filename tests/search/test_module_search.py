"""A module target end to end on the CPU, with the scripted OpenAI-compatible server: the tanh GELU
of an example model becomes a module target; a Triton ModelNew for it passes the KernelBench eval,
one that calls torch.tanh fails integrity; verify serves the winner and the outputs match; the
tuner skips module targets and says so."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_openai import API_KEY, MODEL, fake_openai, reply  # noqa: F401  (fixture)
from module_kernels import TORCH_TANH_GELU, TRITON_GELU
from module_kernels import reply as kernel_reply
from paths import ROOT

EXAMPLES = ROOT / "examples"
GELU = "module[MLP.act:1x16x256:float32]"
USE_PACKAGE = """
import importlib.util, json, sys
import torch
import autokernel_kernels as kernels
spec = importlib.util.spec_from_file_location("gelu_mlp", sys.argv[1])
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
torch.manual_seed(0)
model = example.Model(*example.get_init_inputs()).eval()
x = torch.randn(1, 16, 64)
with torch.no_grad():
    eager = model(x)
    with kernels.patch(model) as router:
        patched = model(x)
print(json.dumps({"err": (patched - eager).abs().max().item(), "tally": router.tally.to_json()["per_kernel"],
                  "selftest": kernels.selftest("cpu")}))
"""


def start_run(tmp_path, agent, **options):
    from autokernel.search import start as run_start
    from autokernel.profile.modelfile import spec_from_options
    opts = run_start.OptimizeOptions(agent=agent, llm=MODEL, top=1, only=["module[MLP.act"], **options)
    return run_start.start(spec_from_options(EXAMPLES / "gelu_mlp.py", device="cpu"), opts, tmp_path / "runs")


def test_gelu_module_target_searched_judged_and_served(tmp_path, fake_openai, monkeypatch):  # noqa: F811
    from autokernel.search import run_search
    from autokernel.deploy.verify import verify
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    fake_openai.script(reply(kernel_reply(TORCH_TANH_GELU, "tanh GELU in PyTorch ops.")),
                       reply(kernel_reply(TRITON_GELU, "tanh GELU as one Triton pass.")))
    run, state, config = start_run(tmp_path, "llm", base_url=fake_openai.base_url, max_experiments=2)
    plan = json.loads(run.plan_path.read_text())
    row = next(e for e in plan["entries"] if e["target"] == GELU)
    assert row["kernel_type"] == "module" and row["module"]["qualname"] == "mlps.0.act" and row["share"] > 0.05
    assert plan["coverage"] >= 0.95
    (target,) = state.targets
    assert target.name == GELU and (run.path / "problems" / f"{target.slug}.py").is_file()

    state = run_search.execute(run, state, config)
    first, second = target.history
    assert (first["verdict"], first["failed_stage"]) == ("FAIL", "integrity")
    assert "no custom Triton or CUDA kernel was launched" in first["message"]
    assert (second["verdict"], second["decision"]) == ("PASS", "KEEP") and target.best_experiment == 1
    verdict = json.loads(run.experiment_file(target, 1, ".json").read_text())
    assert len(verdict["trials"]) == 5 and all(t["passed"] for t in verdict["trials"])
    # the prompt carries the module's source, its call's shapes and dtypes, and its share
    prompt = fake_openai.prompts()[0]
    assert "class TanhGELU(nn.Module)" in prompt and "[1, 16, 256] float32" in prompt
    assert f"{target.share:.1%} of the model's time" in prompt and "## Playbook" in prompt

    result = verify(run.path)
    served = result["per_kernel"][GELU]
    assert result["outputs_match"] and served["calls_served"] == 2 * len(result["per_seed"])  # two MLPs, each seed
    # a module winner serves its problem's own call: at the workload's other shapes each MLP falls back, counted
    assert served["fallbacks"] == 2 * (len(result["workload"]["sets"]) - 1) and result["status"] == "ok"
    assert all(why.startswith("shape [") and "not the problem's" in why for why in served["fallback_reasons"])

    # the exported package serves it too, in a fresh process with only torch and triton
    from autokernel.deploy.export import export
    export(run.path, tmp_path / "exported")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"PYTHONPATH": str(tmp_path / "exported"), "TRITON_INTERPRET": "1"})
    proc = subprocess.run([sys.executable, "-c", USE_PACKAGE, str(EXAMPLES / "gelu_mlp.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    used = json.loads(proc.stdout.strip().splitlines()[-1])
    assert used["tally"][GELU]["calls_served"] == 2 and used["err"] < 1e-5 and used["selftest"] == {}


def test_the_tuner_skips_module_targets_and_says_so(tmp_path):
    from autokernel.search import run_search
    from autokernel.search.module_search import TUNER_SKIP
    run, state, config = start_run(tmp_path, "tune")
    state = run_search.execute(run, state, config)
    (target,) = state.targets
    assert target.status == "done" and target.stop_reason == TUNER_SKIP and not target.history


def test_a_module_winner_falls_back_on_a_call_unlike_its_problem():
    import torch
    from autokernel.deploy import routing
    from autokernel.deploy.routing.modules import KERNEL_TYPE
    namespace: dict = {}
    exec(compile(TORCH_TANH_GELU, "gelu.py", "exec"), namespace)  # serving does not judge: any ModelNew
    call = {"args": [{"tensor": {"shape": [4, 8], "dtype": "float32"}}], "kwargs": {}}
    model = torch.nn.Sequential(torch.nn.GELU(approximate="tanh"))
    winner = routing.Winner(target="module[Sequential.0:4x8:float32]", kernel_type=KERNEL_TYPE, dims={},
                            dtype="float32", kernel_fn=namespace["ModelNew"], kwargs={"call": call, "modules": ["0"]})
    router = routing.Router([winner])
    x = torch.randn(4, 8)
    with router.patched(model), torch.no_grad():
        served = model(x)
        other = model(torch.randn(2, 8))
    assert torch.allclose(served, torch.nn.functional.gelu(x, approximate="tanh"), atol=1e-6)
    tally = router.tally.to_json()["per_kernel"][winner.target]
    assert tally["calls_served"] == 1 and tally["fallbacks"] == 1 and other.shape == (2, 8)
    assert "forward" not in vars(model[0])  # put back on exit


@pytest.mark.slow
def test_optimize_on_the_gpt2_example_ends_with_a_verified_module_winner(tmp_path, fake_openai):  # noqa: F811
    fake_openai.script(reply(kernel_reply(TRITON_GELU, "tanh GELU as one Triton pass.")))
    env = {**os.environ, "OPENAI_API_KEY": API_KEY, "PYTHONPATH": str(ROOT)}
    # 32 tokens, not the example's 128: the flow is the same, the interpreter's work a quarter
    done = subprocess.run([sys.executable, "-m", "autokernel", "optimize", str(EXAMPLES / "gpt2_tiny.py"),
                           "--class-name", "GPT2Tiny", "--input-dtype", "tokens", "--vocab-size", "2048",
                           "--input-shape", "1,32", "--agent", "llm", "--llm", MODEL, "--base-url", fake_openai.base_url,
                           "--only", "module[MLP.gelu", "--top", "1", "--max-experiments", "1", "--plain",
                           "--runs-dir", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = [p for p in tmp_path.iterdir() if (p / "verify.json").is_file()]
    verified = json.loads((run / "verify.json").read_text())
    kernel = verified["per_kernel"]["module[MLP.gelu:1x32x1536:float32]"]
    assert verified["status"] == "ok" and verified["outputs_match"] and kernel["calls_served"] > 0


def test_a_module_winner_gets_the_instance_weights_in_the_model_dtype():
    import torch
    from autokernel.deploy import routing
    from autokernel.deploy.routing.modules import KERNEL_TYPE

    class ModelNew(torch.nn.Module):  # the module's parameter names: the judge copied its weights by them
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(x) * 2

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(x) * 2

    torch.manual_seed(0)
    model = torch.nn.Sequential(Block()).to(torch.bfloat16)
    call = {"args": [{"tensor": {"shape": [3, 8], "dtype": "bfloat16"}}], "kwargs": {}}
    winner = routing.Winner(target="module[Sequential.0:3x8:bfloat16]", kernel_type=KERNEL_TYPE, dims={},
                            dtype="bfloat16", kernel_fn=ModelNew, kwargs={"call": call, "modules": ["0"]})
    x = torch.randn(3, 8).to(torch.bfloat16)
    with torch.no_grad():
        eager = model(x)
        router = routing.Router([winner])
        with router.patched(model):
            served = model(x)
    assert served.dtype == torch.bfloat16 and torch.equal(served, eager)
    assert router.tally.to_json()["per_kernel"][winner.target]["calls_served"] == 1


def test_the_prompt_offers_an_expert_loop_as_one_grouped_gemm(tmp_path):
    """A module target whose products ran on rows the data chose: the brief says how its work was
    counted and asks for one grouped GEMM over all experts, with the M each weight shape ran at."""
    from autokernel.search.module_search import _problem_brief, module_state
    entry = {"kernel_type": "module", "target": "module[Moe.experts:128x256:float32]", "dtype": "float32",
             "share": 0.7, "calls": 2, "modules": [{"name": "layers.0.mlp.experts", "class": "Experts"}],
             "module": {"qualname": "layers.0.mlp.experts", "class": "Experts", "label": "Moe.experts"},
             "work_note": "per call: 201.3 MFLOP in products (aten::linear[K=256,N=1024], aten::linear[K=512,N=256])",
             "data_dependent": "aten::nonzero",
             "matmuls": [{"op": "aten::linear[K=256,N=1024]", "M": [97, 56, 44, 59]},
                         {"op": "aten::linear[K=512,N=256]", "M": [97, 56, 44, 59]}]}
    target = module_state(entry, entry["target"])
    problem = tmp_path / "experts.py"
    problem.with_suffix(".json").write_text(json.dumps({"call": {"args": [], "kwargs": {}}, "names": ["w"]}))
    brief = _problem_brief(problem, target, "class Experts(nn.Module): ...")
    assert "201.3 MFLOP in products" in brief and "one grouped GEMM over all groups" in brief
    assert "aten::linear[K=256,N=1024]: M = [97, 56, 44, 59]" in brief and "after aten::nonzero" in brief.lower()
    # a module without a data-dependent loop is not told to group anything
    plain = module_state({**entry, "data_dependent": None}, entry["target"])
    assert "grouped GEMM" not in _problem_brief(problem, plain, "class Experts(nn.Module): ...")
