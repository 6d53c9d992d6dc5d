"""What `Router.patched` replaces in a model, and how each replacement is undone.

Per kernel type with winners:
- winners of a hand-written form (route "module" or "pattern"): the recorded modules' forwards
  ("module"), or the functions and methods their forward calls by name ("pattern", e.g. the model
  file's apply_rotary_pos_emb), plus a Watch that counts calls where the form was written inline;
- winners of a torch op (route "op"): a matmul in a recorded nn.Linear is served by replacing that
  module's forward; any other op (x @ w, F.softmax, F.scaled_dot_product_attention...) by
  replacing the torch function for as long as the patch lasts, live only while one of the recorded
  modules runs. A plan that recorded no module scopes them to the whole model; a target the
  profile found in a training step's loss (outside the model) serves for as long as the patch lasts.

Modules are found by their recorded qualified name, else by class. Instance attributes shadow the
class's forward (deleting them restores it); module globals and torch attributes are set back.
"""
from __future__ import annotations

import inspect
import types
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .calls import FORMS, OPS
from .modules import KERNEL_TYPE as MODULE
from .modules import bind_module
from .sites import FormSite, LinearSite, OpSite, Scope, Watch, scoped

# where each torch callable of OPS lives, so it can be replaced and put back: (owner, attribute)
PLACES = [(F, "linear"), (torch, "matmul"), (torch.Tensor, "matmul"), (torch.Tensor, "__matmul__"), (torch, "mm"),
          (torch.Tensor, "mm"), (F, "softmax"), (torch, "softmax"), (torch.Tensor, "softmax"), (torch, "sum"),
          (torch.Tensor, "sum"), (F, "layer_norm"), (F, "rms_norm"), (F, "scaled_dot_product_attention"),
          (F, "cross_entropy")]


def bind(router: Any, model: torch.nn.Module) -> list[Callable[[], None]]:
    """Replace what `router`'s winners serve in `model`; returns the undo steps, in order."""
    undo: list[Callable[[], None]] = []
    named, done = dict(model.named_modules()), set()
    try:
        for kernel_type, winners in router.by_type.items():
            if kernel_type == MODULE:  # a module target's ModelNew replaces its instances' forwards
                for w in winners:
                    bind_module(router, named, w, _set, undo)
                continue
            forms = [w for w in winners if kernel_type in FORMS and w.route in ("module", "pattern")]
            ops = [w for w in winners if w not in forms]
            for w in forms:
                _bind_form(router, named, w, done, undo)
            if ops:
                _bind_ops(router, model, named, kernel_type, ops, undo)
    except BaseException:
        while undo:
            undo.pop()()
        raise
    return undo


def _bind_form(router: Any, named: dict, winner: Any, done: set, undo: list) -> None:
    for module in _recorded(named, winner.modules):
        if winner.route == "module":
            _replace(router, done, module, "forward", winner, module, undo)
            continue
        callees = _callees(module)
        for container, name in callees:
            _replace(router, done, container, name, winner, None, undo)
        if not callees and (id(module), "watch", winner.kernel_type) not in done:
            done.add((id(module), "watch", winner.kernel_type))
            watch = Watch(router, winner.kernel_type, winner.target, type(module).__name__, module.forward)
            router.tally.sites.append(watch)
            _set(module, "forward", watch.stand_in(), undo)


def _replace(router: Any, done: set, container: Any, name: str, winner: Any, owner: Any, undo: list) -> None:
    key = (id(container), name, winner.kernel_type)
    if key in done:
        return
    done.add(key)
    original = container[name] if isinstance(container, dict) else getattr(container, name)
    label = f"{type(owner).__name__}.forward" if owner is not None else getattr(original, "__qualname__", name)
    restore: list = []
    site = FormSite(router, winner, original, owner, label, uninstall=lambda: restore[0]())
    router.tally.sites.append(site)
    _set(container, name, site.stand_in(), undo)
    restore.append(undo[-1])


# the class the profile records for a training step's loss (autokernel.profile.attribution.LOSS),
# spelled here: an exported package carries routing/ without the profiler
LOSS = "loss"


def in_loss(modules: list[dict]) -> bool:
    """Whether the profile recorded a target only in a training step's loss, outside the model."""
    return bool(modules) and all(m.get("class") == LOSS for m in modules)


def _bind_ops(router: Any, model: torch.nn.Module, named: dict, kernel_type: str, winners: list, undo: list) -> None:
    everywhere = any(not w.modules for w in winners)  # a plan that recorded no module: the whole model
    loss = any(in_loss(w.modules) for w in winners)  # the loss runs outside every module of the model
    recorded = list({id(m): m for w in winners for m in _recorded(named, w.modules)}.values())
    unique = [model] if everywhere else recorded
    if kernel_type == "matmul":
        for m in (named.values() if everywhere else recorded):
            if _is_linear(m):
                site = LinearSite(router, m, OPS[F.linear][1])
                router.tally.sites.append(site)
                _set(m, "forward", site.stand_in(), undo)
        unique = [m for m in unique if not _is_linear(m)]
    if not (unique or loss) or kernel_type not in KINDS.values():  # a form's type recorded as an op: nothing to replace
        return
    scope = Scope(depth=1 if loss else 0)  # a loss's op: live wherever it runs while patched
    for m in unique:
        _set(m, "forward", scoped(scope, m.forward), undo)
    for owner, name in PLACES:
        original = getattr(owner, name, None)
        entry = OPS.get(original) if original is not None else None
        if entry is None or KINDS[entry[0]] != kernel_type:
            continue
        site = OpSite(router, entry[0], original, entry[1], scope)
        router.tally.sites.append(site)
        _set(owner, name, site.stand_in(), undo)


# each op name in OPS -> the kernel type its parser yields
KINDS = {"F.linear": "matmul", "torch.matmul": "matmul", "torch.mm": "matmul", "softmax": "softmax",
         "torch.sum": "reduce", "F.layer_norm": "layernorm", "F.rms_norm": "rmsnorm",
         "F.scaled_dot_product_attention": "flash_attention", "F.cross_entropy": "cross_entropy"}


def _is_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear) and type(module).forward is torch.nn.Linear.forward


def _set(container: Any, name: str, value: Any, undo: list) -> None:
    """container.name = value (or container[name] for a module's globals), undone in reverse order."""
    if isinstance(container, dict):
        old = container[name]
        container[name] = value
        undo.append(lambda: container.__setitem__(name, old))
        return
    had, old = name in vars(container), vars(container).get(name)
    setattr(container, name, value)

    def restore() -> None:  # may run twice (a site that puts its original back early): idempotent
        if had:
            setattr(container, name, old)
        elif name in vars(container):
            delattr(container, name)
    undo.append(restore)


def _recorded(named: dict, recorded: list[dict]) -> list[torch.nn.Module]:
    """The modules the profile recorded: by qualified name, else every module of a recorded class."""
    found = [named[r["name"]] for r in recorded
             if r.get("name") in named and type(named[r["name"]]).__name__ == r.get("class")]
    if not found:
        classes = {r.get("class") for r in recorded}
        found = [m for m in named.values() if type(m).__name__ in classes]
    return list({id(m): m for m in found}.values())


def _callees(module: torch.nn.Module) -> list[tuple[Any, str]]:
    """The user's functions and methods a module's forward calls by name: (container, name)."""
    forward = getattr(type(module).forward, "__func__", type(module).forward)
    # a decorated forward (transformers' deprecate_kwarg wraps LlamaAttention's) calls nothing by
    # name itself: read the function it wraps
    forward = inspect.unwrap(forward)
    code, scope = getattr(forward, "__code__", None), getattr(forward, "__globals__", {})
    found = []
    for name in (code.co_names if code else ()):
        fn = scope.get(name)
        # transformers' kernel-aware functions (apply_rotary_pos_emb) are module-level nn.Module
        # instances wrapping the function; a form binds to them as to the function itself
        if isinstance(fn, (types.FunctionType, torch.nn.Module)) and not _from_torch(fn):
            found.append((scope, name))
            continue
        method = getattr(type(module), name, None)
        if name != "forward" and isinstance(method, types.FunctionType) and not _from_torch(method):
            found.append((module, name))
    return found


def _from_torch(fn: Any) -> bool:
    return (getattr(fn, "__module__", "") or "").split(".")[0] == "torch"
