"""The model's operators as a data-flow graph: which op reads the value another op wrote.

The profiler's records name each op and its shapes but not the tensors themselves, so whether an
intermediate goes only to the next op cannot be read from them. One more pass of the same step
(the forward, and the loss when training) runs under a TorchDispatchMode that sees every aten op
after autograd, with its real tensors: each op's inputs and outputs get a value id, and every
later op that reads a value is one of its uses. Views, casts and copies (forms.GLUE) are not uses
of their own: their output is the same value seen through a view, and whatever reads it reads the
value. Tensors autograd saves (its `detach`) are read by the backward, which a fused kernel
recomputes, so they are not uses either. What the step returns (the model's output, the loss) is
used by the caller: OUTPUT.

Every op, glue included, is also recorded as a `Step` that replays it exactly: its overload
(`aten.add.Tensor`) and its args and kwargs as passed, each tensor in them replaced by the `Slot`
of that tensor object (one slot per tensor, so a view has a slot of its own while it shares its
value id). Steps change nothing of what counts as a use; they let a chain be rebuilt as a module
(autokernel.profile.chain_replay).

Generic by construction: no module or model name decides anything; modules are recorded only so
the plan can say where a chain ran.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from autokernel.profile.forms import GLUE

OUTPUT = -1  # the op index of "the caller": a value the step returns is used there


@dataclass
class GraphOp:
    """One aten op that computes (not a view or a cast)."""

    index: int
    name: str  # "aten::mm"
    inputs: list[int]  # value ids of its tensor arguments, in order (views resolved to their value)
    outputs: list[int]
    shapes: list[tuple[int, ...]]  # of its tensor arguments, as passed
    dtypes: list[str]
    scalars: list[Any]  # its non-tensor arguments, in order
    module: tuple[str, str] = ("", "")  # (qualified name, class) of the innermost module it ran in
    step: int = -1  # its Step in OpGraph.steps


@dataclass(frozen=True)
class Slot:
    """A tensor object in a step's arguments: the step that made it, or an input from outside."""

    index: int


@dataclass
class Step:
    """One aten op as it was called, views and casts too: enough to call it again."""

    func: str  # "aten.add.Tensor": torch.ops.aten.add.Tensor
    args: tuple  # as passed, tensors replaced by Slot
    kwargs: dict
    outputs: list[int]  # the slots of its tensor outputs, in the order tree_flatten gives them
    op: Optional[int] = None  # its GraphOp's index; None for glue


@dataclass
class OpGraph:
    ops: list[GraphOp] = field(default_factory=list)
    uses: dict[int, list[int]] = field(default_factory=dict)  # value id -> indices of the ops reading it
    producer: dict[int, int] = field(default_factory=dict)  # value id -> index of the op that wrote it
    meta: dict[int, tuple[tuple[int, ...], str, int]] = field(default_factory=dict)  # value -> (shape, dtype, bytes)
    parameters: set[int] = field(default_factory=set)  # value ids of the model's parameters
    steps: list[Step] = field(default_factory=list)  # every op, glue included, in the order it ran
    slot_value: dict[int, int] = field(default_factory=dict)  # slot -> the value id it shows
    slot_step: dict[int, int] = field(default_factory=dict)  # slot -> index of the step that made it
    tensors: dict[int, torch.Tensor] = field(default_factory=dict)  # slot -> the tensor (dropped with the graph)

    def users(self, value: int) -> list[int]:
        return self.uses.get(value, [])

    def made_by(self, value: int) -> Optional[GraphOp]:
        i = self.producer.get(value)
        return self.ops[i] if i is not None else None

    def nbytes(self, value: int) -> int:
        return self.meta[value][2] if value in self.meta else 0

    def op_step(self, index: int) -> Step:
        return self.steps[self.ops[index].step]


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: OpGraph, stack: list[tuple[str, str]]):
        super().__init__()
        self.graph, self.stack = graph, stack
        self.value: dict[int, int] = {}  # id(tensor) -> value id
        self.slot: dict[int, int] = {}  # id(tensor) -> slot
        self.kept: list[torch.Tensor] = []  # held so that no id() is reused while recording
        self.next_id = 0

    def value_of(self, t: torch.Tensor) -> int:
        v = self.value.get(id(t))
        if v is None:
            v = self.value[id(t)] = self._new(t)
        return v

    def slot_of(self, t: torch.Tensor) -> int:
        s = self.slot.get(id(t))
        if s is None:
            s = self._new_slot(t, self.value_of(t))
        return s

    def _new_slot(self, t: torch.Tensor, value: int) -> int:
        s = self.slot[id(t)] = len(self.graph.slot_value)
        self.graph.slot_value[s] = value
        self.graph.tensors[s] = t
        return s

    def _step(self, func: Any, args: tuple, kwargs: dict, outs: list[torch.Tensor], op: Optional[int]) -> None:
        sub = lambda a: Slot(self.slot_of(a)) if isinstance(a, torch.Tensor) else a  # noqa: E731
        step = Step(str(func), tree_map(sub, tuple(args)), tree_map(sub, dict(kwargs)), [], op)
        index = len(self.graph.steps)
        for o in outs:
            step.outputs.append(self._new_slot(o, self.value[id(o)]))
            self.graph.slot_step[step.outputs[-1]] = index
        self.graph.steps.append(step)

    def _new(self, t: torch.Tensor) -> int:
        v = self.next_id
        self.next_id += 1
        self.kept.append(t)
        self.graph.meta[v] = (tuple(t.shape), _dtype(t), t.numel() * t.element_size())
        return v

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat_in = tree_flatten((args, kwargs))[0]
        tensors = [a for a in flat_in if isinstance(a, torch.Tensor)]
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        name = func._schema.name
        kind = name.split("::")[-1]
        if kind in GLUE and len(tensors) == 1:
            # the same value seen through a view, a cast or a copy; autograd's saved copies are no use
            self.slot_of(tensors[0])
            for o in outs:
                self.value[id(o)] = self.value_of(tensors[0])
                self.kept.append(o)
            self._step(func, args, kwargs, outs, None)
            return out
        g = self.graph
        op = GraphOp(len(g.ops), name, [self.value_of(t) for t in tensors], [self._new(o) for o in outs],
                     [tuple(t.shape) for t in tensors], [_dtype(t) for t in tensors],
                     [a for a in flat_in if not isinstance(a, torch.Tensor)], self.stack[-1] if self.stack else ("", ""),
                     len(g.steps))
        for t in tensors:  # its inputs' slots before its outputs take theirs (an in-place op's are one object)
            self.slot_of(t)
        for o, v in zip(outs, op.outputs):
            self.value[id(o)] = v
            g.producer[v] = op.index
        for v in dict.fromkeys(op.inputs):
            g.uses.setdefault(v, []).append(op.index)
        g.ops.append(op)
        self._step(func, args, kwargs, outs, op.index)
        return out


def capture(model: torch.nn.Module, run: Callable[[], Any]) -> OpGraph:
    """The data-flow graph of one call of `run` (a forward, or a forward and its loss), in which
    `model`'s modules are known by their qualified names. Gradients are left untouched: `run`'s
    result is not backpropagated."""
    graph = OpGraph()
    stack: list[tuple[str, str]] = []
    handles = []

    def leave(module: Any, args: Any, output: Any) -> None:  # a hook returning a value replaces the output
        if stack:
            stack.pop()

    for qual, m in model.named_modules():
        where = (qual, type(m).__name__)
        handles.append(m.register_forward_pre_hook(lambda mod, a, w=where: stack.append(w) and None))
        handles.append(m.register_forward_hook(leave))
    recorder = _Recorder(graph, stack)
    try:
        for p in model.parameters():
            recorder.slot_of(p)
            graph.parameters.add(recorder.value[id(p)])
        with recorder:
            result = run()
        for t in tree_flatten(_plain(result))[0]:
            if isinstance(t, torch.Tensor) and id(t) in recorder.value:
                graph.uses.setdefault(recorder.value[id(t)], []).append(OUTPUT)
    finally:
        for h in handles:
            h.remove()
    return graph


def _plain(result: Any) -> Any:
    """A transformers ModelOutput (an OrderedDict subclass) as the tensors it holds."""
    if hasattr(result, "to_tuple"):
        return result.to_tuple()
    return result
