"""What each chain could be worth: its bytes unfused and fused, its measured time forward and
backward, its ceiling at the roofline and its end-to-end projection by Amdahl's law.

- Bytes unfused: every computing op of the chain reads its tensor inputs and writes its outputs
  (as passed: a view reads what it shows). Fused: the chain's inputs from outside are read once and
  only the values it gives back are written; intermediates stay on chip.
- Time: each op of the chain is found in the profile's records by its name and input shapes, and
  its measured time (its range, children included; on a GPU its kernels) is the median over its
  calls; in a training step its backward node's time joins it through autograd's sequence number,
  as a target's does (autokernel.profile.attribution). The chain's time is the sum over its ops.
- Ceiling (plan.chain_price): the measured time against the fused roofline (fused bytes, the chain's FLOPs; a chain
  with a backward is charged 1 + plan.BACKWARD_WORK times, as every row is). Amdahl gives the
  projection from the chain's share of the profiled time.

A chain and its member targets are alternatives, not additions: the chain's time is also in its
members' rows, so chains are listed in a section of their own and left out of the shares' sum and
of `total_ceiling_e2e_speedup`; the search weighs a chain against its members by measured gain.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Any, Optional

from autokernel.profile.attribution import BACKWARD, BACKWARD_NODE, ROOT, TRAIN_ROOT, _module_of
from autokernel.profile.chain_graph import OpGraph
from autokernel.profile.chains import Chain, Rejected
from autokernel.profile.generic_chains import CHAIN_TYPE as GENERIC, NOT_BOUND
from autokernel.profile.forms import Node
from autokernel.profile.records import Records, op_trees, windows
from harness.kernel_types import registry

SHORT = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def _key(name: str, shapes: list) -> tuple:
    return name, tuple(tuple(s) for s in shapes if isinstance(s, (list, tuple)) and len(s) > 0)


def _walk(nodes: list[Node]):
    for n in nodes:
        yield n
        yield from _walk(n.children)


class OpTimes:
    """Median measured time per (op, input shapes), forward and backward, in microseconds."""

    def __init__(self, records: Optional[Records]):
        self.fwd: dict[tuple, list[float]] = defaultdict(list)
        self.bwd: dict[tuple, list[float]] = defaultdict(list)
        if records is None:
            return
        training = any(op.name == TRAIN_ROOT for op in records.ops)
        trees = op_trees(records, TRAIN_ROOT if training else ROOT, _module_of)
        backward: dict[tuple, float] = defaultdict(float)
        if training:
            for window in windows(records, BACKWARD, _module_of):
                for n in _walk(window):
                    if n.name.startswith(BACKWARD_NODE) and n.seq is not None:
                        backward[n.seq] += n.total_us
        for n in _walk(trees):
            if n.module:
                continue
            key = _key(n.name, n.shapes)
            self.fwd[key].append(n.total_us)
            if n.seq is not None and n.seq in backward:
                self.bwd[key].append(backward[n.seq])

    def of(self, name: str, shapes: list) -> tuple[Optional[float], float, bool]:
        """(forward us, None when the records hold no such op; backward us; by name alone). Calls
        at the same shapes do the same work: the fastest is the one another process stalled least
        (as a group's time, autokernel.profile.attribution). An op whose arguments the profiler
        records without shapes (a list of tensors: cat) is timed by its name alone, the median of
        its calls at any shapes, and the row says so."""
        key = _key(name, shapes)
        fwd, bwd = self.fwd.get(key), self.bwd.get(key)
        if fwd:
            return min(fwd), (min(bwd) if bwd else 0.0), False
        fwd, bwd = self.fwd.get((name, ())), self.bwd.get((name, ()))
        if fwd:
            return statistics.median(fwd), (statistics.median(bwd) if bwd else 0.0), True
        return None, 0.0, False


def target_name(chain: Chain) -> str:
    """The registry's name of the chain's target (harness/kernel_types/types/chains.py)."""
    return registry.target_name(chain.chain_type, chain.dims, chain.dtype)


def _flops(graph: OpGraph, chain: Chain) -> float:
    """Products by their formula (2 per multiply-add); every other op one FLOP per element written."""
    total = 0.0
    for i in chain.ops:
        op = graph.ops[i]
        if op.name in ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul") and len(op.shapes) >= 2:
            a = op.shapes[-2]
            k, n = a[-1], (op.shapes[-1][0] if op.name == "aten::linear" else op.shapes[-1][-1])
            total += 2.0 * math.prod(a[:-1]) * k * n
        else:
            total += sum(math.prod(graph.meta[v][0]) for v in op.outputs)
    return total


def _enclosing(graph: OpGraph, chain: Chain) -> tuple[str, str]:
    """The module the chain ran in: of its ops' modules, the one that holds all the others (SiLU x
    up: the MLP, not its activation's module; the projection in `lm_head` and the loss in the causal
    LM's own forward: the model), else its first op's (an add in one layer whose norm is the next
    module's)."""
    where = [graph.ops[i].module for i in chain.ops]
    for name, cls in where:  # the model itself ("", its class) holds every module: a causal LM's loss
        if cls and all(not name or other == name or other.startswith(name + ".") for other, _ in where):
            return name, cls
    return where[0]


def _bytes(graph: OpGraph, chain: Chain) -> tuple[int, int]:
    unfused = 0
    for i in chain.ops:
        op = graph.ops[i]
        unfused += sum(math.prod(s) * _itemsize(d) for s, d in zip(op.shapes, op.dtypes))
        unfused += sum(graph.nbytes(v) for v in op.outputs)
    # an input is read as the chain's ops see it: a slice of a larger table (rotary's cos and sin
    # cut from a cache of every position) costs the slice, not the table
    read: dict[int, int] = {}
    for i in chain.ops:
        op = graph.ops[i]
        for v, shape, dtype in zip(op.inputs, op.shapes, op.dtypes):
            read[v] = max(read.get(v, 0), math.prod(shape) * _itemsize(dtype))
    fused = sum(read.get(v, graph.nbytes(v)) for v in dict.fromkeys(chain.inputs))
    return unfused, fused + sum(graph.nbytes(v) for v in chain.outputs)


def _itemsize(dtype: str) -> int:
    return {"float64": 8, "float32": 4, "int64": 8, "int32": 4, "float16": 2, "bfloat16": 2, "bool": 1}.get(dtype, 4)


def entries(graph: OpGraph, found: list[Chain], rejected: list[Rejected], records: Optional[Records],
            total_ms: float) -> dict:
    """plan.json's `chains`: one row per chain type, dims, dtype and options, with its occurrences
    counted as calls, and the near-misses (`rejected`) with the reason each was left unfused."""
    times = OpTimes(records)
    rows: dict[str, dict] = {}
    generic: dict[str, str] = {}  # a generic chain's replay signature -> its target name
    for chain in found:
        name, extra = (target_name(chain), {}) if chain.chain_type != GENERIC else _generic(graph, chain, generic)
        unfused, fused = _bytes(graph, chain)
        fwd_us = bwd_us = 0.0
        unmeasured, by_name = [], []
        for i in chain.ops:
            op = graph.ops[i]
            f, b, named = times.of(op.name, list(op.shapes))
            if f is None:
                unmeasured.append(op.name)
            if named:
                by_name.append(op.name)
            fwd_us += f or 0.0
            bwd_us += b
        row = rows.setdefault(name, {
            "target": name, "kernel_type": chain.chain_type, "chain_type": chain.chain_type, "dims": chain.dims, "dtype": chain.dtype,
            "options": chain.options, "calls": 0, "fwd_ms": 0.0, "bwd_ms": 0.0,
            "ops": [graph.ops[i].name for i in chain.ops], "unfused_bytes": unfused, "fused_bytes": fused,
            "bytes_saved": unfused - fused, "flops": _flops(graph, chain), "modules": [], "unmeasured_ops": [], **extra})
        row["calls"] += 1
        row["fwd_ms"] += fwd_us / 1e3
        row["bwd_ms"] += bwd_us / 1e3
        where = _enclosing(graph, chain)
        if where[1] and {"name": where[0], "class": where[1]} not in row["modules"]:  # as a group's modules
            row["modules"].append({"name": where[0], "class": where[1]})
        row["unmeasured_ops"] = sorted(set(row["unmeasured_ops"]) | set(unmeasured))
        if by_name:
            row["timed_by_name"] = sorted(set(row.get("timed_by_name", [])) | set(by_name))
    for row in rows.values():
        row["time_ms"] = row["fwd_ms"] + row["bwd_ms"]
        row["share"] = row["time_ms"] / total_ms if total_ms > 0 else 0.0
    return {"entries": list(rows.values()),
            "rejected": [{"chain_type": r.chain_type, "ops": [graph.ops[i].name for i in r.ops], "reason": r.reason}
                         for r in rejected]}


def _generic(graph: OpGraph, chain: Chain, names: dict[str, str]) -> tuple[str, dict]:
    """A generic chain's target name and what its row adds: kernel type "module" (it is searched as
    a module-style target) and its replay, or why it has none. Occurrences with one replay share a
    row; two replays that would share a name are told apart by a number."""
    from autokernel.profile.chain_replay import NotReplayable, replay, signature
    ops = "-".join(dict.fromkeys(graph.ops[i].name.split("::")[-1] for i in chain.ops))
    shape = "x".join(str(d) for d in graph.meta[chain.outputs[0]][0]) or "1"
    name = f"chain[{ops}:{shape}:{chain.dtype}]"
    try:
        spec = replay(graph, chain)
    except Exception as e:  # noqa: BLE001 (a chain that cannot be replayed is listed, not searched; the profile goes on)
        why = str(e) if isinstance(e, NotReplayable) else f"{type(e).__name__}: {e}"
        return name, {"kernel_type": "module", "replay": None, "replay_note": f"no reference can be built: {why}",
                      "serving": NOT_BOUND}
    key = signature(spec)
    if key not in names:
        taken, n = set(names.values()), 1
        unique = name
        while unique in taken:
            n += 1
            unique = f"{name[:-1]}~{n}]"
        names[key] = unique
    return names[key], {"kernel_type": "module", "replay": spec, "serving": NOT_BOUND}


# A chain's members: the plan's single-op targets that run some of its ops, by type and the dims
# the two share (targets are keyed by type, dims and dtype, so a row with these dims holds the
# chain's calls). Each chain type's rule: (member type, does a member row's dims match the chain's).
MEMBERS = {
    "add_rmsnorm": (("rmsnorm", lambda c, m: (m["M"], m["N"]) == (c["M"], c["N"])),),
    "silu_mul": (("fused_mlp", lambda c, m: (m["M"], m["F"]) == (c["M"], c["N"])),),
    "rotary_qk": (("rotary_embedding", lambda c, m: (m["B"], m["S"], m["D"]) == (c["B"], c["S"], c["D"])
                   and m["H"] in (c["HQ"], c["HK"])),),
    # the loss may read one row fewer than the projection makes (a shifted loss): V and D decide
    "linear_cross_entropy": (("cross_entropy", lambda c, m: m["V"] == c["V"] and abs(m["N"] - c["N"]) <= 1),
                             ("matmul", lambda c, m: (m["K"], m["N"]) == (c["D"], c["V"]))),
}


def members(row: dict, entries: list[dict]) -> list[str]:
    """The targets of `entries` whose rows hold some of the chain `row`'s time: its alternatives
    (the search weighs the chain against them by measured gain; serving binds one side, not both)."""
    if row.get("chain_type") == GENERIC:
        return _enclosing_targets(row, entries)
    found = []
    for kernel_type, match in MEMBERS.get(row.get("chain_type"), ()):
        for e in entries:
            if e.get("kernel_type") == kernel_type and e.get("dtype") == row.get("dtype") and e.get("dims") \
                    and e.get("target") and _matches(match, row["dims"], e["dims"]):
                found.append(e["target"])
    return list(dict.fromkeys(found))


def _enclosing_targets(row: dict, entries: list[dict]) -> list[str]:
    """A generic chain's members: the module targets whose module holds it (they run its ops)."""
    where = [m["name"] for m in row.get("modules", [])]
    found = []
    for e in entries:
        if e.get("kernel_type") != "module" or not e.get("target"):
            continue
        names = [m["name"] for m in e.get("modules", [])] or [(e.get("module") or {}).get("qualname", "")]
        if any(w == n or w.startswith(n + ".") for w in where for n in names if n):
            found.append(e["target"])
    return list(dict.fromkeys(found))


def _matches(match: Any, chain_dims: dict, member_dims: dict) -> bool:
    try:
        return bool(match(chain_dims, member_dims))
    except KeyError:  # a row from another version of its type: not a member
        return False


def table(plan: dict) -> Any:
    """The plan's chains as a rich Table: bytes unfused and fused, time, share, ceiling, e2e."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    chains = plan.get("chains") or {}
    t = Table(title="chains: adjacent ops whose intermediates go only to the next (alternatives to their members' rows)",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    widest = max((len(_short(r["target"])) for r in chains.get("entries", [])), default=5)
    t.add_column("chain", no_wrap=True, min_width=widest)  # whole: a target name is what a user greps for
    for name in ("ops", "calls", "MB unfused", "MB fused", "fwd ms", "bwd ms", "share", "ceiling", "e2e"):
        t.add_column(name, justify="left" if name == "ops" else "right")
    for r in chains.get("entries", []):
        ops = " > ".join(dict.fromkeys(o.replace("aten::", "") for o in r["ops"]))
        ceil = "n/a" if r.get("ceiling_speedup") is None else f"{r['ceiling_speedup']:.1f}x"
        e2e = "n/a" if r.get("projected_e2e_speedup") is None else f"{r['projected_e2e_speedup']:.3f}x"
        t.add_row(escape(_short(r["target"])), escape(ops), str(r["calls"]), f"{r['unfused_bytes'] * r['calls'] / 1e6:.3f}",
                  f"{r['fused_bytes'] * r['calls'] / 1e6:.3f}", f"{r['fwd_ms']:.3f}", f"{r['bwd_ms']:.3f}",
                  f"{r['share']:.1%}", ceil, e2e)
    notes = [f"left unfused: {r['chain_type']}: {r['reason']}" for r in chains.get("rejected", [])[:5]]
    first = "a chain's time is also in its members' rows: the search keeps whichever measures faster"
    if any(r.get("chain_type") == GENERIC for r in chains.get("entries", [])):
        first += ("\nchain[...]: a run of no registry type, searched as a module-style target (its ops replayed as "
                  "the reference); its winner is judged, not bound in the model")
    t.caption = "\n".join([first] + notes)
    t.caption_justify = "left"
    return t


def _short(target: str) -> str:
    for name, short in SHORT.items():
        target = target.replace(f":{name}]", f":{short}]")
    return target
