"""A call a kernel could serve (`Request`), and the small tests every form's rule uses: calls.py
(single operators' calls and forms) and chain_forms.py (chains held by a module) both build them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

EPS_NAMES = ("eps", "variance_epsilon", "epsilon")  # where a norm module keeps its eps


@dataclass
class Request:
    """One call a kernel could serve: its kernel_fn arguments and how to give the answer back."""

    kernel_type: str
    args: tuple  # as the call has them; `prepare` makes them the kernel's (e.g. 3-D x to 2-D)
    kwargs: dict = field(default_factory=dict)
    prepare: Optional[Callable[[tuple], tuple]] = None
    finish: Callable[[torch.Tensor], Any] = lambda out: out
    blocker: str = ""  # why a matching winner still may not serve it (a bias, a mask...)
    late_check: Optional[Callable[[], str]] = None  # a blocker that costs a sync: only when matched
    causal: Optional[bool] = None
    op: str = ""  # the name it is counted under, when not the torch callable's (F.linear+bias)

    def kernel_args(self) -> tuple:
        return self.prepare(self.args) if self.prepare else self.args


def first(outs: list) -> Any:
    return outs[0]


def is_float(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def plain(values: list) -> bool:
    """Extra arguments a form may carry and still be bound: flags and small ints (HF's
    unsqueeze_dim), never tensors, whose values could change what the form computes."""
    return all(v is None or isinstance(v, (bool, int)) for v in values)
