"""Module winners: a judged ModelNew serves the calls of the module instances it was made from.

A module target's winner is a KernelBench ModelNew for one module of the model. At patch time each
recorded instance's forward is replaced by a stand-in holding its own ModelNew, built with no
arguments and given the instance's parameters and buffers where names and shapes match (exactly as
the judge gave it Model's). The stand-in serves a call only when it looks like the call the problem
was made from (the same arguments: each tensor's shape and dtype, each constant's value) and is
safe (no autograd, one device, one floating dtype); anything else, or a ModelNew that raises, runs
the instance's own forward, and is counted.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .refusals import REFUSALS, check as check_refusals
from .calls import unsafe
from .sites import Site

KERNEL_TYPE = "module"


class ModuleSite(Site):
    """One module instance's forward, served by a ModelNew when the call matches the problem's."""

    def __init__(self, router: Any, winner: Any, module: torch.nn.Module, replacement: torch.nn.Module):
        super().__init__(router, f"{type(module).__name__}.forward", module.forward)
        self.winner, self.replacement = winner, replacement
        self.call = winner.kwargs.get("call") or {"args": [], "kwargs": {}}

    def stand_in(self, *args: Any, **kwargs: Any) -> Any:
        target = self.winner.target
        tensors, why = self.tensors(args, kwargs)
        why = why or unsafe(tuple(tensors))
        if why:
            self.fell(why, target)
            return self.original(*args, **kwargs)
        self.router.quiet += 1
        seen = len(REFUSALS)
        try:
            with torch.no_grad():
                out = self.replacement(*tensors)
        except Exception as e:  # the model still gets its answer; verify names the winner
            check_refusals(target, seen, e)  # ... unless the audit hook refused what it did: loudly
            self.router._error(self, target, self.op, e)
            return self.original(*args, **kwargs)
        finally:
            self.router.quiet -= 1
        check_refusals(target, seen)
        self.served[(target, self.op)] = self.served.get((target, self.op), 0) + 1
        return out

    def tensors(self, args: tuple, kwargs: dict) -> tuple[list, str]:
        """The call's tensors in the problem's order, or why the call is not the problem's."""
        want_args, want_kwargs = self.call.get("args", []), self.call.get("kwargs", {})
        if len(args) != len(want_args) or set(kwargs) != set(want_kwargs):
            return [], "another call signature than the problem's"
        tensors = []
        for value, want in list(zip(args, want_args)) + [(kwargs[k], want_kwargs[k]) for k in sorted(want_kwargs)]:
            spec = want.get("tensor")
            if spec is None:
                if isinstance(value, torch.Tensor) or _plain(value) != want.get("const"):
                    return [], "another constant argument than the problem's"
                continue
            if not isinstance(value, torch.Tensor):
                return [], "a non-tensor where the problem has a tensor"
            if list(value.shape) != spec["shape"] or str(value.dtype).replace("torch.", "") != spec["dtype"]:
                return [], f"shape {list(value.shape)} {value.dtype}, not the problem's {spec['shape']} {spec['dtype']}"
            tensors.append(value)
        return tensors, ""


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def copy_matching_state(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    """src's parameters and buffers into dst where names and shapes match (what the judge did)."""
    theirs = src.state_dict()
    with torch.no_grad():
        for name, t in dst.state_dict().items():
            s = theirs.get(name)
            if s is not None and tuple(s.shape) == tuple(t.shape):
                t.copy_(s)


def bind_module(router: Any, named: dict, winner: Any, set_attr: Callable, undo: list) -> None:
    """Replace the forward of every instance the module target recorded."""
    for name in winner.kwargs.get("modules") or [m["name"] for m in winner.modules]:
        module: Optional[torch.nn.Module] = named.get(name)
        if module is None:
            continue
        replacement = winner.kernel_fn()  # ModelNew takes no arguments: the problem's get_init_inputs()
        # the judge built ModelNew in the model's dtype on the device, then copied Model's state in
        where = next(iter(module.parameters()), None)
        where = where if where is not None else next(iter(module.buffers()), None)
        replacement = replacement.to(device=where.device if where is not None else None,
                                     dtype=getattr(torch, winner.dtype, None) if winner.dtype else None)
        copy_matching_state(module, replacement)
        replacement.eval()
        site = ModuleSite(router, winner, module, replacement)
        router.tally.sites.append(site)
        set_attr(module, "forward", site.stand_in, undo)
