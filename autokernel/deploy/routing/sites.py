"""The callables that stand in for a model's own while it is patched, each behind a cheap guard.

- `LinearSite`: an nn.Linear's forward (F.linear with its own weight and bias).
- `OpSite`: a torch function (F.scaled_dot_product_attention, F.softmax, x @ w...), live only
  while a recorded module runs (`scoped` forwards count them), so calls elsewhere go straight to
  the original.
- `FormSite`: a recorded module's forward or a function its forward calls by name (RMSNorm,
  apply_rotary_pos_emb): bound on its first call, when a rule reproduces the original's output.
- `Watch`: a recorded module that calls no function a form could be: each of its calls is counted
  as a fallback (the form is written inline).

Each site's `stand_in()` is a plain function (a closure, the cheapest thing Python calls). The path
of a call no winner can take is a key (the main input's shape, and dtype where it can vary) looked
up in a dict of calls already refused, and an int added to a counter: no parsing, no strings.
Reasons that need formatting are kept as tuples and worded when the tally is read. While Dynamo
traces, nothing is counted (a count would be a side effect that recompiles the graph) and the
winners are called as custom ops, which count the compiled graph's calls themselves (router.py).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from .calls import FORMS, reference
from .outputs import same_result

NOTHING = object()
# A form's binding check compares two PyTorch computations: a wrong binding is off by O(1), so a
# looser budget only spares models that round intermediates in low precision.
BINDING_SLACK = 10.0
LINEAR = F.linear  # the original, captured before anything is patched
_PLAIN = (int, float, bool, str, type(None), torch.dtype)


def compiling() -> bool:
    """True while Dynamo traces (a constant in its graph: no guard, no recompile); a flag read, not
    torch.compiler.is_compiling()'s two calls, because it is on every patched call's path."""
    return torch.compiler._is_compiling_flag


# torch.compiler.assume_constant_result(compiling), without the import of torch._dynamo that it does
# first (a second of CPU in every process that patches a model, most of which never compile): the
# mark is the attribute that decorator sets and Dynamo reads when it traces a call
# (tests/deploy/test_serving.py holds the two to each other).
compiling._dynamo_marked_constant = True


def signature(args: tuple, kwargs: dict) -> Optional[tuple]:
    """What decides whether a winner matches a call, as a dict key; None when it cannot be one."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((a.shape, a.dtype, a.device))
        elif isinstance(a, _PLAIN):
            key.append(a)
        else:
            return None
    for name, a in kwargs.items():
        if isinstance(a, torch.Tensor):
            key.append((name, a.shape, a.dtype, a.device))
        elif isinstance(a, _PLAIN):
            key.append((name, a))
        else:
            return None
    return tuple(key)


class Site:
    """A stand-in's state: served calls per (target, op), fallbacks per (reason, target, op), and
    the calls already refused: key -> [count, the fallbacks each such call counts, dtype or None].
    `stand_in()` is the plain function that replaces the original; its refusal path is a dict
    lookup and `entry[0] += 1`."""

    def __init__(self, router: Any, op: str, original: Callable):
        self.router, self.op, self.original = router, op, original
        self.served: dict[tuple, int] = {}
        self.falls: dict[tuple, int] = {}
        self.refused: dict[Any, list] = {}

    def fell(self, reason: Any, target: Optional[str] = None, op: Optional[str] = None) -> None:
        key = (reason, target, op or self.op)
        self.falls[key] = self.falls.get(key, 0) + 1

    def refuse(self, falls: tuple) -> None:
        for key in falls:
            self.falls[key] = self.falls.get(key, 0) + 1

    def remember(self, key: Any, falls: tuple, dtype: Any = None) -> None:
        old = self.refused.get(key)
        if old is not None:  # another dtype at this shape: keep what the old entry counted
            for fall in old[1]:
                self.falls[fall] = self.falls.get(fall, 0) + old[0]
        self.refused[key] = [0, falls, dtype]

    def fall_counts(self) -> dict[tuple, int]:
        counts = dict(self.falls)
        for n, falls, _ in self.refused.values():
            for fall in falls:
                counts[fall] = counts.get(fall, 0) + n
        return counts

    def route(self, key: Any, requests: list, assemble: Callable, dtype: Any = None) -> Any:
        """`requests` through the router; a refusal that only shapes and dtypes decided is remembered."""
        counting = not compiling()
        out, refused = self.router.route(self, requests, assemble, counting=counting)
        if refused is not None and key is not None and counting:
            self.remember(key, refused, dtype)
        return out


class OpSite(Site):
    """A torch function a winner serves, inside the recorded modules only (`scope`)."""

    def __init__(self, router: Any, op: str, original: Callable, parse: Callable, scope: "Scope"):
        super().__init__(router, op, original)
        self.parse, self.scope = parse, scope

    def stand_in(self) -> Callable:
        scope, router, original, call = self.scope, self.router, self.original, self.call

        def op(*args, **kwargs):  # a plain function: as a torch.Tensor attribute it binds self
            if not scope.depth or router.quiet:
                return original(*args, **kwargs)
            return call(args, kwargs)
        op.__name__ = getattr(original, "__name__", self.op)
        return op

    def call(self, args: tuple, kwargs: dict) -> Any:
        key = None if compiling() else signature(args, kwargs)
        hit = self.refused.get(key) if key is not None else None
        if hit is not None:
            hit[0] += 1
            return self.original(*args, **kwargs)
        try:
            request = self.parse(args, kwargs)
        except Exception:  # a call shape no parser foresaw: PyTorch decides what it means
            request = None
        if request is None:
            if key is not None:
                self.remember(key, ())
            return self.original(*args, **kwargs)
        out = self.route(key, [request], _first)
        return self.original(*args, **kwargs) if out is NOTHING else out


class LinearSite(Site):
    """An nn.Linear's forward. Its weight's dtype and device are the model's at patch time, so a
    call is known by its input's shape alone: once one shape is refused, or served, calls of that
    shape take the short path (a refusal is cached only when the input has the weight's dtype and
    device; a served call re-checks dtype, device and autograd every time)."""

    def __init__(self, router: Any, module: torch.nn.Module, parse: Callable):
        super().__init__(router, "F.linear", LINEAR)
        self.parse, self.params = parse, module._parameters
        self.accepted: dict[Any, Any] = {}  # input shape -> the winner that served it

    def stand_in(self) -> Callable:
        params, refused, accepted, router, call, serve = (self.params, self.refused, self.accepted, self.router,
                                                          self.call, self.serve)

        def forward(input):
            if compiling():  # first: a dict lookup by a symbolic shape would fix the shape in the graph
                return call(input)
            shape = input.shape
            hit = refused.get(shape)
            if hit is not None and not router.quiet:
                hit[0] += 1
                return LINEAR(input, params["weight"], params["bias"])
            winner = accepted.get(shape)
            if winner is not None and not router.quiet:
                return serve(input, winner)
            return call(input)
        return forward

    def call(self, x: torch.Tensor) -> Any:
        w, b = self.params["weight"], self.params["bias"]
        if self.router.quiet:
            return LINEAR(x, w, b)
        key = x.shape if x.dtype == w.dtype and x.device == w.device else None
        request = self.parse((x, w, b), {})
        if request is None:
            if key is not None:
                self.remember(key, ())
            return LINEAR(x, w, b)
        out = self.route(key, [request], _first)
        if out is NOTHING:
            return LINEAR(x, w, b)
        if key is not None and not compiling():
            self.accepted[key] = self.router.decide(request)[0]
        return out

    def serve(self, x: torch.Tensor, winner: Any) -> Any:
        """A call of a shape already served: the same kernel, after the checks a call can change."""
        w, b = self.params["weight"], self.params["bias"]
        if x.dtype is not w.dtype or x.device != w.device or (torch.is_grad_enabled() and (
                x.requires_grad or w.requires_grad or (b is not None and b.requires_grad))):
            return self.call(x)  # the full path decides, and counts why it falls back
        op = "F.linear" if b is None else "F.linear+bias"
        router = self.router
        router.quiet += 1
        try:
            out = winner.kernel_fn(x.reshape(-1, x.shape[-1]), w.t())
            if b is not None:
                from .bias import add_bias
                out = add_bias(out, b)
        except Exception as e:  # the model still gets its answer; verify names the kernel
            router._error(self, winner.target, op, e)
            return LINEAR(x, w, b)
        finally:
            router.quiet -= 1
        key = (winner.target, op)
        self.served[key] = self.served.get(key, 0) + 1
        return out.view(*x.shape[:-1], w.shape[0])


class Scope:
    """How many recorded modules are running now: an OpSite serves only inside one."""

    def __init__(self, depth: int = 0):
        self.depth = depth


def scoped(scope: Scope, original: Callable) -> Callable:
    """A recorded module's forward that marks its run for the OpSites of one kernel type."""
    def forward(*args, **kwargs):
        scope.depth += 1
        try:
            return original(*args, **kwargs)
        finally:
            scope.depth -= 1
    return forward


def _first(outs: list) -> Any:
    return outs[0]


class FormSite(Site):
    """A callable that may compute a form: bound on its first call, then served or passed through.
    A refused call is known by its first argument's shape and dtype (the form's main input)."""

    def __init__(self, router: Any, winner: Any, original: Callable, owner: Any, name: str,
                 uninstall: Callable[[], None]):
        super().__init__(router, name, original)
        self.winner, self.owner, self.kernel_type, self.uninstall = winner, owner, winner.kernel_type, uninstall
        self.seen = router.form_calls(winner.kernel_type)  # [calls], shared with the Watch
        self.rule: Optional[Callable] = None
        self.tried = False
        # the rules' `skip` tests (a causal LM's: no labels), asked before any binding or serving
        self.skips = [r.skip for r in FORMS[self.kernel_type] if getattr(r, "skip", None) is not None]

    def stand_in(self) -> Callable:
        refused, router, original, call, seen = self.refused, self.router, self.original, self.call, self.seen

        def form(*args, **kwargs):
            if compiling():  # first: a dict lookup by a symbolic shape would fix the shape in the graph
                return call(args, kwargs, args[0] if args else None)
            try:
                x = args[0]
                hit = refused.get(x.shape)
            except (IndexError, AttributeError):
                x = hit = None
            if hit is None or hit[2] is not x.dtype or router.quiet:
                return call(args, kwargs, x)
            hit[0] += 1
            seen[0] += 1
            return original(*args, **kwargs)
        return form

    def call(self, args: tuple, kwargs: dict, x: Any) -> Any:
        router = self.router
        if router.quiet:
            return self.original(*args, **kwargs)
        why = self._skip(args, kwargs) if self.skips else ""
        if why:  # a call the form leaves to the module (no labels: the caller reads the logits)
            if not compiling():
                self.fell(why, self.winner.target)
            return self.original(*args, **kwargs)
        if not self.tried:
            if compiling():  # binding compares values: it happens in eager, before compiling
                return self.original(*args, **kwargs)
            return self._bind(args, kwargs)
        if self.rule is None:  # a recorded module that is not the form autokernel can call
            self.fell(("unbound", self.op, self.kernel_type), self.winner.target)
            return self.original(*args, **kwargs)
        if not compiling():  # a count is a side effect that Dynamo would guard on: a recompile per call
            self.seen[0] += 1
        return self._serve(self._made(self.rule, args, kwargs), args, kwargs, x)

    def _made(self, rule: Callable, args: tuple, kwargs: dict) -> Any:
        """rule's Requests for this call. A rule marked `runs_model` computes the module's own
        calls (a decoder layer's attention, a causal LM's base model): they run as the model's, so
        the winners inside them serve and are counted (in a binding check they run quiet)."""
        if getattr(rule, "runs_model", False):
            return rule(self.owner, args, kwargs)
        self.router.quiet += 1
        try:
            return rule(self.owner, args, kwargs)
        finally:
            self.router.quiet -= 1

    def _skip(self, args: tuple, kwargs: dict) -> str:
        """Why a form's rule leaves this call to the module ('' when it does not): asked before
        binding too, so a call it never serves (an eval forward) neither binds nor unbinds it."""
        for skip in self.skips:
            why = skip(self.owner, args, kwargs)
            if why:
                return why
        return ""

    def _bind(self, args: tuple, kwargs: dict) -> Any:
        self.tried = True
        made, router = None, self.router
        router.quiet += 1
        try:
            original = self.original(*args, **kwargs)
            for rule in FORMS[self.kernel_type]:
                try:
                    made = rule(self.owner, args, kwargs)
                    if made is not None and reproduces(rule, reference(*made[:2]), original):
                        self.rule = rule
                        break
                except Exception:  # a rule that does not fit this callable's arguments
                    continue
        finally:
            router.quiet -= 1
        if self.rule is None:
            if self.owner is not None:
                self.fell(("unbound", self.op, self.kernel_type), self.winner.target)
            else:  # a function the module calls that is not the form: put the original back now
                self.uninstall()
            return original
        self.seen[0] += 1
        if getattr(self.rule, "runs_model", False):  # made again, its inner calls served and counted once
            return self._serve(self._made(self.rule, args, kwargs), args, kwargs, args[0] if args else None)
        return self._serve(made, args, kwargs, args[0] if args else None, original)

    def _serve(self, made: Any, args: tuple, kwargs: dict, x: Any, original: Any = NOTHING) -> Any:
        """Serve a bound call; `x` (its first argument) keys the refusal of calls like it."""
        if made is None:
            self.fell("arguments unlike those it was bound with", self.winner.target)
        else:
            tensor = isinstance(x, torch.Tensor)
            out = self.route(x.shape if tensor else None, *made[:2], dtype=x.dtype if tensor else None)
            if out is not NOTHING:
                return out
            if len(made) > 2 and original is NOTHING:  # the module's own ops on what the rule computed
                return made[2]()
        return self.original(*args, **kwargs) if original is NOTHING else original


def reproduces(rule: Callable, ours: Any, original: Any) -> bool:
    """Whether a rule's reading of a call gives the original's output. A rule that computes the
    module's own calls (`runs_model`) must also give back the same kind of object (a decoder layer
    that returns a tuple is not served as one returning a tensor); one with `compared` is held to
    the part of the output it names (a causal LM's loss: its logits are left out, docs say why)."""
    if getattr(rule, "runs_model", False) and type(ours) is not type(original):
        return False
    pick = getattr(rule, "compared", None)
    if pick is not None:
        ours, original = pick(ours), pick(original)
    return same_result(ours, original, BINDING_SLACK)


class Watch(Site):
    """A recorded module's forward: a call during which no form of its type ran is a fallback."""

    def __init__(self, router: Any, kernel_type: str, target: str, cls: str, original: Callable):
        super().__init__(router, f"{cls}.forward", original)
        self.target, self.seen = target, router.form_calls(kernel_type)
        self.reason = f"{kernel_type} written inline in {cls}.forward: no call autokernel can route"

    def stand_in(self) -> Callable:
        seen, original, router = self.seen, self.original, self.router

        def forward(*args, **kwargs):
            if compiling():  # nothing is counted while Dynamo traces: reading the count would guard on it
                return original(*args, **kwargs)
            before = seen[0]
            out = original(*args, **kwargs)
            if before == seen[0] and not router.quiet:
                self.fell(self.reason, self.target)
            return out
        return forward
