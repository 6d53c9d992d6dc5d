"""Where a model's time goes, by kernel type, measured.

torch.profiler records every aten op with its input shapes and dtypes; forward hooks open a
record_function range around each module call, so every op knows the module it ran in. The ops, on
every device, come from these CPU-side records; each op's own time is its self CPU time on a CPU,
and on a GPU the time of the device kernels it launched, joined to it by correlation id
(autokernel.profile.records). That time is attributed exactly once:

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

import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.autograd.profiler import record_function

from autokernel.profile import module_targets, op_work
from autokernel.errors import UserError
from autokernel.profile.forms import GLUE, Call, Node, find_forms, map_op, node_dtype
from autokernel.profile.records import Records, from_kineto, op_trees
from harness.kernel_types import registry

ROOT = "autokernel::forward"


@dataclass
class Profile:
    device: str
    device_name: str
    dtype: str
    total_ms: float  # op time of one forward: the sum of the groups
    forward_ms: float  # wall time of one plain forward (median of forward_samples_ms)
    profiled_forward_ms: float  # the same under the profiler and module hooks (median)
    iters: int
    warmup: int
    groups: list[dict]  # kernel_type, op, shapes, dtype, dims, target, route, calls, time_ms, share,
    # modules, ops; causal (attention), parts (recognised forms), other_ops (other); module, flops, bytes,
    # work ("counted" or "floor"), work_note, and where they ran products or data-dependent shapes,
    # matmuls and data_dependent (module targets)
    module_inputs: dict = field(default_factory=dict)  # qualified name -> what its first call took

    forward_samples_ms: list[float] = field(default_factory=list)  # raw, unrounded
    profiled_samples_ms: list[float] = field(default_factory=list)

    @property
    def coverage(self) -> float:
        """The share of the time in typed or module targets."""
        return sum(g["share"] for g in self.groups if g["kernel_type"] != "other")

    @property
    def typed_coverage(self) -> float:
        """The share of the time in the nine kernel types alone."""
        return sum(g["share"] for g in self.groups if g["kernel_type"] not in ("other", module_targets.KERNEL_TYPE))


# ---------------------------------------------------------------- measuring
def profile_model(loaded: Any, iters: int = 10, warmup: int = 3, seed: int = 0,
                  trace_path: Optional[str] = None, records_path: Optional[str] = None) -> Profile:
    """Profile `iters` forwards of a modelfile.LoadedModel after `warmup` plain ones; `records_path`
    keeps the raw op and kernel records (JSON) for attributing them again elsewhere."""
    device = loaded.spec.device
    inputs = loaded.make_inputs(seed)
    for _ in range(warmup):
        loaded.forward(inputs)
    plain_s = [_timed(loaded.forward, inputs, device) for _ in range(3)]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    modules = dict(loaded.model.named_modules())
    # what each module is called with, captured outside the profiler (its ops would be timed)
    module_inputs = module_targets.capture_inputs(loaded.model, lambda: loaded.forward(inputs))
    handles = _hook_modules(modules)
    try:
        with _without_profiler_chatter(), torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            profiled_s = [_timed(loaded.forward, inputs, device, ROOT) for _ in range(iters)]
    finally:
        for h in handles:
            h.remove()
    if trace_path:
        prof.export_chrome_trace(str(trace_path))
    records = from_kineto(prof.profiler.kineto_results, device)
    if records_path:
        records.save(records_path)
    groups = attribute(records, modules, module_inputs, _model_dtype(loaded.model))
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"
    return Profile(device=device, device_name=name, dtype=_model_dtype(loaded.model),
                   total_ms=sum(g["time_ms"] for g in groups), forward_ms=statistics.median(plain_s) * 1e3,
                   profiled_forward_ms=statistics.median(profiled_s) * 1e3, iters=iters, warmup=warmup,
                   groups=groups, module_inputs=module_inputs, forward_samples_ms=[t * 1e3 for t in plain_s],
                   profiled_samples_ms=[t * 1e3 for t in profiled_s])


# What torch's profiler library (kineto) prints on every start and stop, straight to fd 2.
PROFILER_CHATTER = re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \S+\.cpp:\d+\] ")


@contextmanager
def _without_profiler_chatter():
    """Hold the process's stderr while the profiler runs and pass on every line but kineto's
    'USDT: ... profiler_start' chatter: its errors (CUPTI's among them) and the model's own output
    still reach the terminal, after the profile."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr to hold
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode("utf-8", "replace").splitlines(keepends=True)
            kept = "".join(line for line in lines if not PROFILER_CHATTER.match(line))
            if kept:
                sys.stderr.write(kept)
                sys.stderr.flush()


def _timed(forward: Callable, inputs: list, device: str, label: Optional[str] = None) -> float:
    t0 = time.perf_counter()
    if label:
        with record_function(label):
            forward(inputs)
    else:
        forward(inputs)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def _hook_modules(modules: dict[str, torch.nn.Module]) -> list:
    """A record_function range around every module call, named after the module: the profiler
    then knows which module each op ran in (with_modules only does this for TorchScript)."""
    names = {id(m): f"module::{q or '<root>'}::{type(m).__name__}" for q, m in modules.items()}
    stack: list = []

    def enter(module, args):
        rf = record_function(names[id(module)])
        rf.__enter__()
        stack.append(rf)

    def leave(module, args, output):
        stack.pop().__exit__(None, None, None)

    handles = []
    for m in modules.values():
        handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    return handles


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


def _model_dtype(model: torch.nn.Module) -> str:
    dtypes = [p.dtype for p in model.parameters() if p.is_floating_point()]
    return registry.DTYPE_NAMES.get(max(set(dtypes), key=dtypes.count), "float32") if dtypes else "float32"


# ---------------------------------------------------------------- attributing
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
