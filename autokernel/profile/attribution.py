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

A training step (autokernel.profile.training) runs the forward and the loss in TRAIN_ROOT, the
backward in BACKWARD and the optimizer in OPTIMIZER. Each backward node the autograd engine ran
(`autograd::engine::evaluate_function: MmBackward0`) carries the sequence number of the forward op
that recorded it, and its time joins whatever target that forward op's time went to: a target's
time is its forward's plus its backward's (`fwd_ms`, `bwd_ms`). Backward time whose forward op is
not in the profile (AccumulateGrad, which writes a parameter's .grad, and the loss's seed gradient)
is its own `other (backward)` row, so the shares still add up to 1. The optimizer step is timed
apart and is no target's.

Each group's time is its fastest over the profiled iterations: on a busy machine another process
only ever adds time (a stalled thread pool), and taking each group's best keeps those stalls out of
the shares.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from autokernel.errors import UserError
from autokernel.profile import module_targets, op_work
from autokernel.profile.forms import GLUE, Call, Node, find_forms, map_op, node_dtype
from autokernel.profile.records import Records, op_trees, windows
from harness.kernel_types import registry

ROOT = "autokernel::forward"
TRAIN_ROOT = "autokernel::train_step"  # the forward and the loss of a training step
BACKWARD = "autokernel::backward"
OPTIMIZER = "autokernel::optimizer"
LOSS = "loss"  # where the loss's ops ran: outside the model, in the training step
BACKWARD_NODE = "autograd::engine::evaluate_function: "
UNLINKED = "other (backward)"


def attribute(records: Records, modules: dict[str, torch.nn.Module], module_inputs: Optional[dict] = None,
              dtype: str = "float32") -> list[dict]:
    """The profile's groups from its records: one tree per profiled forward, attributed alike on
    every device (the ops from the CPU side, the time from the device's kernels on a GPU).
    `module_inputs` (module_targets.capture_inputs) names and sizes the module targets. Records of
    training steps give each group its backward time too."""
    training = is_training(records)
    tallies = []
    trees = op_trees(records, TRAIN_ROOT if training else ROOT, _module_of)
    for tree in trees:
        tallies.append(_Tally(modules, module_inputs, dtype, kernels_only=records.device != "cpu"))
        tallies[-1].scope(tree)
    if not training:
        return _summarise(tallies)
    return _summarise(tallies, windows(records, BACKWARD, _module_of), _recorders(trees))


def is_training(records: Records) -> bool:
    return any(op.name == TRAIN_ROOT for op in records.ops)


def optimizer_ms(records: Records) -> Optional[float]:
    """One optimizer step's time (its fastest), None without one: no target's, shown apart."""
    times = [tree.total_us for tree in op_trees(records, OPTIMIZER, _module_of)]
    return min(times) / 1e3 if times else None


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
        self.other_nodes: list[tuple[str, Node]] = []  # the ops behind `other`, for their backward
        # unmapped time inside a module (not the whole model): one entry per module call
        self.unmapped: list[_Unmapped] = []

    def scope(self, scope: Node, patterns: bool = True) -> None:
        where = scope.module or ("", LOSS if scope.name == TRAIN_ROOT else "")
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
                self.other_nodes.append((n.name, n))
        if in_module and (unmapped or scope.self_us):
            self.unmapped.append(_Unmapped(where, unmapped, scope.self_us + sum(n.total_us for n in unmapped),
                                           scope.self_us, cause))

    def owners(self) -> Iterator[tuple[tuple, list[Node]]]:
        """Each group's key with the op trees whose time went to it."""
        for call, _ in self.calls:
            yield _call_key(call), call.nodes
        for label, node in self.other_nodes:
            yield ("other", label), [node]
        for u in self.unmapped:
            yield _module_key(u.where[0], self, u.nodes), u.nodes


@dataclass
class _Unmapped:
    """One module call's own work: the ops no kernel type took, and all it ran after an op whose
    output shape the data decides (`cause`)."""

    where: tuple[str, str]  # (qualified name, class)
    nodes: list[Node]
    us: float
    own_us: float  # the module range's own time: on a GPU, kernels it launched outside any op
    cause: Optional[str] = None


def _summarise(tallies: list[_Tally], backward: Optional[list[list[Node]]] = None,
               recorders: Optional[dict] = None) -> list[dict]:
    """The groups of the tallied iterations; `backward`, the trees each training step's backward
    ran, adds each group's backward time to its forward's op that recorded it (`recorders`)."""
    n = max(len(tallies), 1)
    samples: dict[tuple, list[list[float]]] = defaultdict(lambda: [[] for _ in range(n)])
    info: dict[tuple, dict] = {}
    for i, tally in enumerate(tallies):
        for call, where in tally.calls:
            key = _call_key(call)
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
    bwd = _backward_samples(tallies, backward, recorders or {}) if backward is not None else {}
    fwd_ms = {k: _best_us(v) / 1e3 for k, v in samples.items()}
    bwd_ms = {k: _best_us(v) / 1e3 for k, v in bwd.items()}
    best = {k: fwd_ms.get(k, 0.0) + bwd_ms.get(k, 0.0) for k in {**samples, **bwd}}
    total_ms = sum(best.values()) or 1.0
    calls = {k: sum(len(s) for s in v) / n for k, v in samples.items()}
    groups = []
    for k in samples:
        if k[0] == "other":
            continue
        group = (_module_group(k, info[k], best[k], calls[k], total_ms, tallies[0]) if k[0] == module_targets.KERNEL_TYPE
                 else _group(info[k], best[k], calls[k], total_ms, tallies[0].modules))
        groups.append(_split(group, fwd_ms[k], bwd_ms.get(k, 0.0), backward))
    other = [k for k in samples if k[0] == "other"]
    if other:
        groups.append(_other_group(other, fwd_ms, bwd_ms, calls, total_ms, backward))
    unlinked = [k for k in bwd if k[0] == UNLINKED]
    if unlinked:
        counts = {k: sum(len(s) for s in bwd[k]) / max(len(backward), 1) for k in unlinked}
        groups.append(_other_group(unlinked, {}, bwd_ms, counts, total_ms, backward, op=UNLINKED))
    groups.sort(key=lambda g: -g["time_ms"])
    return groups


def _call_key(call: Call) -> tuple:
    return (call.kernel_type, str(call.shapes or call.args), call.dtype, call.causal, call.route)


def _other_group(keys: list[tuple], fwd_ms: dict, bwd_ms: dict, calls: dict, total_ms: float,
                 backward: Optional[list], op: Optional[str] = None) -> dict:
    """One `other` row: the ops no target took (`op`: the row's name, else its largest op's)."""
    rows = sorted(((k[1], fwd_ms.get(k, 0.0), bwd_ms.get(k, 0.0), calls[k]) for k in keys), key=lambda t: -t[1] - t[2])
    fwd, bwd = sum(t[1] for t in rows), sum(t[2] for t in rows)
    group = {"kernel_type": "other", "op": op or rows[0][0], "shapes": [], "dtype": "", "dims": {},
             "target": None, "route": "", "calls": _count(sum(t[3] for t in rows)),
             "time_ms": fwd + bwd, "share": (fwd + bwd) / total_ms, "modules": [], "ops": [t[0] for t in rows],
             "other_ops": [_split({"op": label, "time_ms": f + b, "share": (f + b) / total_ms, "calls": _count(c)},
                                  f, b, backward) for label, f, b, c in rows]}
    return _split(group, fwd, bwd, backward)


def _split(group: dict, fwd_ms: float, bwd_ms: float, backward: Optional[list]) -> dict:
    """A training step's row says how much of its time was forward and how much backward."""
    return {**group, "fwd_ms": fwd_ms, "bwd_ms": bwd_ms} if backward is not None else group


def _recorders(trees: list[Node]) -> dict[tuple[int, int], int]:
    """For each sequence number, the forward op that recorded its backward node (its id). Every
    op notes the number the next node will take, so a view or a cast that records none shares it
    with the op after it, and a composite op (aten::linear) with its first child: the node's op is
    the last to start with the number."""
    found: dict[tuple[int, int], int] = {}
    for node in _walk(trees):  # in the order the ops started
        if node.seq is not None:
            found[node.seq] = id(node)
    return found


def _backward_samples(tallies: list[_Tally], backward: list[list[Node]],
                      recorders: dict[tuple[int, int], int]) -> dict[tuple, list[list[float]]]:
    """Each backward tree's time under the key of the group its forward op went to, per step; a
    tree whose forward op is not in the profile under (UNLINKED, what it was)."""
    owner = {id(node): key for tally in tallies for key, nodes in tally.owners() for node in _walk(nodes)}
    samples: dict[tuple, list[list[float]]] = defaultdict(lambda: [[] for _ in backward])
    for i, trees in enumerate(backward):
        for tree in trees:
            linked = tree.name.startswith(BACKWARD_NODE) and tree.seq in recorders
            key = owner.get(recorders[tree.seq]) if linked else None
            samples[key or (UNLINKED, _unlinked_label(tree))][i].append(tree.total_us)
    return samples


def _unlinked_label(tree: Node) -> str:
    if not tree.name.startswith(BACKWARD_NODE):
        return tree.name  # run by backward() itself: the loss's seed gradient (aten::ones_like)
    name = tree.name[len(BACKWARD_NODE):].removeprefix("torch::autograd::")
    # AccumulateGrad writes a leaf's .grad and records no forward op; any other node's op was not seen
    return name if name == "AccumulateGrad" or tree.seq is None else f"{name} (its forward op was not found)"


def _walk(nodes: list[Node]) -> Iterator[Node]:
    for node in nodes:
        yield node
        yield from _walk(node.children)


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

