"""`autokernel export RUN --out DIR --format hf-kernels`: the winners as a Hugging Face kernel
repository, which the `kernels` library loads (`get_local_kernel`, `LocalLayerRepository`) and
`kernels.kernelize` binds onto a transformers model's kernel-aware layers.

    DIR/<name>/                   name: autokernel-<run id> (lowercase letters, digits and dashes)
      README.md                   how to load it: kernels.kernelize, transformers' KernelConfig, patch()
      manifest.json               the package's manifest, plus "layers" and "patch_only"
      build/torch-cuda/           one noarch build variant per backend it runs on: kernels picks the
        metadata.json               one of torch's backend (`torch-<backend>`, kernels >= 0.17)
        <python name>/            the autokernel_kernels package (export.py), plus layers.py
      build/torch-cpu/            the same package; on the CPU Triton runs in its interpreter
        metadata.json
        <python name>/

Noarch variants because the package is Python: Triton compiles where it runs, and a CUDA C++
winner's launch library is built by nvcc where it runs (the package's vendor/). The layers
(autokernel/deploy/kernel_layers.py) carry the winners of the types a transformers layer computes
(rmsnorm, fused_mlp, rotary_embedding, and the chains silu_mul and rotary_qk under the MLP's and
apply_rotary_pos_emb's names); every other winner stays with the package's `patch()`.
"""
from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from autokernel.deploy.export import Exported, collect, prepare, write_package
from autokernel.deploy.kernel_layers import LAYERS

VARIANTS = {"torch-cuda": "cuda", "torch-cpu": "cpu"}  # build variant -> metadata backend
LICENSE = "MIT"  # autokernel's, which its starters and the kernels searched from them carry


def repo_name(run_id: str) -> str:
    """A kernel name kernels accepts (^[a-z][-a-z0-9]*[a-z0-9]$): autokernel-<run id>."""
    return "autokernel-" + (re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-") or "run")


def export_repository(run_path: str | Path, out_dir: str | Path) -> dict:
    """Write the run's winners as DIR/autokernel-<run id>/ (records checked first, as export does)."""
    return write_repository(collect(run_path), Path(out_dir))


def write_repository(exported: Exported, out_dir: Path) -> dict:
    """Write the repository under out_dir; the manifest written, plus "repository" and "package"
    (the package folder of the variant for this machine's torch)."""
    name = repo_name(exported.run.run_id)
    python_name = name.replace("-", "_")
    repo = out_dir / name
    prepare(repo, repo / "manifest.json")
    layers, patch_only = layer_map(exported.manifest["kernels"])
    extra = {"name": name, "layers": layers, "patch_only": patch_only}
    digest = hashlib.sha256(json.dumps(exported.manifest, sort_keys=True).encode()).hexdigest()[:10]
    here = Path(__file__).resolve().parent
    for variant, backend in VARIANTS.items():
        package = repo / "build" / variant / python_name
        package.mkdir(parents=True)
        write_package(exported, package, extra)
        shutil.copyfile(here / "kernel_layers.py", package / "layers.py")
        metadata = {"id": f"{python_name}_{backend}_{digest}", "name": name, "version": 1, "license": LICENSE,
                    "backend": {"type": backend}, "python-depends": []}
        (repo / "build" / variant / "metadata.json").write_text(json.dumps(metadata, indent=1) + "\n",
                                                                encoding="utf-8")
    manifest = {**exported.manifest, **extra}
    (repo / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    (repo / "README.md").write_text(readme(repo, manifest), encoding="utf-8")
    return {**manifest, "repository": str(repo), "package": str(repo / "build" / local_variant() / python_name)}


def local_variant() -> str:
    """The build variant kernels picks for this machine's torch (a CUDA build: torch-cuda)."""
    import torch
    return "torch-cuda" if torch.version.cuda else "torch-cpu"


def layer_map(kernels: list[dict]) -> tuple[list[dict], list[str]]:
    """The layers that carry a winner ([{layer, layer_name, kernel_type, targets}]) and the targets
    no layer carries, which the package's patch() serves."""
    layers, carried = [], set()
    for layer, (types, layer_name) in LAYERS.items():
        targets = [k["target"] for k in kernels if k["kernel_type"] in types]
        if targets:
            served = [t for t in types if any(k["kernel_type"] == t for k in kernels)]
            layers.append({"layer": layer, "layer_name": layer_name, "kernel_type": served[0], "targets": targets})
            carried.update(targets)
    return layers, [k["target"] for k in kernels if k["target"] not in carried]


def readme(repo: Path, manifest: dict) -> str:
    """The repository's README: what it holds and how to load it, with this repository's names."""
    rows = "\n".join(f"| `{x['layer']}` | `\"{x['layer_name']}\"` | {', '.join(f'`{t}`' for t in x['targets'])} |"
                     for x in manifest["layers"]) or "| (none) | | |"
    others = ", ".join(f"`{t}`" for t in manifest["patch_only"]) or "none"
    mapping = ",\n".join(f'    "{x["layer_name"]}": {{"cpu": LocalLayerRepository(repo, layer_name="{x["layer"]}"),\n'
                         f'                  "cuda": LocalLayerRepository(repo, layer_name="{x["layer"]}")}}'
                         for x in manifest["layers"])
    config = ", ".join(f'"{x["layer_name"]}": "{repo}:{x["layer"]}"' for x in manifest["layers"])
    return f"""# {manifest['name']}

Kernels found and judged by autokernel (run {manifest['run_id']}), as a Hugging Face kernel
repository. Layers (`layers.py`) and the transformers layer names they map onto:

| layer | layer name | kernels |
|---|---|---|
{rows}

Winners no transformers layer computes stay with the package's `patch(model)`: {others}.

```python
from pathlib import Path
from kernels import LocalLayerRepository, Mode, kernelize, replace_kernel_forward_from_hub, use_kernel_mapping
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

repo = Path("{repo}")
# transformers marks LlamaRMSNorm "RMSNorm" itself when it supports the installed kernels; harmless then
replace_kernel_forward_from_hub(LlamaRMSNorm, "RMSNorm")
replace_kernel_forward_from_hub(LlamaMLP, "SwiGLUMLP")  # transformers does not mark its MLPs
with use_kernel_mapping({{
{mapping}
}}):
    model = kernelize(model, mode=Mode.INFERENCE, device="cpu")  # or "cuda"
```

With a transformers that supports the installed kernels (5.25 with kernels 0.19), on a GPU:
`AutoModelForCausalLM.from_pretrained(..., use_kernels=True, kernel_config=KernelConfig({{{config}}}, use_local_kernel=True))`.

`kernels.get_local_kernel(repo)` imports the package: `patch(model)` binds every winner
(`patch(model, targets=module.PATCH_ONLY)` only those no layer carries), `layers.tally()` counts
what the layers served and why the rest fell back, `UNAVAILABLE` names the kernels that cannot run
here (a CUDA C++ kernel needs a CUDA GPU, nvcc and nm). On a CPU set TRITON_INTERPRET=1 first.
{training(manifest)}
"""


def training(manifest: dict) -> str:
    """The README's word on training: which layers have a backward (their `has_backward`)."""
    trained = [x["layer"] for x in manifest["layers"]
               if any(k["target"] in x["targets"] and k.get("backward") for k in manifest["kernels"])]
    if not trained:
        return "No kernel here has a judged backward: run the model under `torch.inference_mode()`."
    return (f"Layers with a judged backward (`has_backward = True`, so `Mode.TRAINING` binds them): "
            f"{', '.join(f'`{t}`' for t in trained)}; under autograd a forward-only kernel's calls fall back.")
