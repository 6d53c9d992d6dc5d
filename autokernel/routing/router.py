"""The router: a TorchFunctionMode for ops, replaced forwards and wrapped functions for forms.

`Router(winners).patched(model)` is a context manager. Inside it, a call that matches a winner
(same kernel type, dims, dtype, and causal flag) runs the winner's kernel_fn; anything else runs the
original. Module forwards and functions are replaced only for the winners whose target the profile
recorded as a hand-written form, and only in the modules it recorded (by name, else by class); on
exit every replacement is undone.
"""
from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.overrides import TorchFunctionMode

from .calls import DIMS, FORMS, OPS, Request, label, reference
from .outputs import dtype_name, same_result

# A form's binding check compares two PyTorch computations: a wrong binding is off by O(1), so a
# looser budget only spares models that round intermediates in low precision.
BINDING_SLACK = 10.0
NOTHING = object()


def load_kernel(path: str | Path, module_name: str) -> types.ModuleType:
    """Import a kernel file as a module (it launches Triton kernels: import it only to run it)."""
    spec = importlib.util.spec_from_file_location(module_name, str(path))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    if not callable(getattr(module, "kernel_fn", None)):
        raise ImportError(f"{path} defines no kernel_fn")
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

    @property
    def causal(self) -> bool:
        return bool(self.kwargs.get("causal", False))


class Tally:
    """What the router did: per target and per op, served and fallen back, with reasons."""

    def __init__(self, winners: list[Winner]):
        self.per_target = {w.target: {"kernel_type": w.kernel_type, "calls_served": 0, "fallbacks": 0,
                                      "fallback_reasons": Counter(), "served_by_op": Counter(), "errors": []}
                           for w in winners}
        self.per_op: dict[str, dict] = defaultdict(lambda: {"routed": 0, "fell_back": 0, "reasons": Counter()})

    def served(self, target: str, op: str) -> None:
        self.per_target[target]["calls_served"] += 1
        self.per_target[target]["served_by_op"][op] += 1
        self.per_op[op]["routed"] += 1

    def fell_back(self, op: str, reason: str, target: Optional[str] = None) -> None:
        self.per_op[op]["fell_back"] += 1
        self.per_op[op]["reasons"][reason] += 1
        if target is not None:
            self.per_target[target]["fallbacks"] += 1
            self.per_target[target]["fallback_reasons"][reason] += 1

    def error(self, target: str, op: str, error: BaseException) -> None:
        text = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        errors = self.per_target[target]["errors"]
        if len(errors) < 5:
            errors.append(text)
        self.fell_back(op, "the kernel raised " + text, target)

    def to_json(self) -> dict:
        plain = lambda d: {k: dict(v) if isinstance(v, Counter) else v for k, v in d.items()}  # noqa: E731
        return {"per_kernel": {t: plain(d) for t, d in self.per_target.items()},
                "per_op": {op: plain(d) for op, d in sorted(self.per_op.items())}}


def _unsafe(args: tuple) -> str:
    """Why a call a winner matches must still run in PyTorch."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "autograd: the kernel has no backward (run under torch.no_grad or inference_mode)"
    if len({t.device for t in tensors}) > 1:
        return "tensors on different devices"
    if len({t.dtype for t in tensors if t.is_floating_point()}) > 1:
        return "mixed dtypes"
    return ""


class Router(TorchFunctionMode):
    """Routes a model's calls to `winners`; `tally` counts what it did."""

    def __init__(self, winners: list[Winner]):
        super().__init__()
        self.winners = list(winners)
        self.by_type: dict[str, list[Winner]] = defaultdict(list)
        for w in self.winners:
            self.by_type[w.kernel_type].append(w)
        self.tally = Tally(self.winners)
        self.active = False
        self.form_calls: Counter = Counter()  # bound form calls per kernel type, served or not
        self._quiet = 0
        self._undo: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ entering and leaving
    @contextlib.contextmanager
    def patched(self, model: torch.nn.Module):
        """Route `model`'s calls while inside; restore every replaced forward and function after."""
        self.attach(model)
        self.active = True
        try:
            with self:
                yield self
        finally:
            self.active = False
            self.detach()

    @contextlib.contextmanager
    def quiet(self):
        """PyTorch as it is: for kernels' own tensor calls, binding checks and originals."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1

    def attach(self, model: torch.nn.Module) -> None:
        named = dict(model.named_modules())
        wrapped: dict[tuple, _Site] = {}
        for w in self.winners:
            if w.kernel_type not in FORMS or w.route not in ("module", "pattern"):
                continue
            for module in _recorded(named, w.modules):
                if w.route == "module":
                    self._wrap(wrapped, module, "forward", module.forward, w, owner=module)
                    continue
                for container, name, fn in _callees(module):
                    self._wrap(wrapped, container, name, fn, w, owner=None)
                self._watch(module, w)

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()

    # ------------------------------------------------------------------ ops
    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        try:
            entry = None if self._quiet else OPS.get(func)
        except TypeError:  # an unhashable callable is none of ours
            entry = None
        if entry is None:
            return func(*args, **kwargs)
        op, parse = entry
        try:
            request = parse(args, kwargs)
        except Exception:  # a call shape no parser foresaw: PyTorch decides what it means
            request = None
        if request is None or request.kernel_type not in self.by_type:
            return func(*args, **kwargs)
        out = self.serve(request.op or op, [request], lambda outs: outs[0])
        return func(*args, **kwargs) if out is NOTHING else out

    # ------------------------------------------------------------------ serving
    def decide(self, request: Request) -> tuple[Optional[Winner], str]:
        """The winner that matches the call, and why it may not serve it ('' when it may)."""
        dims, dtype = DIMS[request.kernel_type](*request.args), dtype_name(request.args[0])
        for w in self.by_type.get(request.kernel_type, []):
            if w.dims == dims and w.dtype == dtype and (request.causal is None or request.causal == w.causal):
                why = request.blocker or _unsafe(request.args) or (request.late_check() if request.late_check else "")
                return w, why
        return None, f"no winner at {label(request.kernel_type, dims, dtype, request.causal)}"

    def serve(self, op: str, requests: list[Request], assemble: Callable) -> Any:
        """All of `requests` through their winners, or NOTHING (and every one counted as a fallback)."""
        with self.quiet():
            decisions = [self.decide(r) for r in requests]
            reason = next((why for w, why in decisions if w is None or why), "")
            if reason:
                for w, why in decisions:
                    self.tally.fell_back(op, why or reason, w.target if w else None)
                return NOTHING
            outs = []
            for (w, _), r in zip(decisions, requests):
                try:
                    outs.append(r.finish(w.kernel_fn(*r.kernel_args(), **r.kwargs)))
                except Exception as e:  # the model still gets its answer; verify names the kernel
                    self.tally.error(w.target, op, e)
                    return NOTHING
            for w, _ in decisions:
                self.tally.served(w.target, op)
            return assemble(outs)

    # ------------------------------------------------------------------ forms
    def _wrap(self, wrapped: dict, container: Any, name: str, fn: Callable, winner: Winner, owner: Any) -> None:
        key = (id(container), name, winner.kernel_type)
        if key in wrapped:
            return
        site = _Site(self, winner, fn, owner, _callable_name(fn, owner))
        wrapped[key] = site
        if isinstance(container, dict):  # a module's globals: the function its forward calls by name
            container[name] = site
            self._undo.append(lambda: container.__setitem__(name, fn))
        else:  # an instance attribute shadows the class's method; deleting it restores the class's
            had, old = name in vars(container), vars(container).get(name)
            setattr(container, name, site)
            self._undo.append(lambda: setattr(container, name, old) if had else delattr(container, name))

    def _watch(self, module: torch.nn.Module, winner: Winner) -> None:
        """Count a fallback for every call of a module that holds the form inline and served none."""
        before: dict[int, int] = {}
        cls = type(module).__name__

        def enter(mod, args):
            before[id(mod)] = self.form_calls[winner.kernel_type]

        def leave(mod, args, out):
            start = before.pop(id(mod), None)
            if self.active and not self._quiet and start == self.form_calls[winner.kernel_type]:
                self.tally.fell_back(f"{cls}.forward", f"{winner.kernel_type} written inline in {cls}.forward: "
                                     "no call autokernel can route", winner.target)
        handles = [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
        self._undo.extend(h.remove for h in handles)


class _Site:
    """A callable that may compute a form: bound on its first call, then served or passed through."""

    def __init__(self, router: Router, winner: Winner, original: Callable, owner: Any, name: str):
        self.router, self.winner, self.original, self.owner, self.name = router, winner, original, owner, name
        self.kernel_type = winner.kernel_type
        self.rule: Optional[Callable] = None
        self.tried = False

    def __call__(self, *args, **kwargs):
        router = self.router
        if not router.active or router._quiet:
            return self.original(*args, **kwargs)
        if not self.tried:
            return self._bind(args, kwargs)
        if self.rule is None:
            if self.owner is not None:  # a recorded module that is not the form autokernel can call
                router.tally.fell_back(self.name, self._unbound_reason(), self.winner.target)
            return self.original(*args, **kwargs)
        with router.quiet():
            made = self.rule(self.owner, args, kwargs)
        return self._serve(made, args, kwargs)

    def _bind(self, args: tuple, kwargs: dict) -> Any:
        self.tried = True
        with self.router.quiet():
            original = self.original(*args, **kwargs)
            for rule in FORMS[self.kernel_type]:
                try:
                    made = rule(self.owner, args, kwargs)
                    if made is not None and same_result(reference(*made), original, BINDING_SLACK):
                        self.rule = rule
                        break
                except Exception:  # a rule that does not fit this callable's arguments
                    continue
        if self.rule is None:
            if self.owner is not None:
                self.router.tally.fell_back(self.name, self._unbound_reason(), self.winner.target)
            return original
        return self._serve(made, args, kwargs, original)

    def _unbound_reason(self) -> str:
        return f"{self.name} did not match the {self.kernel_type} reference with the arguments a kernel would get"

    def _serve(self, made: Any, args: tuple, kwargs: dict, original: Any = NOTHING) -> Any:
        router = self.router
        router.form_calls[self.kernel_type] += 1
        if made is None:
            router.tally.fell_back(self.name, "arguments unlike those it was bound with", self.winner.target)
        else:
            out = router.serve(self.name, *made)
            if out is not NOTHING:
                return out
        return self.original(*args, **kwargs) if original is NOTHING else original


def _recorded(named: dict, recorded: list[dict]) -> list[torch.nn.Module]:
    """The modules the profile recorded: by qualified name, else every module of a recorded class."""
    found = [named[r["name"]] for r in recorded
             if r.get("name") in named and type(named[r["name"]]).__name__ == r.get("class")]
    if not found:
        classes = {r.get("class") for r in recorded}
        found = [m for m in named.values() if type(m).__name__ in classes]
    unique: dict[int, torch.nn.Module] = {}
    for m in found:
        unique.setdefault(id(m), m)
    return list(unique.values())


def _callees(module: torch.nn.Module) -> list[tuple[Any, str, Callable]]:
    """The user's functions and methods a module's forward calls by name: (container, name, fn)."""
    forward = getattr(type(module).forward, "__func__", type(module).forward)
    code, scope = getattr(forward, "__code__", None), getattr(forward, "__globals__", {})
    found = []
    for name in (code.co_names if code else ()):
        fn = scope.get(name)
        if isinstance(fn, (types.FunctionType, _Site)) and not _from_torch(fn):
            found.append((scope, name, fn))
            continue
        method = getattr(type(module), name, None)
        if name != "forward" and isinstance(method, types.FunctionType) and not _from_torch(method):
            found.append((module, name, getattr(module, name)))
    return found


def _from_torch(fn: Any) -> bool:
    return (getattr(fn, "__module__", "") or "").split(".")[0] == "torch"


def _callable_name(fn: Callable, owner: Any) -> str:
    if owner is not None:
        return f"{type(owner).__name__}.forward"
    return getattr(fn, "__qualname__", None) or getattr(fn, "name", None) or repr(fn)
