"""`autokernel export --format hf-kernels`: a Hugging Face kernel repository that the `kernels`
library loads and `kernels.kernelize` binds onto a transformers LLaMA built from a config, in a
fresh process that cannot import autokernel; its layers serve calls through the package's router,
at the profiled sequence length and at another, with the unpatched model's outputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autokernel.cli import app
from autokernel.profile.modelfile import ModelSpec
from sealed_runs import write_run
from fresh_process import HF_LLAMA_REPOSITORY, NO_PROJECT_CODE
from paths import DATA, ROOT

kernels = pytest.importorskip("kernels")
pytest.importorskip("transformers")

HF_LLAMA = DATA / "hf_llama.py"
LAYERS = [f"llama.model.layers.{i}" for i in (0, 1)]
NORMS = [{"name": f"{layer}.{n}", "class": "LlamaRMSNorm"} for layer in LAYERS
         for n in ("input_layernorm", "post_attention_layernorm")]
NORMS.append({"name": "llama.model.norm", "class": "LlamaRMSNorm"})
ATTENTION = [{"name": f"{layer}.self_attn", "class": "LlamaAttention"} for layer in LAYERS]
# the HF LLaMA's targets at its profiled input (1 x 16 tokens), as `autokernel profile` names them
TARGETS = [
    ("fused_mlp[16x64x128:float32]", "fused_mlp", {"M": 16, "D": 64, "F": 128}, {}, "module",
     [{"name": f"{layer}.mlp", "class": "LlamaMLP"} for layer in LAYERS]),
    ("rmsnorm[16x64:float32]", "rmsnorm", {"M": 16, "N": 64}, {}, "module", NORMS),
    ("matmul[16x64x64:float32]", "matmul", {"M": 16, "K": 64, "N": 64}, {}, "op",
     [{"name": f"{a['name']}.{p}_proj", "class": "Linear"} for a in ATTENTION for p in "qkvo"]),
    ("rotary_embedding[1x2x16x32:float32]", "rotary_embedding", {"B": 1, "H": 2, "S": 16, "D": 32}, {}, "pattern",
     ATTENTION),
]
# Run by a fresh interpreter with only site-packages: autokernel, harness and starter_kernels cannot
# be imported, so the repository must carry all it needs.
USE_REPOSITORY = HF_LLAMA_REPOSITORY + r'''
tokens = {s: torch.randint(0, hf_llama.VOCAB, (1, s), generator=torch.Generator().manual_seed(s)) for s in (16, 9)}
with torch.inference_mode():
    expected = {s: model(x) for s, x in tokens.items()}

# With kernels >= 0.18.2, transformers marks its own layers: its RMSNorm is the kernel-aware
# "RMSNorm" and apply_rotary_pos_emb the "rotary_pos_emb" function layer of each attention module.
# With an older kernels, that is done here as transformers would. Its MLP has no layer name in any
# version: registering one is the user's step.
marked_by_transformers = kernel_aware(modeling_llama.LlamaRMSNorm) and kernel_aware(modeling_llama.apply_rotary_pos_emb)
if not marked_by_transformers:
    replace_kernel_forward_from_hub(modeling_llama.LlamaRMSNorm, "RMSNorm")
    mark_rotary_as_transformers_would(model)
replace_kernel_forward_from_hub(modeling_llama.LlamaMLP, "SwiGLUMLP")

layer_names = {"RMSNorm": "RMSNorm", "SwiGLUMLP": "SwiGLUMLP", "rotary_pos_emb": "RotaryPosEmb"}
with use_kernel_mapping({name: {"cpu": LocalLayerRepository(repo, layer_name=layer)}
                         for name, layer in layer_names.items()}):
    model = kernelize(model, mode=Mode.INFERENCE, device="cpu")
package = get_local_kernel(repo)
aware = [m for module in model.modules() for m in (module, *getattr(module, "_kernel_funcs", {}).values())]
result = {"package": package.__name__, "patch_only": package.PATCH_ONLY, "marked_by_transformers": marked_by_transformers,
          # the kernel-aware layers whose forward is now one of the repository's layers (transformers
          # marks more, e.g. its SiLU activation, which keeps its own forward with no mapping for it)
          "bound": sorted({type(m).__name__ + ":" + m.forward.__qualname__ for m in aware
                           if kernel_aware(m) and m.forward.__qualname__.split(".")[0] in layer_names.values()}),
          "errors": {}, "tallies": {}}
with torch.inference_mode(), package.patch(model, targets=package.PATCH_ONLY) as router:
    for s, x in tokens.items():
        result["errors"][s] = (model(x) - expected[s]).abs().max().item()
        result["tallies"][s] = {"layers": package.layers.tally(), "patch": router.tally.to_json()}


# The layers decide by the router's serving check, not by one of their own: a decision that
# refuses every call refuses the layers' calls, which then run transformers' own forward.
def refused(self, request):
    winner, why = decide(self, request)
    return winner, why or "refused by this test's decision"


decide = package.routing.Router.decide
package.routing.Router.decide = refused
with torch.inference_mode():
    result["errors"]["refused"] = (model(tokens[16]) - expected[16]).abs().max().item()
result["tallies"]["refused"] = {"layers": package.layers.tally()}
# the project's code the repository ran: none but the static check it carries in its vendor/ folder
result["modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("autokernel", "harness", "starter_kernels")
                           and "vendor" not in str(getattr(sys.modules[m], "__file__", None) or "vendor"))
result["vendored"] = sorted(m for m in sys.modules if m.split(".")[0] == "harness")
print(json.dumps(result))
'''


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """The starters at the HF LLaMA's targets, exported as a kernel repository (with the selftest)."""
    root = tmp_path_factory.mktemp("hf")
    from starter_kernels import starter_path
    run = write_run(root, ModelSpec(path=str(HF_LLAMA), device="cpu"),
                    [(*t, starter_path(t[1]).read_text()) for t in TARGETS])
    result = CliRunner().invoke(app, ["export", str(run.path), "--out", str(root / "out"), "--format", "hf-kernels",
                                      "--selftest"])
    assert result.exit_code == 0, result.output
    (repo,) = (root / "out").iterdir()
    return repo, result.output


def test_the_repository_has_the_layout_kernels_loads(repository):
    repo, output = repository
    assert repo.name.startswith("autokernel-") and "selftest (sandbox:" in output
    manifest = json.loads((repo / "manifest.json").read_text())
    assert {x["layer"]: x["layer_name"] for x in manifest["layers"]} == {
        "RMSNorm": "RMSNorm", "SwiGLUMLP": "SwiGLUMLP", "RotaryPosEmb": "rotary_pos_emb"}
    assert manifest["patch_only"] == ["matmul[16x64x64:float32]"]
    for variant, backend in (("torch-cpu", "cpu"), ("torch-cuda", "cuda")):
        metadata = kernels.Metadata.read_from_file(repo / "build" / variant / "metadata.json")
        assert str(metadata.name) == repo.name and metadata.license == "MIT"
        assert str(metadata.backend.backend_type) == backend and metadata.python_depends == []
        package = repo / "build" / variant / metadata.name.python_name
        assert (package / "layers.py").read_text() == (ROOT / "autokernel" / "deploy" / "kernel_layers.py").read_text()
        router = package / "routing" / "router.py"
        assert router.read_text() == (ROOT / "autokernel" / "deploy" / "routing" / "router.py").read_text()
    assert "kernelize(model, mode=Mode.INFERENCE" in (repo / "README.md").read_text()


def test_kernelize_binds_the_layers_onto_a_transformers_llama_that_then_matches_at_two_lengths(repository, tmp_path):
    repo, _ = repository
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TRITON_INTERPRET="1", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", USE_REPOSITORY, str(repo), str(HF_LLAMA)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    used = json.loads(proc.stdout.strip().splitlines()[-1])
    assert used["modules"] == [] and used["patch_only"] == ["matmul[16x64x64:float32]"]
    assert "harness.isolation.static_check" in used["vendored"]  # each winner was checked at load
    assert used["bound"] == ["Func:RotaryPosEmb.forward", "LlamaMLP:SwiGLUMLP.forward", "LlamaRMSNorm:RMSNorm.forward"]
    assert max(used["errors"].values()) < 1e-5, used["errors"]
    at_16, at_9 = used["tallies"]["16"], used["tallies"]["9"]
    layers = at_16["layers"]["per_kernel"]
    # the profiled length: every call served (5 norms, 2 MLPs, q and k of 2 attentions; 8 projections by patch())
    assert layers["rmsnorm[16x64:float32]"]["calls_served"] == 5
    assert layers["fused_mlp[16x64x128:float32]"]["calls_served"] == 2
    assert layers["rotary_embedding[1x2x16x32:float32]"]["calls_served"] == 4
    assert at_16["patch"]["per_kernel"]["matmul[16x64x64:float32]"]["calls_served"] == 8
    assert all(k["fallbacks"] == 0 and not k["errors"] for k in layers.values())
    # 9 tokens (the tally counts both lengths): these winners were judged at the profiled shape
    # alone, so their serving range is that shape; every call at 9 tokens runs transformers' own
    # forward, counted with the reason, and the outputs match either way
    for op, served, rows in (("LlamaRMSNorm.forward", 5, "rows 9: not proven (judged at rows 16)"),
                             ("LlamaMLP.forward", 2, "rows 9: not proven (judged at rows 16)")):
        counted = at_9["layers"]["per_op"][op]
        assert (counted["routed"], counted["fell_back"], counted["reasons"]) == (served, served, {rows: served}), op
    refused = used["tallies"]["refused"]["layers"]["per_kernel"]["rmsnorm[16x64:float32]"]
    assert refused["fallback_reasons"].get("refused by this test's decision") == 5


# transformers' own way in: a KernelConfig naming the repository's layers, validated against the
# model's kernel-aware layers and applied by transformers' kernelize. KernelConfig accepts GPU
# devices only, so on the CPU its mapping is built as for "cuda" and then keyed to the CPU; on a GPU
# set_use_kernels takes it as it is.
USE_KERNEL_CONFIG = NO_PROJECT_CODE + r'''
import importlib.util, json, sys
from pathlib import Path
import torch
from kernels import get_local_kernel
from transformers import KernelConfig
from transformers.integrations import hub_kernels
from transformers.utils import kernel_config as config_module

repo, model_file, device = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
spec = importlib.util.spec_from_file_location("hf_llama", model_file)
hf_llama = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hf_llama)
torch.manual_seed(0)
model = hf_llama.Model().eval().to(device)
tokens = torch.randint(0, hf_llama.VOCAB, (1, 16), generator=torch.Generator().manual_seed(16)).to(device)
with torch.inference_mode():
    expected = model(tokens)
config = KernelConfig({"RMSNorm": f"{repo}:RMSNorm", "rotary_pos_emb": f"{repo}:RotaryPosEmb"}, use_local_kernel=True)
if device == "cuda":
    model.llama.set_use_kernels(True, config)
else:
    config.sanitize_kernel_mapping(model.llama)
    real_device = config_module.infer_device
    config_module.infer_device = lambda m: "cuda"
    config.create_compatible_mapping(model.llama)
    config_module.infer_device = real_device
    config.kernel_mapping = {name: {"cpu": by_device["cuda"]} for name, by_device in config.kernel_mapping.items()}
    from kernels import Mode
    hub_kernels.kernelize(model.llama, mode=Mode.INFERENCE, kernel_config=config)
package = get_local_kernel(repo)
with torch.inference_mode():
    error = (model(tokens) - expected).abs().max().item()
served = {k: v["calls_served"] for k, v in package.layers.tally()["per_kernel"].items()}
print(json.dumps({"error": error, "served": served}))
'''


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_transformers_kernel_config_takes_the_repository(repository, tmp_path, device):
    if device == "cuda":
        torch = pytest.importorskip("torch")
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
    transformers_config = pytest.importorskip("transformers.utils.kernel_config")
    if not hasattr(transformers_config, "KernelConfig"):
        pytest.skip("this transformers has no KernelConfig")
    repo, _ = repository
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(TRITON_INTERPRET="1" if device == "cpu" else "0", HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-c", USE_KERNEL_CONFIG, str(repo), str(HF_LLAMA), device], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    used = json.loads(proc.stdout.strip().splitlines()[-1])
    # the five norms and the q and k rotations of two attentions ran the repository's kernels; the
    # MLPs did not: transformers names no MLP layer, so a KernelConfig cannot map one
    assert used["served"] == {"rmsnorm[16x64:float32]": 5, "rotary_embedding[1x2x16x32:float32]": 4,
                              "fused_mlp[16x64x128:float32]": 0}, used
    assert used["error"] < 1e-5, used


def test_an_unknown_format_is_a_usage_error_that_writes_nothing(repository, tmp_path):
    repo, _ = repository
    run = repo.parent.parent / "run"
    proc = subprocess.run([sys.executable, "-m", "autokernel", "export", str(run), "--out", str(tmp_path / "out"),
                           "--format", "wheel"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Error: unknown --format 'wheel'" in proc.stderr
    assert "hint: use one of: package, hf-kernels" in proc.stderr and not (tmp_path / "out").exists()
