"""A winner that reaches what the audit hook refuses fails the call loudly, never falls back.

Where winners run outside the judge (verify's child, `export --selftest`, and the exported package
in the user's process), an audit hook (harness/isolation/audit_hook.py; the package carries a copy) refuses
what a kernel never needs: processes, sockets, unpickling, new Python code, frame walks, imports
outside the kernel allow-list, writes outside the compiler caches and the temporary folder. The
refusal raises inside the winner's code, which may swallow it, and the stand-ins turn a kernel's
error into a quiet fallback to PyTorch. So the hook also reports each refusal here, and every
winner's call is wrapped: a call during which a refusal was reported raises KernelRefused, a
BaseException (as KeyboardInterrupt is), which no stand-in's `except Exception` turns into a
fallback. Cost per call: two reads of a list's length; the hook's own cost is per audit event.
Where the judge's observer is installed (`observe_with`), every call also runs under it, and what
it reports (PyTorch compute inside kernel_fn) fails the call the same way.
"""
from __future__ import annotations

import functools
import inspect
from typing import Callable

REFUSALS: list[str] = []  # every refusal the hook reported in this process, in order
# the observer every served call runs through, once installed (harness/correctness/served.py: the
# judge's launch monitor and op recorder, whose findings are reported here like the hook's)
OBSERVER: list[Callable] = []


def observe_with(observer: Callable) -> None:
    """Run every served kernel_fn through `observer(kernel_fn, args, kwargs)` from now on."""
    OBSERVER[:] = [observer]


class KernelRefused(BaseException):
    """A served winner reached an event the audit hook refuses: the call is not served at all."""


def report(text: str) -> None:
    """The hook's report: kept, so that the call it happened in fails even if the winner caught it."""
    REFUSALS.append(text)


def check(target: str, seen: int, cause: BaseException | None = None) -> None:
    """Raise KernelRefused when the hook reported a refusal since `seen` (len(REFUSALS) before the call)."""
    if len(REFUSALS) > seen:
        raise KernelRefused(f"{target}: {REFUSALS[-1]}") from cause


def guarded(kernel_fn: Callable, target: str) -> Callable:
    """kernel_fn, raising KernelRefused after any call during which the hook refused something.
    A class (a KernelBench ModelNew) is left as it is: modules.py checks around its forwards."""
    if inspect.isclass(kernel_fn) or getattr(kernel_fn, "guarded_target", None):
        return kernel_fn

    @functools.wraps(kernel_fn)
    def call(*args, **kwargs):
        seen = len(REFUSALS)
        try:
            out = OBSERVER[0](kernel_fn, args, kwargs) if OBSERVER else kernel_fn(*args, **kwargs)
        except Exception as e:
            check(target, seen, e)
            raise
        check(target, seen)
        return out

    call.guarded_target = target
    return call
