"""Code for a fresh interpreter that must run an export as a user without autokernel would."""

# Prepended to a `python -c` script: from here on, importing autokernel or starter_kernels fails, and
# harness only comes from a package's vendor/ folder, so whatever runs must come from the exported
# folder itself (or site-packages).
NO_PROJECT_CODE = r'''
import importlib.abc, importlib.machinery, sys


class NoProjectCode(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("autokernel", "starter_kernels"):
            raise ImportError(f"{name} is not available to an export: it must carry all it needs")
        if name.split(".")[0] == "harness":  # only the judge's files the package carries (vendor/)
            found = importlib.machinery.PathFinder.find_spec(
                name, [p for p in sys.path if p.endswith("vendor")] if path is None else path)
            if found is None or "vendor" not in str(found.origin):
                raise ImportError(f"{name} is not available to an export: it must carry all it needs")
            return found
        return None


sys.meta_path.insert(0, NoProjectCode())
'''

# Then, for a script that binds an `export --format hf-kernels` repository onto a transformers LLaMA:
# Hugging Face's loader, and the model file (argv[2]) built as `model`, in eval mode; argv[1] is the
# repository, `repo`.
HF_LLAMA_REPOSITORY = NO_PROJECT_CODE + r'''
import importlib.util, json, sys
from pathlib import Path
import torch
from kernels import (LocalLayerRepository, Mode, get_local_kernel, kernelize, replace_kernel_forward_from_hub,
                     use_kernel_forward_from_hub, use_kernel_mapping)
from transformers.models.llama import modeling_llama

repo, model_file = Path(sys.argv[1]), sys.argv[2]
spec = importlib.util.spec_from_file_location("hf_llama", model_file)
hf_llama = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hf_llama)
torch.manual_seed(0)
model = hf_llama.Model().eval()


def kernel_aware(obj):
    return hasattr(obj if isinstance(obj, type) else type(obj), "kernel_layer_name")


def mark_rotary_as_transformers_would(model):
    """With kernels >= 0.18.2 transformers marks apply_rotary_pos_emb as the "rotary_pos_emb"
    function layer of each attention module; with an older kernels, the same is done here."""
    if kernel_aware(modeling_llama.apply_rotary_pos_emb):
        return
    rotary = use_kernel_forward_from_hub("rotary_pos_emb")(modeling_llama.apply_rotary_pos_emb)
    modeling_llama.apply_rotary_pos_emb = rotary
    for m in model.modules():
        if isinstance(m, modeling_llama.LlamaAttention):
            m.__dict__.setdefault("_kernel_funcs", {})["apply_rotary_pos_emb"] = rotary
'''
