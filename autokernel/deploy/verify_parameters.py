"""The model's parameters and buffers, bit for bit, before and after the winners served it.

A kernel handed a model's weight (an nn.Parameter with requires_grad=True, under torch.no_grad or
not) can write into it: `weight * 0.99` stored back on every call leaves a weight at 0.6 of itself
after 50 calls, and the outputs drift so slowly that a tolerance may not see it at first. The judge
passes weights as a model does (harness/correctness/as_passed.py) and fails a kernel that writes
into any input; verify checks the served model itself: every parameter and buffer is fingerprinted
before the first patched forward and after the last (outside training, whose optimizer changes them
on purpose), and one that changed fails verify, named. The fingerprint is the judge's keyed
checksum over a tensor's raw bits (harness/timing/timed_outputs.py), computed where the tensor lives
(no copy of a model's weights to the host), keyed by a secret drawn here, so that a kernel cannot
change a weight and keep its fingerprint.
"""
from __future__ import annotations

import secrets
from typing import Any, Callable


def fingerprint(model: Any) -> Callable[[], dict[str, str]]:
    """A function that fingerprints `model`'s parameters and buffers now; called once here, the
    first fingerprint is its `.before`."""
    import torch
    from harness.timing.timed_outputs import keyed_checksum
    key, tables = secrets.randbits(62), {}

    def now() -> dict[str, str]:
        with torch.no_grad():
            named = list(model.named_parameters()) + list(model.named_buffers())
            return {name: keyed_checksum(t.detach(), key, tables) for name, t in named}
    now.before = now()
    return now


def changed(now: Callable[[], dict[str, str]]) -> list[str]:
    """The parameters and buffers whose bits differ from the first fingerprint."""
    after = now()
    return sorted(name for name in set(now.before) | set(after) if now.before.get(name) != after.get(name))


def failure(names: list[str]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return (f"the model's parameters changed while the winners served it: {shown} (a served kernel wrote into "
            "a weight or buffer it was passed)")
