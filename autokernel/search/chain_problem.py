"""A generic chain (autokernel.profile.generic_chains) as a KernelBench problem: the module-style
target a chain of no registry type falls back to.

`Model` replays the chain's aten ops exactly as the model ran them (the plan row's `replay`:
each op's overload and its args as passed, the views between them included); it has no weights:
parameters and buffers the chain reads are inputs, drawn as the others are. `get_inputs()` draws
each input from its recorded shape, dtype and spread, as a module target's problem does. The judge
is the module targets' KernelBench judge, the search the LLM agent's (autokernel.search.module_search).
"""
from __future__ import annotations

import json
from pathlib import Path

from autokernel.profile.chain_replay import DECODE, source
from autokernel.search.module_problem import TEMPLATE as MODULE_TEMPLATE

# the module problems' input drawing, one definition for both kinds of problem
DRAW = MODULE_TEMPLATE[MODULE_TEMPLATE.index("def _draw(spec):"):MODULE_TEMPLATE.index("def get_inputs():")]


def write_problem(folder: Path, slug: str, replay: dict, title: str) -> Path:
    """runs/<id>/problems/<slug>.py, with <slug>.json (the call, for the prompt) and <slug>.source.py
    (the replay as Python lines, what the prompt shows as the reference)."""
    folder.mkdir(parents=True, exist_ok=True)
    text = (TEMPLATE.replace("@TITLE@", title.replace('"', "'")).replace("@REPLAY@", json.dumps(replay, indent=1))
            .replace("@DECODE@", DECODE.rstrip()).replace("@DRAW@", DRAW.strip()))
    path = folder / f"{slug}.py"
    path.write_text(text, encoding="utf-8")
    facts = {"call": {"args": [{"tensor": i["tensor"]} for i in replay["inputs"]], "kwargs": {}}, "names": []}
    path.with_suffix(".json").write_text(json.dumps(facts, indent=1), encoding="utf-8")
    path.with_suffix(".source.py").write_text(source(replay), encoding="utf-8")
    return path


TEMPLATE = '''"""@TITLE@

A KernelBench problem made from a chain of a profiled model's operators: Model replays the chain's
aten ops as the model ran them (REPLAY: each op's overload and arguments, tensors by slot);
get_inputs() draws the chain's inputs (parameters it reads among them) from their recorded shapes,
dtypes and spread.
"""
import json

import torch
import torch.nn as nn
import torch.utils._pytree

REPLAY = json.loads(r"""@REPLAY@""")


@DECODE@


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, *tensors):
        return run_replay(REPLAY, tensors)


@DRAW@


def get_inputs():
    return [_draw(i["tensor"]) for i in REPLAY["inputs"]]


def get_init_inputs():
    return []
'''
