"""Where a model's time goes, by kernel type, measured.

torch.profiler records every aten op with its input shapes and dtypes; forward hooks open a
record_function range around each module call, so every op knows the module it ran in. Each op's
own time (CUDA kernel time on a GPU, self CPU time on a CPU) is attributed exactly once:

1. Inside each module, hand-written forms are recognised by the ops they run (a structural
   signature, not a class name): RMSNorm (pow, mean, rsqrt, mul), rotate-half rotary (neg, cat and
   the muls around them), a gate/up/SiLU/product/down MLP, explicit q·kᵀ → mask → softmax → ·v
   attention, and log_softmax followed by nll_loss. A form that is all a module does (apart from
   views and casts) is routed "module", so `verify` can swap that module; otherwise "pattern".
2. Every other op is rolled up to the highest op that maps to a kernel type through the
   registry's `aten_ops` (aten::linear with its t/addmm -> matmul), routed "op".
3. What maps to no type is `other`, with its ops, so the shares add up to 1.

Each group's time is its fastest over the profiled iterations: on a busy machine another process
only ever adds time (a stalled thread pool), and taking each group's best keeps those stalls out of
the shares.
"""
from __future__ import annotations

import functools
import math
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler import record_function

from harness import registry

ROOT = "autokernel::forward"
# Views, casts and allocations: free on a GPU, skipped when matching a form.
GLUE = {"view", "reshape", "_reshape_alias", "_unsafe_view", "to", "_to_copy", "type_as", "contiguous",
        "unsqueeze", "squeeze", "transpose", "t", "permute", "expand", "expand_as", "as_strided", "slice",
        "select", "narrow", "chunk", "split", "split_with_sizes", "unbind", "detach", "alias", "clone",
        "empty", "empty_like", "empty_strided", "copy_", "size", "dropout", "lift_fresh", "resolve_conj"}
MASKING = {"mul", "div", "masked_fill", "masked_fill_", "add", "add_", "where", "eq", "ne", "lt", "gt",
           "logical_not", "sub", "rsub", "tril", "triu", "ones", "full", "scalar_tensor", "arange"}
DTYPE_OF = {"float": "float32", "c10::Half": "float16", "c10::BFloat16": "bfloat16", "double": "float64"}
# Ops the registry lists under cross_entropy that mean something else when they stand alone.
PAIRED_ONLY = {"aten::log_softmax", "aten::_log_softmax", "aten::nll_loss", "aten::nll_loss_nd",
               "aten::nll_loss_forward"}


@dataclass
class Node:
    """One op or one module call, with its children in call order."""

    name: str
    self_us: float
    shapes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    concrete: list = field(default_factory=list)
    children: list["Node"] = field(default_factory=list)
    module: Optional[tuple[str, str]] = None  # (qualified name, class name) for a module call

    @property
    def kind(self) -> str:
        return "module" if self.module else self.name.split("::")[-1]

    @property
    def total_us(self) -> float:
        return self.self_us + sum(c.total_us for c in self.children)

    def face(self) -> "Node":
        """What a one-op module (nn.Linear, nn.SiLU) looks like from outside: that op."""
        if not self.module:
            return self
        real = [c for c in self.children if c.kind not in GLUE]
        return real[0].face() if len(real) == 1 else self

    def op_names(self) -> set[str]:
        """The aten ops this call covers, views and casts left out."""
        names = set() if self.module or self.kind in GLUE else {self.name}
        for c in self.children:
            names |= c.op_names()
        return names


@dataclass
class Call:
    """One recognised call of a kernel type: what it covers and its kernel_fn-style shapes."""

    kernel_type: str
    op: str
    args: list[list[int]]  # the kernel_fn arguments' shapes, in the type's signature order
    dtype: str
    nodes: list[Node]
    route: str = "op"
    causal: Optional[bool] = None
    shapes: Optional[list] = None  # as recorded; default: args


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
    # modules, ops; causal (attention), parts (recognised forms), other_ops (other)

    forward_samples_ms: list[float] = field(default_factory=list)  # raw, unrounded
    profiled_samples_ms: list[float] = field(default_factory=list)

    @property
    def coverage(self) -> float:
        return sum(g["share"] for g in self.groups if g["kernel_type"] != "other")


# ---------------------------------------------------------------- measuring
def profile_model(loaded: Any, iters: int = 10, warmup: int = 3, seed: int = 0,
                  trace_path: Optional[str] = None) -> Profile:
    """Profile `iters` forwards of a modelfile.LoadedModel after `warmup` plain ones."""
    device = loaded.spec.device
    inputs = loaded.make_inputs(seed)
    for _ in range(warmup):
        loaded.forward(inputs)
    plain_s = [_timed(loaded.forward, inputs, device) for _ in range(3)]
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    modules = dict(loaded.model.named_modules())
    handles = _hook_modules(modules)
    try:
        with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
            profiled_s = [_timed(loaded.forward, inputs, device, ROOT) for _ in range(iters)]
    finally:
        for h in handles:
            h.remove()
    if trace_path:
        prof.export_chrome_trace(str(trace_path))
    tallies = []
    # on a GPU each range is also recorded on the device's timeline: keep the CPU-side tree
    for evt in (e for e in prof.events() if e.name == ROOT and e.cpu_parent is None
                and e.device_type == DeviceType.CPU):
        tallies.append(_Tally(modules))
        tallies[-1].scope(_node(evt, device))
    groups = _summarise(tallies)
    name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "cpu"
    return Profile(device=device, device_name=name, dtype=_model_dtype(loaded.model),
                   total_ms=sum(g["time_ms"] for g in groups), forward_ms=statistics.median(plain_s) * 1e3,
                   profiled_forward_ms=statistics.median(profiled_s) * 1e3, iters=iters, warmup=warmup,
                   groups=groups, forward_samples_ms=[t * 1e3 for t in plain_s],
                   profiled_samples_ms=[t * 1e3 for t in profiled_s])


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


def _node(evt: Any, device: str) -> Node:
    module = None
    if evt.name.startswith("module::"):
        qual, cls = evt.name[len("module::"):].rsplit("::", 1)
        module = ("" if qual == "<root>" else qual, cls)
    if device.startswith("cuda"):
        self_us = evt.self_device_time_total
    else:
        # on a CPU a range's own time is the Python between ops, not the device's work
        self_us = 0.0 if (module or evt.name == ROOT) else evt.self_cpu_time_total
    kids = sorted(evt.cpu_children, key=lambda e: e.time_range.start)
    return Node(evt.name, float(self_us), list(evt.input_shapes or []), list(getattr(evt, "input_dtypes", None) or []),
                list(evt.concrete_inputs or []), [_node(c, device) for c in kids], module)


def _model_dtype(model: torch.nn.Module) -> str:
    dtypes = [p.dtype for p in model.parameters() if p.is_floating_point()]
    return registry.DTYPE_NAMES.get(max(set(dtypes), key=dtypes.count), "float32") if dtypes else "float32"


# ---------------------------------------------------------------- attributing
class _Tally:
    """Recognised calls and unmapped time of one iteration."""

    def __init__(self, modules: dict):
        self.modules = modules
        self.calls: list[tuple[Call, tuple[str, str]]] = []
        self.other: dict[str, list[float]] = defaultdict(list)  # top-level op -> us of each call

    def scope(self, scope: Node, patterns: bool = True) -> None:
        where = scope.module or ("", "")
        found = _find_forms(scope.children, self.modules.get(where[0])) if patterns else []
        claimed = {id(n) for c in found for n in c.nodes}
        loose = [n for n in scope.children if id(n) not in claimed]
        if scope.module and len(found) == 1 and all(n.kind in GLUE for n in loose):
            found[0].nodes, found[0].route, loose = list(scope.children), "module", []
        self.calls += [(c, where) for c in found]
        if scope.self_us:
            self.other[f"({where[1] or 'model'}.forward)"].append(scope.self_us)
        for n in loose:
            if n.module:
                self.scope(n, patterns)
            elif call := _map_op(n):
                self.calls.append((call, where))
            else:
                # the highest op decides: the sum inside an aten::mean is the mean's, not a reduce
                self.other[n.name].append(n.total_us)


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
    best = {k: _best_us(v) / 1e3 for k, v in samples.items()}
    total_ms = sum(best.values()) or 1.0
    calls = {k: sum(len(s) for s in v) / n for k, v in samples.items()}
    groups = [_group(info[k], best[k], calls[k], total_ms, tallies[0].modules) for k in samples if k[0] != "other"]
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


# ---------------------------------------------------------------- one op -> a kernel type
@functools.lru_cache(maxsize=1)
def _op_types() -> dict[str, str]:
    return {op: t for t in registry.names() for op in registry.get(t).aten_ops if op not in PAIRED_ONLY}


def _map_op(node: Node) -> Optional[Call]:
    kernel_type = _op_types().get(node.name)
    s = node.shapes
    if kernel_type is None or len(s) < 2 or not s[0]:  # every mapped op has a tensor and one more argument
        return None
    dtype = _dtype(node)
    recorded = [x for x in s if x]
    if kernel_type == "matmul":
        a, b = (s[1], s[2]) if node.kind == "addmm" else (s[0], s[1])
        if node.kind == "linear":
            b = b[::-1]
        if len(a) < 2 or len(b) != 2:
            return None  # batched products are not the registry's 2-D matmul
        args = [a, b]
    elif kernel_type in ("softmax", "reduce"):
        dim = node.concrete[1] if len(node.concrete) > 1 else None
        dim = dim[0] if isinstance(dim, list) and len(dim) == 1 else dim
        if dim not in (-1, len(s[0]) - 1):
            return None
        args = [s[0]]
    elif kernel_type in ("layernorm", "rmsnorm"):
        normalized = node.concrete[1] if len(node.concrete) > 1 else None
        if isinstance(normalized, list) and len(normalized) != 1:
            return None
        args = [s[0]] + [x for x in s[2:] if x][:2 if kernel_type == "layernorm" else 1]
    elif kernel_type == "flash_attention":
        if any(len(x) != 4 for x in s[:3]):
            return None
        causal = node.concrete[5] if node.kind == "scaled_dot_product_attention" and len(node.concrete) > 5 else None
        return Call(kernel_type, node.name, s[:3], dtype, [node], causal=causal, shapes=recorded)
    else:  # cross_entropy
        if len(s[0]) != 2:
            return None
        args = [s[0], s[1]]
    return Call(kernel_type, node.name, args, dtype, [node], shapes=recorded)


def _dtype(node: Node) -> str:
    first = node.dtypes[0] if node.dtypes else ""
    return DTYPE_OF.get(first, first)


# ---------------------------------------------------------------- hand-written forms
class _Cursor:
    """Walks a scope's children, skipping views and casts between the ops a form is made of."""

    def __init__(self, nodes: list[Node], i: int):
        self.nodes, self.i = nodes, i

    def take(self, *kinds: str, cond: Callable[[Node], bool] = lambda n: True) -> Optional[Node]:
        j = self.i
        while j < len(self.nodes) and self.nodes[j].face().kind in GLUE and self.nodes[j].face().kind not in kinds:
            j += 1
        if j < len(self.nodes) and self.nodes[j].face().kind in kinds and cond(self.nodes[j].face()):
            self.i = j + 1
            return self.nodes[j].face()
        return None


def _find_forms(nodes: list[Node], module: Optional[torch.nn.Module]) -> list[Call]:
    found, i = [], 0
    while i < len(nodes):
        for form in FORMS:
            cursor = _Cursor(nodes, i)
            call = form(cursor, module)
            if call is not None:
                call.nodes = nodes[i:cursor.i]
                call.route = "pattern"
                found.append(call)
                i = cursor.i
                break
        else:
            i += 1
    return found


def _rmsnorm(c: _Cursor, module: Any) -> Optional[Call]:
    sq = c.take("pow") or c.take("mul", cond=lambda n: len(n.shapes) > 1 and n.shapes[0] == n.shapes[1])
    if not sq or not c.take("mean"):
        return None
    c.take("add")  # + eps
    if c.take("rsqrt"):
        if not c.take("mul"):
            return None
    elif not (c.take("sqrt") and c.take("div")):
        return None
    x = sq.shapes[0]
    weight = c.take("mul", cond=lambda n: [x[-1]] in n.shapes)
    args = [x, [x[-1]]] if weight else [x]
    # the statistics may run in fp32 on an fp16 model: the weight product has the model's dtype
    return Call("rmsnorm", "RMSNorm (pow, mean, rsqrt, mul)", args, _dtype(weight or sq), [])


def _rotary(c: _Cursor, module: Any) -> Optional[Call]:
    first = c.take("mul", cond=lambda n: len(n.shapes[0]) >= 3)
    neg = c.take("neg")
    if not neg or not c.take("cat"):
        return None
    rot = c.take("mul", cond=lambda n: n.shapes[0][-1] == 2 * neg.shapes[0][-1])
    if not rot or (first and first.shapes[0] != rot.shapes[0]):
        return None
    first = first or c.take("mul", cond=lambda n: n.shapes[0] == rot.shapes[0])
    c.take("add")
    x = rot.shapes[0]
    x4 = [1] * (4 - len(x)) + x if len(x) <= 4 else [math.prod(x[:-3])] + x[-3:]
    cos = first.shapes[1] if first else rot.shapes[1]
    return Call("rotary_embedding", "rotate-half rotary (mul, neg, cat, mul, add)", [x4, cos, rot.shapes[1]],
                _dtype(rot), [], shapes=[x, cos, rot.shapes[1]])


def _mlp(c: _Cursor, module: Any) -> Optional[Call]:
    gate = c.take("linear")
    act = gate and c.take("silu")
    up = gate and c.take("linear")
    act = act or (up and c.take("silu"))
    if not (act and up and c.take("mul")):
        return None
    down = c.take("linear")
    x, wg, wu = gate.shapes[0], gate.shapes[1], up.shapes[1]
    if not down or wg != wu or down.shapes[1] != wg[::-1] or up.shapes[0] != x:
        return None
    return Call("fused_mlp", "SwiGLU MLP (gate, up, silu, mul, down)", [x, wg, wu, down.shapes[1]],
                _dtype(gate), [])


def _batched(n: Node) -> bool:
    return len(n.shapes) >= 2 and len(n.shapes[0]) >= 3 and len(n.shapes[1]) >= 3


def _attention(c: _Cursor, module: Any) -> Optional[Call]:
    qk = c.take("matmul", "bmm", cond=_batched)
    if not qk:
        return None
    masks = []
    while not c.take("softmax", "_softmax"):
        step = c.take(*MASKING)
        if not step or len(masks) > 8:
            return None
        masks.append(step.kind)
    pv = c.take("matmul", "bmm", cond=lambda n: _batched(n) and n.shapes[0][-1] == qk.shapes[1][-1])
    if not pv or qk.shapes[0][-1] != qk.shapes[1][-2]:
        return None
    q, v = qk.shapes[0], pv.shapes[1]
    q4 = [1] * (4 - len(q)) + q
    causal = _causal(masks, module) if {"masked_fill", "masked_fill_", "where", "add"} & set(masks) else False
    return Call("flash_attention", "explicit attention (matmul, mask, softmax, matmul)",
                [q4, q4[:2] + qk.shapes[1][-1:] + q4[-1:], q4[:2] + v[-2:]], _dtype(qk), [], causal=causal,
                shapes=[q, qk.shapes[1], v])


def _causal(masks: list[str], module: Any) -> Optional[bool]:
    """A mask is causal when the code builds it with tril/triu or the module holds a square
    lower-triangular buffer (GPT-2's `bias`); otherwise it may be padding: unknown."""
    if {"tril", "triu"} & set(masks):
        return True
    for buf in (module.buffers(recurse=False) if module is not None else []):
        m = buf.detach().reshape(-1, *buf.shape[-2:])[0] if buf.dim() >= 2 else None
        if m is not None and m.shape[0] == m.shape[1] and m.shape[0] > 1:
            if torch.equal(m.bool().cpu(), torch.tril(torch.ones_like(m, dtype=torch.bool, device="cpu"))):
                return True
    return None


def _cross_entropy(c: _Cursor, module: Any) -> Optional[Call]:
    ls = c.take("log_softmax", "_log_softmax")
    if not ls or len(ls.shapes[0]) != 2 or not c.take("nll_loss", "nll_loss_nd", "nll_loss2d"):
        return None
    return Call("cross_entropy", "log_softmax + nll_loss", [ls.shapes[0], [ls.shapes[0][0]]], _dtype(ls), [])


FORMS = (_rmsnorm, _rotary, _mlp, _attention, _cross_entropy)
