"""Attributing a profile's op trees to targets, each op's time exactly once.

1. Inside each module, hand-written forms are recognised by the ops they run (a structural
   signature, not a class name): RMSNorm (pow, mean, rsqrt, mul), rotate-half rotary (neg, cat and
   the muls around them), a gate/up/SiLU/product/down MLP, explicit q·kᵀ → mask → softmax → ·v
   attention, and log_softmax followed by nll_loss. A form that is all a module does (apart from
   views and casts) is routed "module", so `verify` can swap that module; otherwise "pattern".
2. Every other op is rolled up to the highest op that maps to a kernel type through the
   registry's `aten_ops` (aten::linear with its t/addmm -> matmul), routed "op".
3. What maps to no type is `other`, with its ops, so the shares add up to 1; inside a module it is a
   module target (autokernel.profile.module_targets), charged the work its ops do (autokernel.profile.op_work).
   Everything a module runs after an op whose output shape the data decides (an expert loop over
   the tokens torch.where routed to each expert) is that module's own work: its shapes are one
   batch's routing, not a target another batch would repeat.

Each group's time is its fastest over the profiled iterations: on a busy machine another process
only ever adds time (a stalled thread pool), and taking each group's best keeps those stalls out of
the shares.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

import torch

from autokernel.errors import UserError
from autokernel.profile import module_targets, op_work
from autokernel.profile.forms import GLUE, Call, Node, find_forms, map_op, node_dtype
from autokernel.profile.records import Records, op_trees
from harness.kernel_types import registry

ROOT = "autokernel::forward"


def attribute(records: Records, modules: dict[str, torch.nn.Module], module_inputs: Optional[dict] = None,
              dtype: str = "float32") -> list[dict]:
    """The profile's groups from its records: one tree per profiled forward, attributed alike on
    every device (the ops from the CPU side, the time from the device's kernels on a GPU).
    `module_inputs` (module_targets.capture_inputs) names and sizes the module targets."""
    tallies = []
    for tree in op_trees(records, ROOT, _module_of):
        tallies.append(_Tally(modules, module_inputs, dtype, kernels_only=records.device != "cpu"))
        tallies[-1].scope(tree)
    return _summarise(tallies)


def _module_of(name: str) -> Optional[tuple[str, str]]:
    if not name.startswith("module::"):
        return None
    qual, cls = name[len("module::"):].rsplit("::", 1)
    return ("" if qual == "<root>" else qual, cls)


class _Tally:
    """Recognised calls and unmapped time of one iteration."""

    def __init__(self, modules: dict, inputs: Optional[dict] = None, dtype: str = "float32",
                 kernels_only: bool = False):
        self.modules = modules
        self.inputs = inputs or {}  # qualified name -> module_targets.capture_inputs's record
        self.dtype = dtype  # the model's: a module target's dtype when its inputs were not captured
        self.kernels_only = kernels_only  # own times are device kernel times (a GPU profile)
        self.calls: list[tuple[Call, tuple[str, str]]] = []
        self.other: dict[str, list[float]] = defaultdict(list)  # top-level op -> us of each call
        # unmapped time inside a module (not the whole model): one entry per module call
        self.unmapped: list[_Unmapped] = []

    def scope(self, scope: Node, patterns: bool = True) -> None:
        where = scope.module or ("", "")
        in_module = bool(where[0]) and patterns
        head, tail, cause = op_work.data_dependent_tail(scope.children) if in_module else (scope.children, [], None)
        found = find_forms(head, self.modules.get(where[0])) if patterns else []
        claimed = {id(n) for c in found for n in c.nodes}
        loose = [n for n in head if id(n) not in claimed]
        if scope.module and len(found) == 1 and not tail and all(n.kind in GLUE for n in loose):
            found[0].nodes, found[0].route, loose = list(scope.children), "module", []
        self.calls += [(c, where) for c in found]
        unmapped: list[Node] = list(tail)
        if scope.self_us and not in_module:
            self.other[f"({where[1] or 'model'}.forward)"].append(scope.self_us)
        for n in loose:
            if n.module:
                self.scope(n, patterns)
            elif call := map_op(n):
                self.calls.append((call, where))
            elif in_module:
                unmapped.append(n)
            else:
                # the highest op decides: the sum inside an aten::mean is the mean's, not a reduce
                self.other[n.name].append(n.total_us)
        if in_module and (unmapped or scope.self_us):
            self.unmapped.append(_Unmapped(where, unmapped, scope.self_us + sum(n.total_us for n in unmapped),
                                           scope.self_us, cause))


@dataclass
class _Unmapped:
    """One module call's own work: the ops no kernel type took, and all it ran after an op whose
    output shape the data decides (`cause`)."""

    where: tuple[str, str]  # (qualified name, class)
    nodes: list[Node]
    us: float
    own_us: float  # the module range's own time: on a GPU, kernels it launched outside any op
    cause: Optional[str] = None


def _summarise(tallies: list[_Tally]) -> list[dict]:
    n = max(len(tallies), 1)
    samples: dict[tuple, list[list[float]]] = defaultdict(lambda: [[] for _ in range(n)])
    info: dict[tuple, dict] = {}
    for i, tally in enumerate(tallies):
        for call, where in tally.calls:
            key = (call.kernel_type, str(call.shapes or call.args), call.dtype, call.causal, call.route)
            samples[key][i].append(sum(nd.total_us for nd in call.nodes))
            g = info.setdefault(key, {"call": call, "modules": {}, "ops": set(), "parts": []})
            g["modules"].setdefault(where[0], where[1])
            g["ops"] |= set().union(*(nd.op_names() for nd in call.nodes))
            if i == 0 and call.route != "op":
                g["parts"].extend(call.nodes)
        for label, times in tally.other.items():
            samples[("other", label)][i].extend(times)
        for u in tally.unmapped:
            key = _module_key(u.where[0], tally, u.nodes)
            samples[key][i].append(u.us)
            g = info.setdefault(key, {"qual": u.where[0], "class": u.where[1], "modules": {}, "ops": set(),
                                      "work": op_work.Work(), "weight_bytes": 0, "us": 0.0, "calls_seen": 0,
                                      "data_dependent": None})
            g["modules"].setdefault(*u.where)
            g["ops"] |= set().union(set(), *(nd.op_names() for nd in u.nodes))
            if i == 0:
                _charge(g, u, tally)
    best = {k: _best_us(v) / 1e3 for k, v in samples.items()}
    total_ms = sum(best.values()) or 1.0
    calls = {k: sum(len(s) for s in v) / n for k, v in samples.items()}
    groups = [_group(info[k], best[k], calls[k], total_ms, tallies[0].modules) for k in samples
              if k[0] not in ("other", module_targets.KERNEL_TYPE)]
    groups += [_module_group(k, info[k], best[k], calls[k], total_ms, tallies[0]) for k in samples
               if k[0] == module_targets.KERNEL_TYPE]
    others = sorted(((k[1], best[k], calls[k]) for k in samples if k[0] == "other"), key=lambda t: -t[1])
    if others:
        other_ms = sum(t[1] for t in others)
        groups.append({"kernel_type": "other", "op": others[0][0], "shapes": [], "dtype": "", "dims": {},
                       "target": None, "route": "", "calls": _count(sum(t[2] for t in others)),
                       "time_ms": other_ms, "share": other_ms / total_ms, "modules": [],
                       "ops": [t[0] for t in others],
                       "other_ops": [{"op": op, "time_ms": ms, "share": ms / total_ms, "calls": _count(c)}
                                     for op, ms, c in others]})
    groups.sort(key=lambda g: -g["time_ms"])
    return groups


def _module_key(qual: str, tally: _Tally, nodes: list[Node]) -> tuple:
    call = tally.inputs.get(qual)
    lbl = module_targets.label(qual, tally.modules)
    # without captured inputs (records attributed elsewhere) the module's float ops tell its dtype
    recorded = [d for d in map(node_dtype, nodes) if d in registry.DTYPES]
    dtype = module_targets.call_dtype(call, recorded[0] if recorded else tally.dtype)
    return (module_targets.KERNEL_TYPE, lbl, module_targets.signature(call), dtype)


def _charge(g: dict, u: _Unmapped, tally: _Tally) -> None:
    """Add one module call's work (of the first profiled forward) to its target's tally."""
    work = op_work.count(u.nodes, tally.kernels_only)
    if u.own_us > 0:  # only on a GPU: kernels launched in the module's forward by no op (Triton)
        work.uncounted[op_work.OWN_KERNELS.format(u.where[1])] += u.own_us
    g["work"].add(work)
    held = module_targets.held_weights(u.where[0], u.nodes, tally.modules)
    g["weight_bytes"] += module_targets.weight_bytes(work.operands, held)
    g["us"] += u.us
    g["calls_seen"] += 1
    g["data_dependent"] = g["data_dependent"] or u.cause


def _module_group(key: tuple, g: dict, time_ms: float, calls: float, total_ms: float, tally: _Tally) -> dict:
    """A module target: the unmapped time of one module class at one input signature, and its work
    per call: FLOPs counted op by op; bytes its inputs, its outputs and the weights it reads."""
    _, lbl, _, dtype = key
    call = tally.inputs.get(g["qual"])
    per_call = max(g["calls_seen"], 1)
    work: op_work.Work = g["work"]
    io = module_targets.call_bytes(call) if call is not None else None
    group = {"kernel_type": module_targets.KERNEL_TYPE, "op": f"{g['class']}.forward",
             "shapes": [v["tensor"]["shape"] for v in (call or {}).get("args", []) if "tensor" in v],
             "dtype": dtype, "dims": {}, "target": module_targets.target_name(lbl, call, dtype), "route": "module",
             "calls": _count(calls), "time_ms": time_ms, "share": time_ms / total_ms,
             "modules": [{"name": q, "class": c} for q, c in g["modules"].items()], "ops": sorted(g["ops"]),
             "module": {"qualname": g["qual"], "class": g["class"], "label": lbl, "inputs": call},
             "flops": work.flops / per_call, "bytes": (io + g["weight_bytes"] / per_call) if io is not None else 0,
             "work": "floor" if work.uncounted or io is None else "counted",
             "work_note": module_targets.work_note(work, per_call, io, g["weight_bytes"] / per_call,
                                                   sum(work.uncounted.values()) / (g["us"] or 1.0))}
    if work.matmuls:  # each product's M over the calls: a shape distribution where the data chose M
        group["matmuls"] = [{"op": k, "M": ms} for k, ms in sorted(work.matmuls.items())]
    if g["data_dependent"]:
        group["data_dependent"] = g["data_dependent"]
    return group


def _best_us(per_iter: list[list[float]]) -> float:
    """The time of one forward: each call at its fastest over the iterations. Another process on
    the machine only ever adds time (a stalled thread pool); the k-th call of every iteration is
    the same call of a model whose control flow does not depend on its data."""
    if len({len(s) for s in per_iter}) == 1:
        return sum(min(times) for times in zip(*per_iter))
    return min(sum(s) for s in per_iter)


def _count(calls: float) -> float | int:
    return int(calls) if float(calls).is_integer() else calls


def _group(g: dict, time_ms: float, calls: float, total_ms: float, modules: dict) -> dict:
    call: Call = g["call"]
    if not call.dtype:
        # a target named without its dtype would be judged and timed in a guessed one
        raise UserError(f"the profile recorded no dtype for {call.op} ({call.kernel_type}, shapes {call.shapes or call.args})",
                        "profile with record_shapes=True on a torch whose profiler records input dtypes")
    dims = dims_of(call.kernel_type, call.args)
    group = {"kernel_type": call.kernel_type, "op": call.op, "shapes": call.shapes or call.args,
             "dtype": call.dtype, "dims": dims, "target": registry.target_name(call.kernel_type, dims, call.dtype),
             "route": call.route, "calls": _count(calls), "time_ms": time_ms, "share": time_ms / total_ms,
             "modules": [{"name": q, "class": c} for q, c in g["modules"].items()], "ops": sorted(g["ops"])}
    if call.kernel_type == "flash_attention":
        group["causal"] = call.causal  # None: masked, but whether causally could not be told
    if g["parts"]:
        group["parts"] = _parts(g["parts"], modules, time_ms, total_ms)
    return group


def _parts(nodes: list[Node], modules: dict, group_ms: float, total_ms: float) -> list[dict]:
    """The op-level breakdown of a recognised form (from the first iteration, scaled to the
    group's time), e.g. the softmax inside an explicit attention: a smaller target for when
    the whole form cannot be swapped."""
    tally = _Tally(modules)
    tally.scope(Node("form", 0.0, children=nodes), patterns=False)
    sub = _summarise([tally])
    factor = group_ms / (sum(g["time_ms"] for g in sub) or 1.0)
    keep = ("kernel_type", "op", "shapes", "dtype", "dims", "target", "calls")
    return [{**{k: g[k] for k in keep}, "time_ms": g["time_ms"] * factor,
             "share": g["time_ms"] * factor / total_ms} for g in sub]


def dims_of(kernel_type: str, shapes: list[list[int]]) -> dict:
    """The registry's named dims for a call with these argument shapes (shape_of semantics)."""
    metas = [torch.empty(s, device="meta") if isinstance(s, list) else s for s in shapes]
    return {k: int(v) for k, v in registry.get(kernel_type).shape_of(*metas).items()}

