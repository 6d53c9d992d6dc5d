"""A profile's raw records, and the one way they become op trees on a CPU and on a GPU.

What an op is (its name, input shapes, dtypes, constant arguments, the module range it ran in) is
read from the CPU-side op records on every device: the profiler records them as the op is
dispatched, whatever the device. Only the time differs:

- on a CPU, an op's own time is its CPU range less its children's;
- on a GPU, it is the time of the device kernels it launched. Each kernel names the op that launched
  it (its linked correlation id, the op's id); a kernel without that link is joined through the
  runtime call that launched it (cudaLaunchKernel, same CUPTI correlation id), which lies inside
  the op's CPU range on the same thread: the innermost op containing it launched it.

Records are plain data (JSON), so a GPU's profile can be recorded once and attributed anywhere.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from autokernel.profile.forms import Node

# Device-side copies of record_function ranges: spans over kernels, not work of their own.
ANNOTATION_ACTIVITIES = {"gpu_user_annotation", "user_annotation"}
# Runtime and driver calls on the CPU that start device work (cudaLaunchKernel, cuLaunchKernel).
LAUNCH_ACTIVITIES = {"cuda_runtime", "cuda_driver", "privateuse1_runtime", "privateuse1_driver"}
# The profiler's own ranges (a forward, a training step's parts): on a CPU their own time is Python.
OWN_RANGES = "autokernel::"


@dataclass
class OpRecord:
    """One op or record_function range, as dispatched on the CPU."""

    id: int  # the profiler's correlation id of the op
    name: str
    thread: int
    start_ns: int
    end_ns: int
    shapes: list = field(default_factory=list)
    dtypes: list = field(default_factory=list)
    concrete: list = field(default_factory=list)
    seq: int = -1  # autograd's sequence number: what links a backward node to its forward op
    fwd_thread: int = 0  # a backward node's forward thread (0 on a forward op: its own thread)


@dataclass
class Launch:
    """A runtime call on the CPU (cudaLaunchKernel, cudaMemcpyAsync) that started device work."""

    name: str
    thread: int
    start_ns: int
    end_ns: int
    correlation: int  # CUPTI's id, shared with the kernel it launched
    op: int = 0  # the launching op's id, when the profiler linked it


@dataclass
class DeviceEvent:
    """One kernel (or copy) as it ran on the device."""

    name: str
    start_ns: int
    end_ns: int
    correlation: int = 0  # CUPTI's id, shared with its Launch
    op: int = 0  # the launching op's id, when the profiler linked it

    @property
    def duration_us(self) -> float:
        return (self.end_ns - self.start_ns) / 1e3


@dataclass
class Records:
    device: str  # "cpu" or "cuda"
    ops: list[OpRecord] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    kernels: list[DeviceEvent] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"device": self.device, "ops": [asdict(o) for o in self.ops],
                "launches": [asdict(r) for r in self.launches], "kernels": [asdict(k) for k in self.kernels]}

    @staticmethod
    def from_json(d: dict) -> "Records":
        return Records(d["device"], [OpRecord(**o) for o in d["ops"]], [Launch(**r) for r in d.get("launches", [])],
                       [DeviceEvent(**k) for k in d.get("kernels", [])])

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json()))

    @staticmethod
    def load(path: str | Path) -> "Records":
        return Records.from_json(json.loads(Path(path).read_text()))


def from_kineto(results: Any, device: str) -> Records:
    """The records of a finished torch.profiler run (`prof.profiler.kineto_results`)."""
    from torch.autograd import DeviceType
    records = Records("cuda" if device.startswith("cuda") else "cpu")
    start = results.trace_start_ns()
    for e in results.events():
        activity = e.activity_type() if hasattr(e, "activity_type") else ""
        begin, end = e.start_ns() - start, e.end_ns() - start
        if e.device_type() != DeviceType.CPU:
            if activity not in ANNOTATION_ACTIVITIES:
                records.kernels.append(DeviceEvent(e.name(), begin, end, e.correlation_id(), e.linked_correlation_id()))
        elif e.linked_correlation_id() > 0 or activity in LAUNCH_ACTIVITIES:
            records.launches.append(Launch(e.name(), e.start_thread_id(), begin, end, e.correlation_id(),
                                           e.linked_correlation_id()))
        else:
            records.ops.append(OpRecord(e.correlation_id(), e.name(), e.start_thread_id(), begin, end,
                                        [list(s) for s in e.shapes()], list(e.dtypes()),
                                        [_plain(c) for c in (e.concrete_inputs() or [])], e.sequence_nr(),
                                        e.fwd_thread_id()))
    return records


def _plain(value: Any) -> Any:
    """A constant argument as JSON can hold it (the forms read ints, floats, bools and lists)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


# ---------------------------------------------------------------- records -> op trees
def op_trees(records: Records, root: str, module_of: Callable[[str], Optional[tuple[str, str]]]) -> list[Node]:
    """One Node tree per top-level `root` range, with each node's own time in microseconds.
    `module_of(name)` reads (qualified name, class) from a module's range name, None for an op. On
    a CPU a range's own time is the Python between ops, not work: 0. Records are told apart by
    their place in the list, not by id: ranges and ops need not have ids of their own."""
    return [tree for tree, op in _forest(records, module_of) if op.name == root]


def windows(records: Records, root: str, module_of: Callable[[str], Optional[tuple[str, str]]]) -> list[list[Node]]:
    """For each top-level `root` range, in order, the trees that ran in it: its children, and the
    top-level trees of other threads that started inside it. On a GPU the autograd engine runs a
    backward on a device thread of its own, outside the range that called it."""
    forest = _forest(records, module_of)
    out = []
    for tree, op in forest:
        if op.name != root:
            continue
        others = [t for t, o in forest if o.thread != op.thread and op.start_ns <= o.start_ns <= op.end_ns]
        out.append(list(tree.children) + others)
    return out


def _forest(records: Records, module_of: Callable[[str], Optional[tuple[str, str]]]) -> list[tuple[Node, OpRecord]]:
    """Every top-level op tree on every thread, with the record at its root."""
    ops = records.ops
    device_us = _device_us(records) if records.device == "cuda" else None
    children: dict[Optional[int], list[int]] = defaultdict(list)
    for parent, i in _nesting(ops):
        children[parent].append(i)

    def node(i: int) -> Node:
        op, kids = ops[i], children.get(i, [])
        module = module_of(op.name)
        if device_us is not None:
            self_us = device_us.get(i, 0.0)
        elif module or op.name.startswith(OWN_RANGES):
            self_us = 0.0
        else:
            self_us = max(op.end_ns - op.start_ns - sum(ops[k].end_ns - ops[k].start_ns for k in kids), 0) / 1e3
        seq = (op.fwd_thread or op.thread, op.seq) if op.seq >= 0 else None
        return Node(op.name, float(self_us), op.shapes, op.dtypes, op.concrete, [node(k) for k in kids], module, seq)

    return [(node(i), ops[i]) for i in children[None]]


def _nesting(ops: list[OpRecord]) -> list[tuple[Optional[int], int]]:
    """(parent index, index) for every op: the parent is the innermost op whose range contains it
    on the same thread. Ranges on one thread nest; ties go to the longer range as the parent."""
    out = []
    threads: dict[int, list[int]] = defaultdict(list)
    for i, op in enumerate(ops):
        threads[op.thread].append(i)
    for on_thread in threads.values():
        stack: list[int] = []
        for i in sorted(on_thread, key=lambda j: (ops[j].start_ns, -ops[j].end_ns)):
            while stack and not (ops[stack[-1]].start_ns <= ops[i].start_ns and ops[i].end_ns <= ops[stack[-1]].end_ns):
                stack.pop()
            out.append((stack[-1] if stack else None, i))
            stack.append(i)
    return out


def _device_us(records: Records) -> dict[int, float]:
    """Device time per launching op (its index): by the kernel's own link to the op's id, else
    through its launch. Work no op launched (none inside the profiled forwards does) belongs to no
    tree."""
    index: dict[int, int] = {}
    for i, op in enumerate(records.ops):
        index[op.id] = -1 if op.id in index or not op.id else i  # an id two records share links nothing
    launches = {r.correlation: r for r in records.launches if r.correlation}
    by_us: dict[int, float] = defaultdict(float)
    for k in records.kernels:
        op = index.get(k.op, -1) if k.op else -1
        launch = launches.get(k.correlation) if op < 0 and k.correlation else None
        if launch is not None:
            op = index.get(launch.op, -1) if launch.op else -1
            op = op if op >= 0 else _innermost(records.ops, launch)
        if op >= 0:
            by_us[op] += k.duration_us
    return dict(by_us)


def _innermost(ops: list[OpRecord], launch: Launch) -> int:
    """The index of the shortest op range around a launch on its thread, -1 if none."""
    best = -1
    for i, op in enumerate(ops):
        if op.thread == launch.thread and op.start_ns <= launch.start_ns and launch.end_ns <= op.end_ns:
            if best < 0 or op.end_ns - op.start_ns < ops[best].end_ns - ops[best].start_ns:
                best = i
    return best
