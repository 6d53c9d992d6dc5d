"""CUDA C++ winners in an export: the package carries the judge's launcher (vendor/harness/), builds
the winner's launch library with nvcc where it runs, and, in a process that cannot import
autokernel, says at load time what a CUDA winner needs where it cannot run, serving the rest."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autokernel.deploy import export as exporter
from autokernel.profile.modelfile import ModelSpec
from sealed_runs import write_run
from starter_kernels import starter_path
from paths import ROOT
from toolchain import needs_nvcc

LLAMA = ROOT / "examples" / "llama_tiny.py"
LLAMA_ARGS = [64, 32, 1, 2, 64]
NORMS = [{"name": n, "class": "RMSNorm"}
         for n in ("layers.0.input_layernorm", "layers.0.post_attention_layernorm", "norm")]
RMSNORM, ROTARY = "rmsnorm[8x32:float32]", "rotary_embedding[1x2x8x16:float32]"
# Run by a fresh interpreter as if autokernel were not installed: autokernel and starter_kernels
# cannot be imported, and `harness` only from the folders on sys.path (the package's vendor/ once it
# puts it there), never from this checkout or an installed autokernel.
USE_PACKAGE = r'''
import importlib.abc, importlib.machinery, importlib.util, json, sys, warnings
from pathlib import Path
import torch


class NoProjectCode(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("autokernel", "starter_kernels"):
            raise ImportError(f"{name} is not available to the exported package")
        if name.split(".")[0] == "harness":  # an installed autokernel's harness/ is not on the path searched
            vendor = [p for p in sys.path if p.endswith("vendor")] if path is None else path
            found = importlib.machinery.PathFinder.find_spec(name, vendor)
            if found is None or "vendor" not in str(found.origin):
                raise ModuleNotFoundError(f"{name} is not installed", name=name)
            return found
        return None


sys.meta_path.insert(0, NoProjectCode())
import autokernel_kernels as ak

device, llama = sys.argv[1], sys.argv[2]
result = {"kernels": {k["target"]: k["backend"] for k in ak.KERNELS}}
if device == "cpu":  # nvcc builds the launch library without a GPU; only calling it needs one
    built = ak.build_cuda("sm_90")
    from harness.cuda_launcher import exported  # the package's copy, as build_cuda found it
    result["built"] = {t: sorted(exported(Path(p))) for t, p in built.items()}
spec = importlib.util.spec_from_file_location("llama_tiny", llama)
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
torch.manual_seed(0)
model = example.LlamaTiny(64, 32, 1, 2, 64).eval().to(device)
tokens = torch.randint(0, 64, (1, 8), generator=torch.Generator().manual_seed(5)).to(device)
with torch.inference_mode(), warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    expected = model(tokens)
    with ak.patch(model) as router:
        out = model(tokens)
result.update(max_abs_err=(out - expected).abs().max().item(), warnings=[str(w.message) for w in caught],
              unavailable=ak.UNAVAILABLE, tally=router.tally.to_json()["per_kernel"],
              harness=sorted({str(Path(m.__file__).relative_to(Path(ak.__file__).parent))
                              for name, m in sys.modules.items() if name.split(".")[0] == "harness"}))
print(json.dumps(result))
'''


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A run whose rmsnorm winner is the CUDA C++ starter and whose rotary winner is Triton's, exported."""
    root = tmp_path_factory.mktemp("cuda-export")
    spec = ModelSpec(path=str(LLAMA), class_name="LlamaTiny", input_shape=[1, 8], input_dtype="tokens",
                     vocab_size=64, init_args=LLAMA_ARGS, device="cpu")
    run = write_run(root, spec, [
        (RMSNORM, "rmsnorm", {"M": 8, "N": 32}, {}, "module", NORMS, starter_path("rmsnorm", "cuda").read_text()),
        (ROTARY, "rotary_embedding", {"B": 1, "H": 2, "S": 8, "D": 16}, {}, "pattern",
         [{"name": "layers.0.self_attn", "class": "Attention"}], starter_path("rotary_embedding").read_text())])
    manifest = exporter.export(run.path, root / "out")
    return root / "out", manifest


def _use(out: Path, device: str, tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(out), AUTOKERNEL_CACHE_DIR=str(tmp_path / "cache"))  # a build of its own
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run([sys.executable, "-c", USE_PACKAGE, device, str(LLAMA)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_cuda_winner_is_exported_with_the_launcher_it_builds_with(exported):
    out, manifest = exported
    package = out / "autokernel_kernels"
    assert manifest["left_out"] == []
    assert {k["target"]: k["backend"] for k in manifest["kernels"]} == {RMSNORM: "cuda", ROTARY: "triton"}
    for name in ("cuda_launcher.py", "cuda_build.py"):
        assert (package / "vendor" / "harness" / name).read_text() == (ROOT / "harness" / name).read_text()


@needs_nvcc
def test_without_a_gpu_the_library_builds_and_the_winner_falls_back_saying_what_it_needs(exported, tmp_path):
    out, _ = exported
    used = _use(out, "cpu", tmp_path)
    assert "rmsnorm_launch" in used["built"][RMSNORM]  # nvcc built the library; calling it needs a GPU
    assert used["unavailable"] == {RMSNORM: "no CUDA GPU is visible"}
    (warning,) = [w for w in used["warnings"] if RMSNORM in w]
    assert "cannot run here: no CUDA GPU is visible" in warning and "needs a CUDA GPU, nvcc and nm" in warning
    assert used["max_abs_err"] < 1e-5
    assert RMSNORM not in used["tally"] and used["tally"][ROTARY]["calls_served"] == 2
    assert used["harness"] == ["vendor/harness/__init__.py", "vendor/harness/cuda_build.py",
                               "vendor/harness/cuda_launcher.py",
                               *(f"vendor/harness/isolation/{n}" for n in ("__init__.py", "cuda_surface.py",
                                                                          "kernel_surface.py", "purity.py",
                                                                          "static_check.py", "syntax.py",
                                                                          "tensor_flow.py"))]


@pytest.mark.gpu
def test_on_a_gpu_the_exported_cuda_winner_serves_the_model(exported, tmp_path):
    out, _ = exported
    used = _use(out, "cuda", tmp_path)
    assert used["unavailable"] == {} and used["max_abs_err"] < 1e-4
    assert used["tally"][RMSNORM]["calls_served"] == 3 and used["tally"][RMSNORM]["errors"] == []
    assert used["tally"][ROTARY]["calls_served"] == 2
