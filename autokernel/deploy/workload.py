"""The inputs `verify` runs a model on: a workload, not one forward.

A model serves prompts of many lengths, batches of requests and decode steps; winners proven at
one shape must be seen serving (or falling back, with the reason) at the others. The workload is
the profiled inputs (three seeds: the headline figures) and then

- the model file's `get_workload()`, when it defines one and the inputs come from its
  `get_inputs()` (with --input-shape they are the user's, and so are their variations): a list of
  input sets, each a list of inputs as `get_inputs()` returns them, or `{"name": "decode",
  "inputs": [...]}`; it is called under a fixed seed, once per seed wanted;
- else the profiled inputs with their leading dims varied: for inputs with a sequence dim (token
  ids [B, S], activations [B, S, D]) the sequence halved plus an odd remainder, the batch doubled
  and one decode token (1x128 gives 1x67, 2x128 and 1x1); for inputs without one ([B, D]) the
  batch the same three ways. Every tensor input sharing the first input's leading dims changes
  with it; values come from the profiled inputs, extended with another seed's where a dim grows.

A set whose eager forward raises (a model that takes one shape only) is left out, with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from autokernel.errors import UserError
from harness.verdict.around import half_odd  # the judge's rule for the shapes around a target: the same lengths

SOURCE_FILE = "the model file's get_workload()"
SOURCE_DEFAULT = "the profiled inputs with the leading (batch, sequence) dims varied"
OTHER_SEEDS = (0,)  # a set other than the profiled one runs once: the interpreter is slow


@dataclass
class InputSet:
    name: str  # "1x128 (profiled)", "1x67", "decode"...
    make: Callable[[int], list] = field(repr=False)  # seed -> the inputs, placed on the model's device
    seeds: tuple[int, ...]
    profiled: bool = False


def input_sets(loaded: Any, seeds: tuple[int, ...]) -> tuple[list[InputSet], str, dict[str, str]]:
    """(the sets, where they came from, name -> why a set was left out)."""
    profiled = InputSet(_name(loaded.make_inputs(seeds[0])) + " (profiled)", loaded.make_inputs, tuple(seeds), True)
    get_workload = getattr(loaded.module, "get_workload", None)
    if callable(get_workload) and not loaded.spec.input_shape:
        sets, source = _from_file(loaded, get_workload), SOURCE_FILE
    else:
        sets, source = _varied(loaded), SOURCE_DEFAULT
    kept, skipped, names = [profiled], {}, {profiled.name.split(" ")[0]}
    for s in sets:
        if s.name in names:  # the profiled shapes again
            continue
        names.add(s.name)
        try:
            loaded.forward(s.make(s.seeds[0]))
        except UserError as e:
            skipped[s.name] = str(e).splitlines()[0]
            continue
        kept.append(s)
    return kept, source, skipped


# ---------------------------------------------------------------- the model file's own
def _from_file(loaded: Any, get_workload: Callable) -> list[InputSet]:
    import torch

    def items(seed: int) -> list:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            got = get_workload()
        if not isinstance(got, (list, tuple)) or not got:
            raise UserError(f"{loaded.spec.path}: get_workload() returned {type(got).__name__}, not a list of input sets",
                            "return a list like [[tokens_67], [tokens_1]] or [{'name': 'decode', 'inputs': [...]}]")
        return [_inputs_of(item, loaded) for item in got]
    first = items(OTHER_SEEDS[0])
    return [InputSet(name or _name(inputs), lambda seed, i=i: items(seed)[i][1], OTHER_SEEDS)
            for i, (name, inputs) in enumerate(first)]


def _inputs_of(item: Any, loaded: Any) -> tuple[str, list]:
    name = ""
    if isinstance(item, dict):
        name, item = str(item.get("name") or ""), item.get("inputs")
    if not isinstance(item, (list, tuple)):
        raise UserError(f"{loaded.spec.path}: an input set of get_workload() is {type(item).__name__}, not a list "
                        "of inputs", "give each set as a list, as get_inputs() returns it, or {'name': ..., 'inputs': [...]}")
    return name, [loaded._place(x) for x in item]


# ---------------------------------------------------------------- the profiled inputs, varied
def _varied(loaded: Any) -> list[InputSet]:
    first = leading(loaded.make_inputs(0))
    if first is None:
        return []
    x, sequence = first
    dims = list(x.shape[:2] if sequence else x.shape[:1])
    if sequence:
        b, s = dims
        shapes = [(b, half_odd(s)), (2 * b, s), (b, 1)]
    else:
        (b,) = dims
        shapes = [(half_odd(b),), (2 * b,), (1,)]
    return [InputSet("x".join(map(str, shape)), lambda seed, shape=shape: resized(loaded, seed, shape), OTHER_SEEDS)
            for shape in shapes if list(shape) != dims]


def leading(inputs: list) -> tuple[Any, bool] | None:
    """The first tensor input, and whether its dim 1 is a sequence: token ids [B, S], or an
    activation with three dims or more ([B, S, D])."""
    import torch
    x = next((t for t in inputs if isinstance(t, torch.Tensor) and t.dim() >= 1), None)
    if x is None:
        return None
    return x, x.dim() >= 3 or (x.dim() == 2 and not x.is_floating_point())


def resized(loaded: Any, seed: int, shape: tuple) -> list:
    """The profiled inputs of `seed` with their leading dims made `shape`: cut, or extended with
    the same input of further seeds."""
    import torch
    base = loaded.make_inputs(seed)
    x, _ = leading(base)
    lead = tuple(x.shape[:len(shape)])
    extra: list[list] = []

    def more(k: int) -> list:
        while len(extra) <= k:
            extra.append(loaded.make_inputs(seed + 1000 * (len(extra) + 1)))
        return extra[k]
    out = list(base)
    for i, t in enumerate(base):
        if isinstance(t, torch.Tensor) and tuple(t.shape[:len(lead)]) == lead:
            for dim, size in enumerate(shape):
                t = _resize(t, dim, size, lambda k, i=i: more(k)[i])
            out[i] = t
    return out


def _resize(t: Any, dim: int, size: int, more: Callable[[int], Any]) -> Any:
    import torch
    parts, k = [t], 0
    while sum(p.shape[dim] for p in parts) < size:
        other = more(k)
        for d in range(other.dim()):  # its other dims as t's (some already resized)
            if d != dim:
                other = _fit(other, d, t.shape[d])
        parts.append(other)
        k += 1
    return (torch.cat(parts, dim=dim) if len(parts) > 1 else t).narrow(dim, 0, size)


def _fit(t: Any, dim: int, size: int) -> Any:
    import torch
    if t.shape[dim] < size:
        t = torch.cat([t] * (-(-size // t.shape[dim])), dim=dim)
    return t.narrow(dim, 0, size)


def _name(inputs: list) -> str:
    """An input set's name: its first tensor's leading dims, 1x128."""
    first = leading(inputs)
    if first is None:
        return "inputs"
    x, sequence = first
    return "x".join(str(d) for d in (x.shape[:2] if sequence else x.shape[:1]))
