"""A module target as a KernelBench problem, made from the model itself.

`Model` is the module instance rebuilt without pickle: its class (imported, or loaded from the
model's own file), its plain attributes and its submodules as recorded, and every parameter and
buffer copied from the instance into a weights file next to the problem (torch.save of plain
tensors, read back with weights_only and checked against its SHA-256, so the problem file's hash,
which keys the judge's reference cache, covers the weights too). `Model` subclasses the module's
class, so its parameter names are the module's own and a ModelNew that keeps them gets the weights.

`get_inputs()` draws what the module was called with in the profiled forward: each tensor of the
recorded shape and dtype, floats from a normal distribution of the recorded mean and spread, ints
from the recorded range, and constants as they were; the judge seeds it for each trial.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import inspect
import json
from pathlib import Path
from typing import Any

import torch

from autokernel.errors import UserError

_PLAIN = (bool, int, float, str, type(None))


class UnsupportedModule(UserError):
    """The module cannot be rebuilt outside the model (an attribute that is not plain data)."""


def _plain(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return isinstance(value, _PLAIN) or isinstance(value, torch.dtype)


def _encode(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    if isinstance(value, tuple):
        return {"tuple": [_encode(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


def class_ref(cls: type) -> dict:
    """Where a class is found again in another process: by import, or from its source file."""
    name = cls.__module__
    # on sys.path, not merely in sys.modules: a model file loaded by path is not importable by name
    found = importlib.machinery.PathFinder.find_spec(name.split(".")[0]) is not None
    source = inspect.getsourcefile(cls) if not found else None
    if not found and not source:
        raise UnsupportedModule(f"the class {cls.__qualname__} can be neither imported nor read from a file")
    return {"module": name, "qualname": cls.__qualname__, "file": str(Path(source).resolve()) if source else None}


def module_tree(module: torch.nn.Module, path: str = "") -> dict:
    """A module as data: its class, plain attributes, parameters, buffers and submodules."""
    internals = set(torch.nn.Module().__dict__) - {"training"}
    attrs = {}
    for key, value in vars(module).items():
        if key in internals:
            continue
        if not _plain(value):
            raise UnsupportedModule(f"{path or 'the module'}.{key} is a {type(value).__name__}, not plain data: "
                                    "the module cannot be rebuilt on its own")
        attrs[key] = _encode(value)
    return {"class": class_ref(type(module)), "attrs": attrs,
            # a None entry (nn.Linear without bias) is kept: forward reads it
            "parameters": {n: None if p is None else [list(p.shape), str(p.dtype).replace("torch.", "")]
                           for n, p in module._parameters.items()},
            "buffers": {n: None if b is None else [list(b.shape), str(b.dtype).replace("torch.", ""),
                                                   n not in module._non_persistent_buffers_set]
                        for n, b in module._buffers.items()},
            "children": {n: module_tree(c, f"{path}.{n}" if path else n) for n, c in module._modules.items()
                         if c is not None}}


def weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer (non-persistent ones too: GPT-2's causal mask), on the CPU."""
    named = dict(module.named_parameters())
    named.update(dict(module.named_buffers()))
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in named.items()}


def write_problem(folder: Path, slug: str, module: torch.nn.Module, inputs: dict, title: str) -> Path:
    """runs/<id>/problems/<slug>.py and <slug>.pt: the KernelBench problem of one module target."""
    for spec in list(inputs.get("args", [])) + list(inputs.get("kwargs", {}).values()):
        if "unsupported" in spec:
            raise UnsupportedModule(f"the module is called with a {spec['unsupported']}, which get_inputs() "
                                    "cannot draw")
    tree = module_tree(module)
    folder.mkdir(parents=True, exist_ok=True)
    weights_path = folder / f"{slug}.pt"
    torch.save(weights(module), weights_path)
    digest = hashlib.sha256(weights_path.read_bytes()).hexdigest()
    call = {"args": inputs.get("args", []), "kwargs": inputs.get("kwargs", {})}
    text = (TEMPLATE.replace("@TITLE@", title.replace('"', "'"))
            .replace("@TREE@", json.dumps(tree, indent=1)).replace("@CALL@", json.dumps(call, indent=1))
            .replace("@WEIGHTS@", weights_path.name).replace("@SHA@", digest))
    path = folder / f"{slug}.py"
    path.write_text(text, encoding="utf-8")
    # what the prompt tells the agent: the call and the names the judge copies weights by
    facts = {"call": call, "names": sorted(weights_names(module))}
    path.with_suffix(".json").write_text(json.dumps(facts, indent=1), encoding="utf-8")
    return path


def weights_names(module: torch.nn.Module) -> list[str]:
    return [n for n, _ in module.named_parameters()] + [n for n, _ in module.named_buffers()]


TEMPLATE = '''"""@TITLE@

A KernelBench problem made from one module of a profiled model: Model is that module instance,
rebuilt from its class, attributes and weights (@WEIGHTS@, checked by SHA-256); get_inputs() draws
what the module was called with in the profiled forward.
"""
import hashlib
import importlib
import importlib.machinery
import json
import sys
from pathlib import Path

import torch
import torch.nn as nn

TREE = json.loads(r"""@TREE@""")
CALL = json.loads(r"""@CALL@""")
WEIGHTS = Path(__file__).with_name("@WEIGHTS@")
WEIGHTS_SHA256 = "@SHA@"


def _class(ref):
    if ref["file"] is None:
        owner = importlib.import_module(ref["module"])
    else:
        name = "ak_model_source_" + hashlib.sha256(ref["file"].encode()).hexdigest()[:12]
        owner = sys.modules.get(name)
        if owner is None:
            spec = importlib.util.spec_from_file_location(name, ref["file"])
            owner = importlib.util.module_from_spec(spec)
            sys.modules[name] = owner
            spec.loader.exec_module(owner)
    for part in ref["qualname"].split("."):
        owner = getattr(owner, part)
    return owner


def _decode(value):
    if isinstance(value, dict) and "dtype" in value:
        return getattr(torch, value["dtype"])
    if isinstance(value, dict) and "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _fill(module, node):
    for key, value in node["attrs"].items():
        object.__setattr__(module, key, _decode(value))
    for name, p in node["parameters"].items():
        module.register_parameter(name, None if p is None else nn.Parameter(torch.empty(p[0], dtype=getattr(torch, p[1]))))
    for name, b in node["buffers"].items():
        if b is None:
            module.register_buffer(name, None)
        else:
            module.register_buffer(name, torch.empty(b[0], dtype=getattr(torch, b[1])), persistent=b[2])
    for name, child in node["children"].items():
        cls = _class(child["class"])
        sub = cls.__new__(cls)
        nn.Module.__init__(sub)
        _fill(sub, child)
        module.add_module(name, sub)


def _load_weights(module):
    data = WEIGHTS.read_bytes()
    if hashlib.sha256(data).hexdigest() != WEIGHTS_SHA256:
        raise RuntimeError(f"{WEIGHTS} is not the weights this problem was made with")
    state = torch.load(WEIGHTS, weights_only=True)
    with torch.no_grad():
        for name, tensor in state.items():
            owner, _, leaf = name.rpartition(".")
            getattr(module.get_submodule(owner), leaf).copy_(tensor)


class Model(_class(TREE["class"])):
    def __init__(self):
        nn.Module.__init__(self)
        _fill(self, TREE)
        _load_weights(self)

    def forward(self, *tensors):
        tensors = iter(tensors)
        args = [next(tensors) if "tensor" in a else _decode(a["const"]) for a in CALL["args"]]
        kwargs = {k: next(tensors) if "tensor" in a else _decode(a["const"]) for k, a in CALL["kwargs"].items()}
        return super().forward(*args, **kwargs)


def _draw(spec):
    shape, dtype = spec["shape"], getattr(torch, spec["dtype"])
    kind = spec.get("kind")
    if kind == "float":
        return (torch.randn(shape) * spec["std"] + spec["mean"]).to(dtype)
    if kind == "int":
        return torch.randint(spec["low"], spec["high"] + 1, shape, dtype=dtype)
    if kind == "bool":
        return torch.randint(0, 2, shape).bool()
    if kind == "complex":
        return torch.randn(shape, dtype=dtype)
    return torch.zeros(shape, dtype=dtype)


def get_inputs():
    specs = CALL["args"] + list(CALL["kwargs"].values())
    return [_draw(s["tensor"]) for s in specs if "tensor" in s]


def get_init_inputs():
    return []
'''
