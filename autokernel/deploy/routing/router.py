"""The router: the winners bound into a model at patch time, the way Liger Kernel patches a model.

`Router(winners).patched(model)` is a context manager. On entry it replaces only what the winners
can serve (binding.py): the recorded nn.Linear modules' forwards, the recorded modules' forwards
and the functions they call by name (hand-written forms), and the torch functions of a winner's
type, live only inside the recorded modules. Each stand-in (sites.py) checks its call cheaply and
runs the original when no winner matches it (same kernel type, dims, dtype and causal flag) or one
matches but cannot take it (autograd, a mask, a bias of another dtype...). Nothing intercepts every
op. On exit every replaced attribute is put back.

Each winner is also a torch custom op (ops.py), which the stand-ins call while torch.compile
traces, so a compiled model inside `patched` keeps the kernels. Nothing is counted while Dynamo
traces; the op counts the runs of its implementation that no eager stand-in made, which are a
compiled graph's, and the tally adds them to the winner's served calls ("torch.compile graph").
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from .calls import AUTOGRAD, DIMS, Request, label, needs_grad, unsafe
from .outputs import dtype_name
from .serving import ServingRange, words
from .sites import NOTHING, compiling


class SurfaceRefused(ImportError):
    """A winner's file names what the kernel allow-list does not list: it is never imported."""


def load_kernel(path, module_name: str, entry: str = "kernel_fn") -> types.ModuleType:
    """Import a kernel file as a module (it launches Triton kernels: import it only to run it);
    `entry` is what it must define: kernel_fn, or ModelNew for a module target's winner. Before
    the import the file is held again to the judge's static check (the closed surface): a winner
    that fails it is refused, with its file, line and name."""
    from harness.isolation.static_check import check_file, describe
    refused = check_file(path, model=entry == "ModelNew")
    if refused:
        raise SurfaceRefused(f"{path} is not loaded: {describe(refused, str(path))}")
    spec = importlib.util.spec_from_file_location(module_name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    if not callable(getattr(module, entry, None)):
        raise ImportError(f"{path} defines no {entry}")
    return module


@dataclass
class Winner:
    """A judged kernel and the target it won: which calls it may serve."""

    target: str
    kernel_type: str
    dims: dict
    dtype: str
    kernel_fn: Callable
    kwargs: dict = field(default_factory=dict)  # the target's options, e.g. {"causal": True}
    route: str = "op"  # the profile's: "op", "module" (the whole module is the form), "pattern"
    modules: list = field(default_factory=list)  # [{"name": "layers.0.mlp", "class": "MLP"}, ...]
    op: Optional[Callable] = field(default=None, repr=False)  # kernel_fn as a torch custom op
    serving: Optional[ServingRange] = None  # the calls it may serve; None: its target's shape alone
    # the file's backward_fn when its backward passed the judge; None: it serves no call under autograd
    backward_fn: Optional[Callable] = field(default=None, repr=False)
    inference_only: str = ""  # why a backward the file gives is not served ("the backward failed ...")
    # the calls it may serve under autograd: where its backward was judged right; None: its target alone
    training_serving: Optional[ServingRange] = None
    mutates_grad_out: bool = False  # its file declares MUTATES_GRAD_OUT: its backward gets a copy of grad_out
    judged_layouts: bool = False  # its backward was judged under strided grad_outs: it gets them uncopied
    # runs of its op that no stand-in made in eager: a compiled graph's calls (Dynamo traced a
    # stand-in's call of the op into the graph, where nothing is counted): the tally adds them
    graph_calls: list = field(default_factory=lambda: [0], repr=False)

    def __post_init__(self) -> None:
        from .refusals import guarded
        self.kernel_fn = guarded(self.kernel_fn, self.target)  # what the audit hook refuses fails loudly
        if self.backward_fn is not None:
            self.backward_fn = guarded(self.backward_fn, self.target)
        if self.serving is None:
            self.serving = ServingRange.exact(self.kernel_type, self.dims, self.dtype, self.causal)
        if self.training_serving is None:
            self.training_serving = ServingRange.exact(self.kernel_type, self.dims, self.dtype, self.causal,
                                                       note="the target alone (no shapes around it judged backward)")

    @property
    def causal(self) -> bool:
        return bool(self.kwargs.get("causal", False))

    def registered(self) -> Callable:
        """kernel_fn as a torch custom op, differentiable when the winner has a backward
        (registered once, on first use)."""
        if self.op is None:
            from .ops import custom_op
            self.op = custom_op(self.target, self.kernel_type, _counted(self.kernel_fn, self.graph_calls),
                                self.backward_fn, self.mutates_grad_out, self.judged_layouts)
        return self.op

    def autograd_refusal(self, dims: Optional[dict] = None) -> str:
        """Why a call that needs gradients falls back ('' when the winner's backward was judged right
        at its shape: its training serving range)."""
        if self.backward_fn is None:
            return f"autograd: {self.inference_only} (run under torch.no_grad)" if self.inference_only else AUTOGRAD
        outside = self.training_serving.refusal(dims) if dims is not None else None
        return f"training: {words(outside)} (for the backward)" if outside else ""


# > 0 while a stand-in runs a kernel in eager (it counts that call itself): any other run of a
# winner's op is a compiled graph's
_EAGER = [0]


def _counted(kernel_fn: Callable, calls: list) -> Callable:
    """kernel_fn as the op runs it: a run no eager stand-in made is counted in `calls`."""
    def run(*args, **kwargs):
        if not _EAGER[0] and not compiling():  # compiling: a traced call run for real (a test's)
            calls[0] += 1
        return kernel_fn(*args, **kwargs)
    return run


GRAPH = "torch.compile graph"  # the op name the tally gives a compiled graph's calls


class Tally:
    """What the router did, read from its stand-ins' counters: per target and per op."""

    def __init__(self, winners: list[Winner]):
        self.winners = winners
        self.sites: list = []
        self.errors: dict[str, list[str]] = defaultdict(list)
        self.graph_calls: dict[str, list[int]] = {}  # target -> [its op's graph runs on entry, on exit]

    def watch_graphs(self, entering: bool) -> None:
        """Mark where the patch began (and ended): the graph runs counted are those in between."""
        for w in self.winners:
            if entering:
                self.graph_calls[w.target] = [w.graph_calls[0], -1]
            elif w.target in self.graph_calls:
                self.graph_calls[w.target][1] = w.graph_calls[0]

    def _graph_runs(self, w: Winner) -> int:
        began, ended = self.graph_calls.get(w.target, (w.graph_calls[0], -1))
        return (ended if ended >= 0 else w.graph_calls[0]) - began

    def to_json(self) -> dict:
        per_kernel = {w.target: {"kernel_type": w.kernel_type, "calls_served": 0, "fallbacks": 0,
                                 "fallback_reasons": Counter(), "served_by_op": Counter(),
                                 "errors": list(self.errors.get(w.target, []))} for w in self.winners}
        per_op: dict[str, dict] = defaultdict(lambda: {"routed": 0, "fell_back": 0, "reasons": Counter()})
        for w in self.winners:
            n = self._graph_runs(w)
            if n:
                per_kernel[w.target]["calls_served"] += n
                per_kernel[w.target]["served_by_op"][GRAPH] += n
                per_op[GRAPH]["routed"] += n
        for site in self.sites:
            for (target, op), n in site.served.items():
                per_kernel[target]["calls_served"] += n
                per_kernel[target]["served_by_op"][op] += n
                per_op[op]["routed"] += n
            for (reason, target, op), n in site.fall_counts().items():
                text = reason_text(reason)
                per_op[op]["fell_back"] += n
                per_op[op]["reasons"][text] += n
                if target is not None:
                    per_kernel[target]["fallbacks"] += n
                    per_kernel[target]["fallback_reasons"][text] += n
        plain = lambda d: {k: dict(v) if isinstance(v, Counter) else v for k, v in d.items()}  # noqa: E731
        return {"per_kernel": {t: plain(d) for t, d in per_kernel.items()},
                "per_op": {op: plain(d) for op, d in sorted(per_op.items())}}


def reason_text(reason: Any) -> str:
    """A fallback's reason in words; the hot path keeps the ones that need formatting as tuples."""
    if isinstance(reason, str):
        return reason
    if reason[0] == "no winner":
        _, kernel_type, dims, dtype, causal = reason
        return f"no winner at {label(kernel_type, dict(dims), dtype, causal)}"
    if reason[0] != "unbound":  # outside a winner's serving range
        return words(reason)
    _, name, kernel_type = reason  # "unbound"
    return f"{name} did not match the {kernel_type} reference {UNBOUND_WORDS}"


# the end of every "unbound" reason: a form that does not fit the model's callable (verify reads it)
UNBOUND_WORDS = "with the arguments a kernel would get"


class Router:
    """Binds `winners` into a model while inside `patched`; `tally` counts what they served."""

    def __init__(self, winners: list[Winner]):
        self.winners = list(winners)
        self.by_type: dict[str, list[Winner]] = defaultdict(list)
        for w in self.winners:
            self.by_type[w.kernel_type].append(w)
        self.tally = Tally(self.winners)
        self.quiet = 0  # > 0 while kernels, originals under a binding check or references run
        self._seen: dict[str, list[int]] = {}
        self._matches: dict[tuple, tuple] = {}  # (type, dims, dtype, causal, on_gpu) -> (winner, refusal)
        self._undo: list[Callable[[], None]] = []

    @contextlib.contextmanager
    def patched(self, model: torch.nn.Module):
        """Serve `model`'s matching calls while inside; restore every replaced attribute after."""
        from .binding import bind
        for w in self.winners:
            if w.kernel_type != "module":  # a ModelNew is called as a module, not as a custom op
                w.registered()
        self._undo = bind(self, model)
        self.tally.watch_graphs(True)
        try:
            yield self
        finally:
            self.tally.watch_graphs(False)
            while self._undo:
                self._undo.pop()()

    def form_calls(self, kernel_type: str) -> list[int]:
        """A shared counter of a kernel type's form calls (a Watch compares it before and after)."""
        return self._seen.setdefault(kernel_type, [0])

    def decide(self, request: Request) -> tuple[Optional[Winner], Any]:
        """The winner whose serving range holds the call, and why it may still not serve it ('' when
        it may); else the first winner of the call's family (dtype, flags, fixed dims) and why the
        call is outside its range (a tuple); else no winner."""
        kernel_type, dims, dtype = request.kernel_type, DIMS[request.kernel_type](*request.args), \
            dtype_name(request.args[0])
        on_gpu = request.args[0].is_cuda
        if compiling():  # symbolic sizes: decided in the trace, as guards on them
            w, refusal = self._match(kernel_type, dims, dtype, request.causal, on_gpu)
        else:  # a shape seen before is decided by a dict lookup (a served call pays this every time)
            key = (kernel_type, tuple(dims.values()), dtype, request.causal, on_gpu)
            found = self._matches.get(key)
            if found is None:
                found = self._matches[key] = self._match(kernel_type, dims, dtype, request.causal, on_gpu)
            w, refusal = found
        if w is None:
            return None, ("no winner", kernel_type, tuple(dims.items()), dtype, request.causal)
        if refusal is not None:
            return w, refusal
        why = request.blocker or unsafe(request.args, w.kernel_type)
        if why == AUTOGRAD:
            why = w.autograd_refusal(dims)
        return w, why or (request.late_check() if request.late_check else "")

    def _match(self, kernel_type: str, dims: dict, dtype: str, causal: Optional[bool], on_gpu: bool) -> tuple:
        """(the winner whose range holds the call, None), else (the first winner of its family, why
        not), else (None, None)."""
        outside = (None, None)
        for w in self.by_type.get(kernel_type, ()):
            if w.serving.same_family(dims, dtype, causal):
                refusal = w.serving.refusal(dims, on_gpu=on_gpu)
                if refusal is None:
                    return w, None
                outside = outside if outside[0] is not None else (w, refusal)
        return outside

    def route(self, site: Any, requests: list[Request], assemble: Callable, counting: bool = True) -> tuple:
        """(output or NOTHING, the fallbacks to count for every call like this one, or None when
        something beyond shapes and dtypes decided)."""
        op = requests[0].op or site.op
        decisions = [self.decide(r) for r in requests]
        reason = ""
        for w, why in decisions:
            if w is None or why:
                reason = why
                break
        if reason:
            if not counting:  # while Dynamo traces: nothing counted, nothing remembered
                return NOTHING, None
            falls = tuple((why or reason, w.target if w else None, op) for w, why in decisions)
            site.refuse(falls)
            # only the first input's shapes and dtypes said no (a reason kept as a tuple: no winner,
            # or outside a winner's range): every call like it is refused alike
            pure = isinstance(decisions[0][1], tuple) and all(not why or isinstance(why, tuple) for _, why in decisions)
            return NOTHING, falls if pure else None
        outs, compiled = [], not counting
        self.quiet += 1
        _EAGER[0] += counting
        try:
            for (w, _), r in zip(decisions, requests):
                # the op when autograd records the call (its backward is registered with it) or Dynamo traces
                kernel = w.op if compiled or needs_grad(r.args) else w.kernel_fn
                outs.append(r.finish(kernel(*r.kernel_args(), **r.kwargs)))
        except Exception as e:  # the model still gets its answer; verify names the kernel
            if counting:
                self._error(site, w.target, op, e)
            return NOTHING, None
        finally:
            self.quiet -= 1
            _EAGER[0] -= counting
        if counting:
            for w, _ in decisions:
                site.served[(w.target, op)] = site.served.get((w.target, op), 0) + 1
        return assemble(outs), None

    def _error(self, site: Any, target: str, op: str, error: BaseException) -> None:
        text = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        if len(self.tally.errors[target]) < 5:
            self.tally.errors[target].append(text)
        site.fell("the kernel raised " + text, target, op)
